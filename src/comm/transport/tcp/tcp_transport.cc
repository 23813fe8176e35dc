#include "tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "wire.h"

namespace cohort::comm {

namespace {

class TcpLink final : public Link {
 public:
  TcpLink(Socket sock, PeerDesc peer, int buffer) : sock_(std::move(sock)), peer_(std::move(peer)) {
    set_nonblocking(sock_.fd(), true);
    set_nodelay(sock_.fd());
    set_buffers(sock_.fd(), buffer);
    staging_.resize(256 << 10);
  }

  size_t send_some(const void* data, size_t n) override {
    if (n == 0) return 0;
    ssize_t w = ::send(sock_.fd(), data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) return static_cast<size_t>(w);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    fail(errno);
  }

  size_t recv_into(void* dst, size_t n) override {
    size_t done = 0;
    if (st_len_ > 0) {  // bytes staged by an earlier peek_span go first
      done = std::min(n, st_len_);
      std::memcpy(dst, staging_.data() + st_off_, done);
      release(done);
      if (done == n) return done;
    }
    ssize_t r = ::recv(sock_.fd(), static_cast<uint8_t*>(dst) + done, n - done, MSG_DONTWAIT);
    if (r > 0) return done + static_cast<size_t>(r);
    if (r == 0) closed();
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return done;
    fail(errno);
  }

  size_t peek(void* dst, size_t n) override {
    if (st_len_ > 0) {
      size_t k = std::min(n, st_len_);
      std::memcpy(dst, staging_.data() + st_off_, k);
      return k;
    }
    ssize_t r = ::recv(sock_.fd(), dst, n, MSG_DONTWAIT | MSG_PEEK);
    return r > 0 ? static_cast<size_t>(r) : 0;
  }

  void check_peer() override {
    if (st_len_ > 0) return;
    char c;
    ssize_t r = ::recv(sock_.fd(), &c, 1, MSG_DONTWAIT | MSG_PEEK);
    if (r == 0) closed();
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail(errno);
  }

  void abort(const std::string&) override { ::shutdown(sock_.fd(), SHUT_RDWR); }
  int wait_fd() const override { return sock_.fd(); }
  const char* kind() const override { return "tcp"; }

 protected:
  size_t peek_span(size_t n, const uint8_t** p) override {
    if (st_len_ == 0) {
      ssize_t r = ::recv(sock_.fd(), staging_.data(), std::min(n, staging_.size()), MSG_DONTWAIT);
      if (r == 0) closed();
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        fail(errno);
      }
      st_off_ = 0;
      st_len_ = static_cast<size_t>(r);
    }
    *p = staging_.data() + st_off_;
    return std::min(n, st_len_);
  }

  void release(size_t n) override {
    st_off_ += n;
    st_len_ -= n;
  }

 private:
  [[noreturn]] void closed() {
    COHORT_THROW_AS(CommError, peer_.name()
                                   << " closed its connection (the process died or aborted)");
  }
  [[noreturn]] void fail(int e) {
    COHORT_THROW_AS(CommError, "connection to " << peer_.name() << " failed: " << errno_string(e));
  }

  Socket sock_;
  PeerDesc peer_;
  std::vector<uint8_t> staging_;
  size_t st_off_ = 0;
  size_t st_len_ = 0;
};

}  // namespace

TcpListener::TcpListener(const std::string& bind_host) : host_(bind_host) {
  sock_ = listen_tcp(bind_host, 0);
  port_ = local_port(sock_);
}

std::map<int, std::vector<std::unique_ptr<Link>>> connect_tcp_peers(
    Store& store, TcpListener& listener, const TcpOptions& opt, const PeerDesc& me,
    const std::vector<PeerDesc>& peers) {
  std::map<int, std::vector<Socket>> socks;
  int expect_accepts = 0;
  for (const auto& p : peers) {
    socks[p.rank].resize(static_cast<size_t>(opt.streams));
    if (p.rank < me.rank) {
      Endpoint ep = parse_endpoint(store.get("tcp/" + std::to_string(p.rank)), 0);
      for (int s = 0; s < opt.streams; ++s) {
        Socket sock = connect_tcp(ep, opt.deadline, p.name());
        std::string hello = wire::encode(wire::Hello{
            opt.token, opt.comm_id, static_cast<uint32_t>(me.rank), static_cast<uint32_t>(s)});
        sock.write_all(hello.data(), hello.size(), opt.deadline, p.name());
        socks[p.rank][static_cast<size_t>(s)] = std::move(sock);
      }
    } else {
      expect_accepts += opt.streams;
    }
  }
  while (expect_accepts > 0) {
    Socket sock = accept_tcp(listener.socket(), opt.deadline);
    // A connection that is not one of this job's ranks is dropped; keep waiting for ours.
    try {
      uint32_t len = 0;
      auto hello_deadline = std::min(opt.deadline, Clock::now() + std::chrono::seconds(10));
      sock.read_all(&len, 4, hello_deadline, "an incoming connection");
      if (len > wire::kMaxHello)
        COHORT_THROW_AS(wire::WireError, "oversized hello (" << len << ")");
      std::string body(len, '\0');
      sock.read_all(body.data(), len, hello_deadline, "an incoming connection");
      wire::Hello h = wire::parse_hello(reinterpret_cast<const uint8_t*>(body.data()), len);
      auto it = socks.find(static_cast<int>(h.rank));
      if (h.token != opt.token || h.comm_id != opt.comm_id) {
        COHORT_THROW_AS(wire::WireError, "wrong job token or communicator");
      }
      if (it == socks.end() || h.rank <= static_cast<uint32_t>(me.rank) ||
          h.stream >= static_cast<uint32_t>(opt.streams) || it->second[h.stream].valid()) {
        COHORT_THROW_AS(wire::WireError,
                        "unexpected hello from rank " << h.rank << " stream " << h.stream);
      }
      it->second[h.stream] = std::move(sock);
      --expect_accepts;
    } catch (const wire::WireError& e) {
      COHORT_LOG(warn, "rank " << me.rank << ": dropped an incoming connection: " << e.message());
    } catch (const CommError& e) {
      if (Clock::now() >= opt.deadline) throw;
      COHORT_LOG(warn, "rank " << me.rank << ": dropped an incoming connection: " << e.message());
    }
  }
  std::map<int, std::vector<std::unique_ptr<Link>>> out;
  for (const auto& p : peers) {
    for (auto& s : socks[p.rank]) {
      out[p.rank].push_back(std::make_unique<TcpLink>(std::move(s), p, opt.socket_buffer));
    }
  }
  return out;
}

}  // namespace cohort::comm
