#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "cohort/comm/store.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "wire.h"

namespace cohort::comm {

namespace {

struct Client {
  Socket sock;
  std::string in;
  std::string out;
  bool authed = false;
  bool blocked = false;  // has a get/wait pending
  wire::StoreRequest pending;
  Clock::time_point deadline;
};

class Table {
 public:
  // Answers a request, or returns false if it must wait for keys.
  bool answer(const wire::StoreRequest& r, wire::StoreReply* out) {
    using wire::StoreCmd;
    switch (r.cmd) {
      case StoreCmd::set:
        kv_[r.key] = r.value;
        return true;
      case StoreCmd::get: {
        auto it = kv_.find(r.key);
        if (it == kv_.end()) return false;
        out->value = it->second;
        return true;
      }
      case StoreCmd::add: {
        int64_t v = 0;
        auto it = kv_.find(r.key);
        if (it != kv_.end()) v = std::strtoll(it->second.c_str(), nullptr, 10);
        v += r.delta;
        kv_[r.key] = std::to_string(v);
        out->number = v;
        return true;
      }
      case StoreCmd::compare_set: {
        auto it = kv_.find(r.key);
        if ((it == kv_.end() && r.expected.empty()) ||
            (it != kv_.end() && it->second == r.expected)) {
          kv_[r.key] = r.value;
          out->value = r.value;
        } else {
          out->value = it == kv_.end() ? std::string() : it->second;
        }
        return true;
      }
      case StoreCmd::wait:
        for (const auto& k : r.keys) {
          if (kv_.find(k) == kv_.end()) return false;
        }
        return true;
      case StoreCmd::erase:
        kv_.erase(r.key);
        return true;
      case StoreCmd::num_keys:
        out->number = static_cast<int64_t>(kv_.size());
        return true;
      case StoreCmd::hello:
        return true;
    }
    return true;
  }

 private:
  std::map<std::string, std::string> kv_;
};

}  // namespace

StoreServer::StoreServer(const std::string& host, uint16_t port, std::string token)
    : token_(std::move(token)) {
  listener_ = listen_tcp(host, port);
  port_ = local_port(listener_);
  if (::pipe2(wake_, O_CLOEXEC) != 0) COHORT_THROW("pipe: " << errno_string(errno));
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  char c = 'q';
  if (::write(wake_[1], &c, 1) < 0) {
  }
  if (thread_.joinable()) thread_.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void StoreServer::serve() {
  std::vector<std::unique_ptr<Client>> clients;
  Table table;
  set_nonblocking(listener_.fd(), true);
  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    int timeout_ms = -1;
    auto now = Clock::now();
    for (auto& c : clients) {
      if (!c->blocked && c->in.size() >= 4) timeout_ms = 0;  // frames left after a wait ended
      short ev = POLLIN;
      if (!c->out.empty()) ev |= POLLOUT;
      fds.push_back({c->sock.fd(), ev, 0});
      if (c->blocked && timeout_ms != 0) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(c->deadline - now).count();
        int m = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms + 1, 60000)));
        timeout_ms = timeout_ms < 0 ? m : std::min(timeout_ms, m);
      }
    }
    ::poll(fds.data(), fds.size(), timeout_ms);
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        auto c = std::make_unique<Client>();
        c->sock = Socket(fd);
        set_nodelay(fd);
        clients.push_back(std::move(c));
      }
    }
    std::vector<bool> drop(clients.size(), false);
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = *clients[i];
      short rev = fds[i + 2].revents;
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        while (true) {
          ssize_t r = ::recv(c.sock.fd(), buf, sizeof(buf), 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            if (c.in.size() > wire::kMaxFrame + 4) break;
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EINTR)) drop[i] = true;
          break;
        }
      }
      // Parse every complete frame; a client with a pending wait is served in order.
      while (!drop[i] && !c.blocked && c.in.size() >= 4) {
        uint32_t len;
        std::memcpy(&len, c.in.data(), 4);
        if (len > wire::kMaxFrame) {
          COHORT_LOG(warn, "store: dropping a client that sent a " << len << "-byte frame");
          drop[i] = true;
          break;
        }
        if (c.in.size() < 4 + static_cast<size_t>(len)) break;
        wire::StoreRequest req;
        try {
          req = wire::parse_store_request(reinterpret_cast<const uint8_t*>(c.in.data()) + 4, len);
        } catch (const wire::WireError& e) {
          COHORT_LOG(warn, "store: dropping a client: " << e.message());
          drop[i] = true;
          break;
        }
        c.in.erase(0, 4 + static_cast<size_t>(len));
        if (!c.authed) {
          if (req.cmd != wire::StoreCmd::hello || req.key != token_) {
            COHORT_LOG(warn, "store: dropping a connection without this job's token");
            drop[i] = true;
            break;
          }
          c.authed = true;
          c.out += wire::encode(wire::StoreReply{});
          continue;
        }
        wire::StoreReply rep;
        if (table.answer(req, &rep)) {
          c.out += wire::encode(rep);
        } else {
          c.blocked = true;
          c.pending = std::move(req);
          c.deadline = Clock::now() + std::chrono::milliseconds(c.pending.timeout_ms);
        }
      }
    }
    // Wake waiters whose keys appeared, time out the rest.
    now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = *clients[i];
      if (!c.blocked || drop[i]) continue;
      wire::StoreReply rep;
      if (table.answer(c.pending, &rep)) {
        c.blocked = false;
        c.out += wire::encode(rep);
      } else if (now >= c.deadline) {
        c.blocked = false;
        rep.status = wire::StoreStatus::timeout;
        c.out += wire::encode(rep);
      }
    }
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = *clients[i];
      while (!drop[i] && !c.out.empty()) {
        ssize_t w = ::send(c.sock.fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (w > 0) {
          c.out.erase(0, static_cast<size_t>(w));
        } else {
          if (errno != EAGAIN && errno != EINTR) drop[i] = true;
          break;
        }
      }
    }
    for (size_t i = clients.size(); i-- > 0;) {
      if (drop[i]) clients.erase(clients.begin() + static_cast<long>(i));
    }
  }
}

namespace {

// The client side of StoreServer: one connection, one request at a time.
class TcpStoreClient : public KeyValueService {
 public:
  TcpStoreClient(const Endpoint& server, const std::string& token, Millis timeout)
      : server_(server) {
    sock_ = connect_tcp(server, Clock::now() + timeout, "the rendezvous store");
    set_nodelay(sock_.fd());
    wire::StoreRequest hello;
    hello.cmd = wire::StoreCmd::hello;
    hello.key = token;
    bool to = false;
    try {
      call(wire::encode(hello), Millis(0), timeout, &to, nullptr);
    } catch (const CommError& e) {
      COHORT_THROW_AS(CommError, "the rendezvous store at "
                                     << server.str()
                                     << " refused this process (wrong job token? start ranks with "
                                        "cohort launch or set COHORT_JOB_TOKEN): "
                                     << e.message());
    }
  }

  void set(const std::string& key, const std::string& value, Millis timeout) override {
    wire::StoreRequest r;
    r.cmd = wire::StoreCmd::set;
    r.key = key;
    r.value = value;
    bool to;
    call(wire::encode(r), Millis(0), timeout, &to, nullptr);
  }

  std::optional<std::string> get_for(const std::string& key, Millis wait, Millis timeout) override {
    wire::StoreRequest r;
    r.cmd = wire::StoreCmd::get;
    r.key = key;
    r.timeout_ms = static_cast<uint32_t>(wait.count());
    bool to = false;
    std::string v = call(wire::encode(r), wait, timeout, &to, nullptr);
    if (to) return std::nullopt;
    return v;
  }

  int64_t add(const std::string& key, int64_t delta, Millis timeout) override {
    wire::StoreRequest r;
    r.cmd = wire::StoreCmd::add;
    r.key = key;
    r.delta = delta;
    bool to;
    int64_t n = 0;
    call(wire::encode(r), Millis(0), timeout, &to, &n);
    return n;
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired, Millis timeout) override {
    wire::StoreRequest r;
    r.cmd = wire::StoreCmd::compare_set;
    r.key = key;
    r.expected = expected;
    r.value = desired;
    bool to;
    return call(wire::encode(r), Millis(0), timeout, &to, nullptr);
  }

  bool wait(const std::vector<std::string>& keys, Millis wait) override {
    wire::StoreRequest r;
    r.cmd = wire::StoreCmd::wait;
    r.keys = keys;
    r.timeout_ms = static_cast<uint32_t>(wait.count());
    bool to = false;
    call(wire::encode(r), wait, wait, &to, nullptr);  // the reply may come as late as wait
    return !to;
  }

  void erase(const std::string& key, Millis timeout) override {
    wire::StoreRequest r;
    r.cmd = wire::StoreCmd::erase;
    r.key = key;
    bool to;
    call(wire::encode(r), Millis(0), timeout, &to, nullptr);
  }

  std::string host() const override { return server_.host; }

 private:
  // Sends one request and reads its reply, within wait + timeout.
  std::string call(const std::string& frame, Millis wait, Millis timeout, bool* timed_out,
                   int64_t* number) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string peer = "the rendezvous store at " + server_.str();
    auto deadline = Clock::now() + wait + timeout;
    if (!sock_.valid()) COHORT_THROW_AS(CommError, peer << " connection is closed");
    try {
      sock_.write_all(frame.data(), frame.size(), deadline, peer);
      uint32_t len = 0;
      sock_.read_all(&len, 4, deadline, peer);
      if (len > wire::kMaxFrame) COHORT_THROW_AS(CommError, peer << " sent an oversized reply");
      std::string body(len, '\0');
      sock_.read_all(body.data(), len, deadline, peer);
      auto rep = wire::parse_store_reply(reinterpret_cast<const uint8_t*>(body.data()), len);
      *timed_out = rep.status == wire::StoreStatus::timeout;
      if (number) *number = rep.number;
      return rep.value;
    } catch (const TimeoutError&) {
      sock_.close();  // the stream is out of step now
      throw;
    } catch (const wire::WireError& e) {
      sock_.close();
      COHORT_THROW_AS(CommError, peer << " sent a malformed reply: " << e.message());
    }
  }

  Endpoint server_;
  std::mutex mu_;
  Socket sock_;
};

}  // namespace

Store::Store(const Endpoint& server, const std::string& token, Millis timeout)
    : service_(std::make_shared<TcpStoreClient>(server, token, timeout)), timeout_(timeout) {}

Store::Store(std::shared_ptr<KeyValueService> service, Millis timeout)
    : service_(std::move(service)), timeout_(timeout) {}

Store Store::prefixed(const std::string& prefix) const {
  Store s;
  s.service_ = service_;
  s.prefix_ = prefix_ + prefix;
  s.timeout_ = timeout_;
  return s;
}

Store Store::with_timeout(Millis timeout) const {
  Store s = prefixed("");
  s.timeout_ = timeout;
  return s;
}

void Store::set(const std::string& key, const std::string& value) {
  service_->set(prefix_ + key, value, timeout_);
}

std::optional<std::string> Store::get_for(const std::string& key, Millis wait) {
  return service_->get_for(prefix_ + key, wait, timeout_);
}

std::string Store::get(const std::string& key) {
  auto v = get_for(key, timeout_);
  if (!v) {
    COHORT_THROW_AS(TimeoutError, "store key '" << prefix_ + key << "' did not appear within "
                                                << timeout_.count() / 1000.0 << " s");
  }
  return *v;
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return service_->add(prefix_ + key, delta, timeout_);
}

std::string Store::compare_set(const std::string& key, const std::string& expected,
                               const std::string& desired) {
  return service_->compare_set(prefix_ + key, expected, desired, timeout_);
}

void Store::wait(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  if (!service_->wait(full, timeout_)) {
    COHORT_THROW_AS(TimeoutError, "waited " << timeout_.count() / 1000.0 << " s for " << keys.size()
                                            << " store keys (first: '" << prefix_ + keys.at(0)
                                            << "')");
  }
}

void Store::erase(const std::string& key) {
  service_->erase(prefix_ + key, timeout_);
}

}  // namespace cohort::comm
