#include "native_comm.h"

#include <immintrin.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "cohort/comm/reduce.h"
#include "cohort/comm/wire.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace cohort::comm {

// ---------------------------------------------------------------- Work
class WorkState {
 public:
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::string algo;
};

void Work::wait() {
  if (!s_) return;
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  if (s_->error) std::rethrow_exception(s_->error);
}

bool Work::test() {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->done;
}

const std::string& Work::algorithm() const {
  static const std::string none;
  return s_ ? s_->algo : none;
}

namespace detail {

namespace {

uint64_t hash64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string local_host_id() {
  if (auto h = env::get("COHORT_HOST_ID")) return *h;
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

Settings Settings::from_env() {
  Settings s;
  s.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(env::double_or("COHORT_TIMEOUT", 300.0) * 1000.0));
  std::string tr = env::get_or("COHORT_TRANSPORT", "auto");
  if (tr != "auto" && tr != "tcp" && tr != "shm") {
    COHORT_THROW("COHORT_TRANSPORT='" << tr << "': expected auto, shm or tcp");
  }
  s.force_tcp = tr == "tcp";
  s.tcp_streams = static_cast<int>(env::int_or("COHORT_TCP_STREAMS", 2));
  if (s.tcp_streams < 1 || s.tcp_streams > 16) {
    COHORT_THROW("COHORT_TCP_STREAMS=" << s.tcp_streams << ": expected 1..16");
  }
  s.shm_ring = env::parse_bytes(env::get_or("COHORT_SHM_RING_BYTES", "4M"));
  s.algo = parse_algo(env::get_or("COHORT_ALGO", "auto"));
  return s;
}

std::string CollDesc::str() const {
  std::string s = std::string(collective_name(coll)) + "(count=" + std::to_string(count) + ", " +
                  dtype_name(dtype);
  if (coll == Coll::allreduce || coll == Coll::reduce || coll == Coll::reduce_scatter) {
    s += std::string(", ") + redop_name(op);
  }
  if (coll == Coll::broadcast || coll == Coll::reduce || coll == Coll::gather ||
      coll == Coll::scatter) {
    s += ", root=" + std::to_string(root);
  }
  return s + ", call #" + std::to_string(seq) + ")";
}

// ---------------------------------------------------------------- Engine helpers
void Engine::reduce_into(void* dst, const void* a, const void* b, size_t count) const {
  comm::reduce(dst, a, b, count, desc().dtype, desc().op);
}

Group Engine::natural() const {
  Group g;
  for (int r = 0; r < size(); ++r) g.ranks.push_back(r);
  g.me = rank();
  return g;
}

Group Engine::world() const {
  const auto& h = topology().host_of_rank;
  Group g = natural();
  std::stable_sort(g.ranks.begin(), g.ranks.end(), [&](int a, int b) {
    return h[static_cast<size_t>(a)] < h[static_cast<size_t>(b)];
  });
  g.me = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank()) - g.ranks.begin());
  return g;
}

Group Engine::local() const {
  const auto& h = topology().host_of_rank;
  Group g;
  for (int r = 0; r < size(); ++r) {
    if (h[static_cast<size_t>(r)] == h[static_cast<size_t>(rank())]) {
      if (r == rank()) g.me = g.size();
      g.ranks.push_back(r);
    }
  }
  return g;
}

Group Engine::cross() const {
  const auto& h = topology().host_of_rank;
  const int li = local().me;
  Group g;
  for (int host = 0; host < topology().num_hosts; ++host) {
    int seen = 0;
    for (int r = 0; r < size(); ++r) {
      if (h[static_cast<size_t>(r)] != host) continue;
      if (seen++ == li) {
        if (r == rank()) g.me = g.size();
        g.ranks.push_back(r);
      }
    }
  }
  return g;
}

bool Engine::hosts_uniform() const {
  return topology().uniform_hosts();
}

// ---------------------------------------------------------------- construction
NativeComm::NativeComm(Store store, std::string token, std::string comm_name, int rank,
                       std::vector<PeerDesc> members, Settings s)
    : store_(std::move(store)),
      token_(std::move(token)),
      name_(std::move(comm_name)),
      comm_id_(hash64(name_)),
      rank_(rank),
      members_(std::move(members)),
      settings_(s) {
  const int n = size();
  std::map<std::string, int> host_index;
  topo_.world = n;
  for (const auto& m : members_) {
    auto it = host_index.emplace(m.host, static_cast<int>(host_index.size())).first;
    topo_.host_of_rank.push_back(it->second);
  }
  topo_.num_hosts = static_cast<int>(host_index.size());
  topo_.net_everywhere = settings_.force_tcp;
  Group lg = local();
  local_rank_ = lg.me;
  local_size_ = lg.size();
  send_seq_.assign(static_cast<size_t>(n), 0);
  recv_seq_.assign(static_cast<size_t>(n), 0);
  scratch_.resize(4);
  connect_links();
  thread_ = std::thread([this] { progress_loop(); });
}

void NativeComm::connect_links() {
  const int n = size();
  links_.resize(static_cast<size_t>(n));
  if (n == 1) return;
  const PeerDesc& me = members_[static_cast<size_t>(rank_)];
  // Reserve the listener before publishing, so peers never dial a closed port.
  std::unique_ptr<TcpListener> listener;
  std::vector<PeerDesc> tcp_peers;
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    const PeerDesc& peer = members_[static_cast<size_t>(p)];
    if (settings_.force_tcp || peer.host != me.host) tcp_peers.push_back(peer);
  }
  // The TCP address is published even without TCP peers of our own, so that later
  // communicators and diagnostics can rely on it.
  std::string bind_host =
      env::get_or("COHORT_SOCKET_ADDR", local_address_towards(store_.server().host));
  listener = std::make_unique<TcpListener>(bind_host);
  store_.set("tcp/" + std::to_string(rank_), listener->address());

  ShmOptions so;
  so.ring_bytes = settings_.shm_ring;
  so.name_prefix = "/cohort-" + token_.substr(0, 16) + "-" + hex(comm_id_).substr(0, 8);
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    const PeerDesc& peer = members_[static_cast<size_t>(p)];
    if (!settings_.force_tcp && peer.host == me.host) {
      links_[static_cast<size_t>(p)].push_back(connect_shm(store_, so, me, peer));
    }
  }
  if (!tcp_peers.empty()) {
    TcpOptions to;
    to.streams = settings_.tcp_streams;
    to.token = token_;
    to.comm_id = comm_id_;
    to.deadline = Clock::now() + settings_.timeout;
    auto lanes = connect_tcp_peers(store_, *listener, to, me, tcp_peers);
    for (auto& [p, l] : lanes) links_[static_cast<size_t>(p)] = std::move(l);
  }
}

std::shared_ptr<NativeComm> NativeComm::init_world(const JobEnv& env, Settings s) {
  PeerDesc me{env.rank, local_host_id(), static_cast<int>(::getpid())};
  if (env.world == 1) {
    // A job of one needs no store; a private in-process one keeps the code paths uniform.
    auto server = std::make_unique<StoreServer>("127.0.0.1", 0, env.token);
    Store store(Endpoint{"127.0.0.1", server->port()}, env.token, s.timeout);
    auto c = std::make_shared<NativeComm>(store.prefixed("w/"), env.token, "world", 0,
                                          std::vector<PeerDesc>{me}, s);
    c->keep_alive(std::move(server));
    return c;
  }
  std::unique_ptr<StoreServer> server;
  if (env.rank == 0 && !env.store_external) {
    std::string bind = is_loopback(env.master_addr) ? env.master_addr : "0.0.0.0";
    server = std::make_unique<StoreServer>(bind, env.master_port, env.token);
  }
  Store store(Endpoint{env.master_addr, env.master_port}, env.token, s.timeout);
  // Every rank must agree on the world size, and each rank index must be claimed once.
  // A rank that finds the job inconsistent publishes why, so that the others fail with the
  // same reason instead of a bare timeout.
  auto refuse = [&](const std::string& why) {
    try {
      store.with_timeout(std::chrono::milliseconds(2000)).compare_set("abort", "", why);
    } catch (const std::exception&) {
    }
    COHORT_THROW_AS(CommError, why);
  };
  std::string agreed = store.compare_set("world_size", "", std::to_string(env.world));
  if (agreed != std::to_string(env.world)) {
    refuse("rank " + std::to_string(env.rank) + " was started with world size " +
           std::to_string(env.world) + " but other ranks registered world size " + agreed);
  }
  std::string who = me.host + " pid " + std::to_string(me.pid);
  std::string owner = store.compare_set("rank/" + std::to_string(env.rank), "", who);
  if (owner != who) {
    refuse("rank " + std::to_string(env.rank) + " is claimed twice: by " + owner + " and by " +
           who);
  }
  store.set("peer/" + std::to_string(env.rank), me.host + "\n" + std::to_string(me.pid));
  std::vector<PeerDesc> members;
  const auto deadline = Clock::now() + s.timeout;
  for (int r = 0; r < env.world; ++r) {
    std::optional<std::string> got;
    while (!(got = store.get_for("peer/" + std::to_string(r), std::chrono::milliseconds(200)))) {
      if (auto why = store.get_for("abort", std::chrono::milliseconds(0))) {
        COHORT_THROW_AS(CommError, "rank " << env.rank << ": the job failed to start: " << *why);
      }
      if (Clock::now() > deadline) {
        COHORT_THROW_AS(TimeoutError, "rank "
                                          << env.rank << ": rank " << r << " did not join within "
                                          << s.timeout.count() / 1000.0 << " s (COHORT_TIMEOUT)");
      }
    }
    std::string v = *got;
    auto nl = v.find('\n');
    members.push_back(PeerDesc{r, v.substr(0, nl), std::atoi(v.c_str() + nl + 1)});
  }
  auto c =
      std::make_shared<NativeComm>(store.prefixed("w/"), env.token, "world", env.rank, members, s);
  if (server) c->keep_alive(std::move(server));
  return c;
}

void NativeComm::keep_alive(std::unique_ptr<StoreServer> server) {
  server_ = std::move(server);
}

NativeComm::~NativeComm() {
  // A clean shutdown waits for every rank (the store may live in this process), a broken one
  // does not wait at all.
  bool healthy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    healthy = !aborted_.load();
  }
  if (healthy && size() > 1) {
    try {
      barrier().wait();
    } catch (const std::exception& e) {
      COHORT_LOG(debug, "shutdown barrier: " << e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string NativeComm::describe() const {
  std::set<std::string> kinds;
  for (const auto& l : links_) {
    if (!l.empty()) kinds.insert(l[0]->kind());
  }
  std::string t;
  for (const auto& k : kinds) t += (t.empty() ? "" : "+") + k;
  if (t.empty()) t = "none";
  return "cohort backend: " + std::to_string(size()) + " ranks on " +
         std::to_string(topo_.num_hosts) + " host(s), transports " + t + ", reduce " +
         reduce_isa() + ", algorithm " + algo_name(settings_.algo);
}

void* NativeComm::scratch(size_t bytes, int slot) {
  auto& v = scratch_.at(static_cast<size_t>(slot));
  if (v.size() < bytes + 64) v.resize(bytes + 64);
  auto p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

// ---------------------------------------------------------------- queue
Work NativeComm::submit(CollDesc d, std::function<void()> fn) {
  auto w = std::make_shared<WorkState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{d, std::move(fn), w});
  }
  cv_.notify_one();
  return Work(w);
}

void NativeComm::progress_loop() {
  while (true) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      t = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    desc_ = t.desc;
    if (aborted_.load() && broken_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = "the communicator was aborted: " + abort_reason_;
    }
    if (!broken_.empty()) {
      err = std::make_exception_ptr(
          CommError(__FILE__, __LINE__,
                    "rank " + std::to_string(rank_) + ": " + desc_.str() + " refused: " + broken_));
    } else {
      try {
        ran_algo_ = "auto";
        t.fn();
        t.work->algo = ran_algo_;
      } catch (const CommError& e) {
        std::string msg =
            "rank " + std::to_string(rank_) + ": " + desc_.str() + " failed: " + e.message();
        fail_broken(msg);
        std::string cause = root_cause();
        if (!cause.empty() && cause.find(msg) == std::string::npos) {
          msg += "; first failure in the job: " + cause;
        }
        broken_ = msg;
        if (dynamic_cast<const TimeoutError*>(&e)) {
          err = std::make_exception_ptr(TimeoutError(__FILE__, __LINE__, msg));
        } else {
          err = std::make_exception_ptr(CommError(__FILE__, __LINE__, msg));
        }
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(t.work->mu);
      t.work->done = true;
      t.work->error = err;
    }
    t.work->cv.notify_all();
  }
}

void NativeComm::fail_broken(const std::string& message) {
  aborted_.store(true);
  // Publish the first failure so that ranks that only see a closed connection can name it.
  try {
    store_.with_timeout(std::chrono::milliseconds(2000)).compare_set("abort", "", message);
  } catch (const std::exception&) {
  }
  for (auto& lanes : links_) {
    for (auto& l : lanes) l->abort(message);
  }
}

std::string NativeComm::root_cause() {
  try {
    auto v = store_.with_timeout(std::chrono::milliseconds(1000))
                 .get_for("abort", std::chrono::milliseconds(0));
    return v.value_or("");
  } catch (const std::exception&) {
    return "";
  }
}

void NativeComm::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_reason_ = reason;
  }
  aborted_.store(true);
  for (auto& lanes : links_) {
    for (auto& l : lanes) l->abort("rank " + std::to_string(rank_) + " called abort: " + reason);
  }
}

// ---------------------------------------------------------------- the progress engine
namespace {

struct Transfer {
  Link* link = nullptr;
  int peer = -1;
  bool send = false;
  wire::MsgHeader hdr;  // send: what we send; recv: what arrived
  uint8_t hdr_buf[sizeof(wire::MsgHeader)];
  size_t hdr_done = 0;
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  const uint8_t* local = nullptr;
  size_t bytes = 0;
  size_t done = 0;
  uint8_t carry[8];
  size_t carry_n = 0;
};

constexpr size_t kSlice = 512u << 10;  // bytes moved per link per turn, so that links interleave

}  // namespace

void NativeComm::mismatch(int peer, const wire::MsgHeader& h) {
  CollDesc theirs;
  theirs.coll = static_cast<Coll>(h.coll);
  theirs.dtype = static_cast<DataType>(h.dtype);
  theirs.op = static_cast<RedOp>(h.redop);
  theirs.seq = h.seq;
  theirs.root = h.root;
  theirs.count = h.count;
  COHORT_THROW_AS(CommError, "collective mismatch: this rank issued " << desc_.str() << " but rank "
                                                                      << peer << " issued "
                                                                      << theirs.str());
}

void NativeComm::exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) {
  const size_t es = esize();
  std::vector<Transfer> ts;
  ts.reserve((sends.size() + recvs.size()) * static_cast<size_t>(settings_.tcp_streams));
  auto add = [&](int peer, bool is_send, const void* src, void* dst, const void* local,
                 size_t bytes) {
    COHORT_CHECK(peer >= 0 && peer < size() && peer != rank_, "bad peer " << peer);
    auto& lanes = links_[static_cast<size_t>(peer)];
    size_t parts = (bytes >= settings_.stripe_min && lanes.size() > 1) ? lanes.size() : 1;
    size_t elems = bytes / es;
    for (size_t k = 0; k < parts; ++k) {
      size_t lo = elems * k / parts * es,
             hi = k + 1 == parts ? bytes : elems * (k + 1) / parts * es;
      Transfer t;
      t.link = lanes[k].get();
      t.peer = peer;
      t.send = is_send;
      t.bytes = hi - lo;
      if (is_send) {
        t.src = static_cast<const uint8_t*>(src) + lo;
        t.hdr.coll = static_cast<uint8_t>(desc_.coll);
        t.hdr.dtype = static_cast<uint8_t>(desc_.dtype);
        t.hdr.redop = static_cast<uint8_t>(desc_.op);
        t.hdr.seq = desc_.seq;
        t.hdr.root = desc_.root;
        t.hdr.count = desc_.count;
        t.hdr.bytes = t.bytes;
        std::memcpy(t.hdr_buf, &t.hdr, sizeof(t.hdr));
      } else {
        t.dst = static_cast<uint8_t*>(dst) + lo;
        t.local = local ? static_cast<const uint8_t*>(local) + lo : nullptr;
      }
      ts.push_back(t);
    }
  };
  for (const auto& s : sends) add(s.peer, true, s.data, nullptr, nullptr, s.bytes);
  for (const auto& r : recvs) add(r.peer, false, nullptr, r.dst, r.local, r.bytes);

  // Each link is a stream: only the oldest unfinished send and receive on it may progress.
  std::map<Link*, std::pair<std::deque<Transfer*>, std::deque<Transfer*>>> queues;
  for (auto& t : ts) (t.send ? queues[t.link].first : queues[t.link].second).push_back(&t);
  size_t remaining = ts.size();

  auto step_send = [&](Transfer& t) -> bool {
    bool moved = false;
    if (t.hdr_done < sizeof(t.hdr)) {
      size_t k = t.link->send_some(t.hdr_buf + t.hdr_done, sizeof(t.hdr) - t.hdr_done);
      t.hdr_done += k;
      moved = k > 0;
      if (t.hdr_done < sizeof(t.hdr)) return moved;
    }
    if (t.done < t.bytes) {
      size_t k = t.link->send_some(t.src + t.done, std::min(kSlice, t.bytes - t.done));
      t.done += k;
      moved = moved || k > 0;
    }
    return moved;
  };
  auto step_recv = [&](Transfer& t) -> bool {
    bool moved = false;
    if (t.hdr_done < sizeof(t.hdr)) {
      size_t k = t.link->recv_into(t.hdr_buf + t.hdr_done, sizeof(t.hdr) - t.hdr_done);
      t.hdr_done += k;
      moved = k > 0;
      if (t.hdr_done < sizeof(t.hdr)) return moved;
      wire::MsgHeader h = wire::parse_header(t.hdr_buf, sizeof(t.hdr_buf));
      bool p2p = desc_.coll == Coll::sendrecv;
      if (h.coll != static_cast<uint8_t>(desc_.coll) || h.seq != desc_.seq ||
          h.count != desc_.count || h.dtype != static_cast<uint8_t>(desc_.dtype) ||
          (!p2p && (h.redop != static_cast<uint8_t>(desc_.op) || h.root != desc_.root))) {
        mismatch(t.peer, h);
      }
      if (h.bytes != t.bytes) {
        COHORT_THROW_AS(CommError, "in " << desc_.str() << " rank " << t.peer << " sent " << h.bytes
                                         << " bytes where this rank expected " << t.bytes
                                         << " (is COHORT_ALGO set differently?)");
      }
      t.hdr = h;
    }
    size_t want = t.bytes - t.done - t.carry_n;
    if (want == 0) return moved;
    size_t k;
    if (t.local == nullptr) {
      k = t.link->recv_into(t.dst + t.done, std::min(kSlice, want));
      t.done += k;
    } else {
      k = t.link->recv_with(std::min(kSlice, want), [&](const uint8_t* p, size_t n) {
        size_t used = 0;
        if (t.carry_n > 0) {  // complete an element split across two spans
          size_t c = std::min(es - t.carry_n, n);
          std::memcpy(t.carry + t.carry_n, p, c);
          t.carry_n += c;
          used = c;
          if (t.carry_n == es) {
            reduce_into(t.dst + t.done, t.local + t.done, t.carry, 1);
            t.done += es;
            t.carry_n = 0;
          }
        }
        size_t whole = (n - used) / es * es;
        if (whole > 0) {
          reduce_into(t.dst + t.done, t.local + t.done, p + used, whole / es);
          t.done += whole;
          used += whole;
        }
        if (used < n) {
          std::memcpy(t.carry + t.carry_n, p + used, n - used);
          t.carry_n += n - used;
        }
      });
    }
    return moved || k > 0;
  };

  auto idle_since = Clock::now();
  unsigned idle = 0;
  while (remaining > 0) {
    bool moved = false;
    for (auto& [link, q] : queues) {
      auto& [sq, rq] = q;
      if (!sq.empty()) {
        Transfer& t = *sq.front();
        moved |= step_send(t);
        if (t.hdr_done == sizeof(t.hdr) && t.done == t.bytes) {
          sq.pop_front();
          --remaining;
        }
      }
      if (!rq.empty()) {
        Transfer& t = *rq.front();
        moved |= step_recv(t);
        if (t.hdr_done == sizeof(t.hdr) && t.done == t.bytes) {
          rq.pop_front();
          --remaining;
        }
      }
    }
    if (moved) {
      idle = 0;
      continue;
    }
    if (idle == 0) idle_since = Clock::now();
    ++idle;
    if (idle < 256) {
      _mm_pause();
      continue;
    }
    // Ranks may outnumber cores: give the core away instead of spinning.
    if ((idle & 63) == 0) check_while_idle(idle_since);
    auto waited = Clock::now() - idle_since;
    if (waited < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      std::vector<pollfd> fds;
      for (auto& [link, q] : queues) {
        if (link->wait_fd() >= 0 && !q.second.empty()) fds.push_back({link->wait_fd(), POLLIN, 0});
      }
      if (!fds.empty() && fds.size() == queues.size()) {
        ::poll(fds.data(), fds.size(), 1);
      } else {
        ::usleep(waited < std::chrono::milliseconds(50) ? 20 : 200);
      }
    }
  }
}

void NativeComm::check_while_idle(Clock::time_point idle_since) {
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    COHORT_THROW_AS(CommError, "the communicator was aborted: " << abort_reason_);
  }
  for (int p = 0; p < size(); ++p) {
    for (auto& l : links_[static_cast<size_t>(p)]) l->check_peer();
  }
  auto waited = Clock::now() - idle_since;
  if (waited > std::chrono::milliseconds(100) && desc_.coll != Coll::sendrecv) {
    // A peer blocked in a different collective would never send what we wait for; its header
    // may be sitting unread on a link we are not reading from.
    for (int p = 0; p < size(); ++p) {
      for (auto& l : links_[static_cast<size_t>(p)]) {
        uint8_t buf[sizeof(wire::MsgHeader)];
        if (l->peek(buf, sizeof(buf)) < sizeof(buf)) continue;
        wire::MsgHeader h;
        std::memcpy(&h, buf, sizeof(h));
        if (h.magic != wire::kMsgMagic || h.seq != desc_.seq) continue;
        if (h.coll == static_cast<uint8_t>(Coll::sendrecv)) continue;
        if (h.coll != static_cast<uint8_t>(desc_.coll) || h.count != desc_.count ||
            h.dtype != static_cast<uint8_t>(desc_.dtype) ||
            h.redop != static_cast<uint8_t>(desc_.op) || h.root != desc_.root) {
          mismatch(p, h);
        }
      }
    }
  }
  if (waited > settings_.timeout) {
    COHORT_THROW_AS(TimeoutError, "no progress for " << settings_.timeout.count() / 1000.0
                                                     << " s (COHORT_TIMEOUT); a peer is stuck or "
                                                        "did not issue this collective");
  }
}

// ---------------------------------------------------------------- the API
void NativeComm::validate_args(const char* what, size_t count, int root, int peer) {
  if (count > (1ull << 40)) COHORT_THROW(what << ": count " << count << " is not plausible");
  if (root < 0 || root >= size()) {
    COHORT_THROW(what << ": root " << root << " is outside 0.." << size() - 1);
  }
  if (peer != -1 && (peer < 0 || peer >= size() || peer == rank_)) {
    COHORT_THROW(what << ": peer " << peer << " is not another rank of 0.." << size() - 1);
  }
}

namespace {
CollDesc make(Coll c, DataType t, RedOp op, uint32_t seq, int root, size_t count) {
  CollDesc d;
  d.coll = c;
  d.dtype = t;
  d.op = op;
  d.seq = seq;
  d.root = static_cast<uint32_t>(root);
  d.count = count;
  return d;
}
}  // namespace

#define COHORT_ALGO_OF(o) ((o).algo == Algo::automatic ? settings_.algo : (o).algo)

Work NativeComm::allreduce(const void* s, void* r, size_t count, DataType t, RedOp op,
                           CollOptions o) {
  validate_args("allreduce", count, 0, -1);
  Algo a = COHORT_ALGO_OF(o);
  auto w = submit(make(Coll::allreduce, t, op, next_seq_++, 0, count), [=, this] {
    Algo chosen = a == Algo::automatic ? choose(Coll::allreduce, topo_, count * dtype_size(t)) : a;
    ran_algo_ = algo_name(chosen);
    detail::allreduce(*this, s, r, count, chosen);
  });
  return w;
}

Work NativeComm::reduce_scatter(const void* s, void* r, size_t count, DataType t, RedOp op,
                                CollOptions o) {
  validate_args("reduce_scatter", count, 0, -1);
  Algo a = COHORT_ALGO_OF(o);
  if (a != Algo::ring) a = Algo::automatic;
  return submit(make(Coll::reduce_scatter, t, op, next_seq_++, 0, count),
                [=, this] { detail::reduce_scatter(*this, s, r, count, a); });
}

Work NativeComm::allgather(const void* s, void* r, size_t count, DataType t, CollOptions o) {
  validate_args("allgather", count, 0, -1);
  Algo a = COHORT_ALGO_OF(o);
  if (a != Algo::ring && a != Algo::recursive_doubling) a = Algo::automatic;
  return submit(make(Coll::allgather, t, RedOp::sum, next_seq_++, 0, count),
                [=, this] { detail::allgather(*this, s, r, count, a); });
}

Work NativeComm::broadcast(const void* s, void* r, size_t count, DataType t, int root,
                           CollOptions o) {
  validate_args("broadcast", count, root, -1);
  Algo a = COHORT_ALGO_OF(o);
  if (a != Algo::ring && a != Algo::tree) a = Algo::automatic;
  return submit(make(Coll::broadcast, t, RedOp::sum, next_seq_++, root, count),
                [=, this] { detail::broadcast(*this, s, r, count, root, a); });
}

Work NativeComm::reduce(const void* s, void* r, size_t count, DataType t, RedOp op, int root,
                        CollOptions o) {
  validate_args("reduce", count, root, -1);
  Algo a = COHORT_ALGO_OF(o);
  if (a != Algo::ring && a != Algo::tree) a = Algo::automatic;
  return submit(make(Coll::reduce, t, op, next_seq_++, root, count),
                [=, this] { detail::reduce(*this, s, r, count, root, a); });
}

Work NativeComm::alltoall(const void* s, void* r, size_t count, DataType t, CollOptions) {
  validate_args("alltoall", count, 0, -1);
  return submit(make(Coll::alltoall, t, RedOp::sum, next_seq_++, 0, count),
                [=, this] { detail::alltoall(*this, s, r, count); });
}

Work NativeComm::gather(const void* s, void* r, size_t count, DataType t, int root, CollOptions) {
  validate_args("gather", count, root, -1);
  return submit(make(Coll::gather, t, RedOp::sum, next_seq_++, root, count),
                [=, this] { detail::gather(*this, s, r, count, root); });
}

Work NativeComm::scatter(const void* s, void* r, size_t count, DataType t, int root, CollOptions) {
  validate_args("scatter", count, root, -1);
  return submit(make(Coll::scatter, t, RedOp::sum, next_seq_++, root, count),
                [=, this] { detail::scatter(*this, s, r, count, root); });
}

Work NativeComm::send(const void* data, size_t count, DataType t, int peer) {
  validate_args("send", count, 0, peer);
  uint32_t seq = send_seq_[static_cast<size_t>(peer)]++;
  return submit(make(Coll::sendrecv, t, RedOp::sum, seq, 0, count), [=, this] {
    exchange({{peer, data, count * dtype_size(t)}}, {});
  });
}

Work NativeComm::recv(void* data, size_t count, DataType t, int peer) {
  validate_args("recv", count, 0, peer);
  uint32_t seq = recv_seq_[static_cast<size_t>(peer)]++;
  return submit(make(Coll::sendrecv, t, RedOp::sum, seq, 0, count), [=, this] {
    exchange({}, {{peer, data, count * dtype_size(t)}});
  });
}

Work NativeComm::barrier() {
  return submit(make(Coll::barrier, DataType::u8, RedOp::sum, next_seq_++, 0, 0),
                [this] { detail::barrier(*this); });
}

std::shared_ptr<Communicator> NativeComm::split(int color, int key) {
  // Everyone publishes (color, key); members of each color then build a fresh communicator
  // with its own store namespace and links.
  const uint32_t seq = split_seq_++;
  const std::string base = "split" + std::to_string(seq) + "/";
  barrier().wait();  // the split is ordered with respect to earlier collectives
  store_.set(base + std::to_string(rank_), std::to_string(color) + " " + std::to_string(key));
  std::vector<std::pair<int, int>> mine;  // (key, rank)
  for (int r = 0; r < size(); ++r) {
    std::string v = store_.get(base + std::to_string(r));
    int c = 0, k = 0;
    if (std::sscanf(v.c_str(), "%d %d", &c, &k) != 2) {
      COHORT_THROW_AS(CommError, "split: malformed entry from rank " << r << ": '" << v << "'");
    }
    if (c == color) mine.emplace_back(k, r);
  }
  if (color < 0) return nullptr;
  std::sort(mine.begin(), mine.end());
  std::vector<PeerDesc> members;
  int new_rank = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    PeerDesc d = members_[static_cast<size_t>(mine[i].second)];
    if (mine[i].second == rank_) new_rank = static_cast<int>(i);
    d.rank = static_cast<int>(i);
    members.push_back(d);
  }
  std::string name = name_ + "/s" + std::to_string(seq) + "c" + std::to_string(color);
  return std::make_shared<NativeComm>(store_.prefixed(name + "/"), token_, name, new_rank, members,
                                      settings_);
}

}  // namespace detail

// ---------------------------------------------------------------- init
#ifdef COHORT_HAVE_MPI
std::shared_ptr<Communicator> make_mpi_communicator(const JobEnv& env);
#endif

std::shared_ptr<Communicator> init(const InitOptions& opt) {
  JobEnv env = detect_job_env();
  detail::Settings s = detail::Settings::from_env();
  if (opt.timeout.count() > 0) s.timeout = opt.timeout;
  std::string backend = opt.backend.empty() ? env::get_or("COHORT_BACKEND", "cohort") : opt.backend;
  if (backend == "mpi") {
#ifdef COHORT_HAVE_MPI
    return make_mpi_communicator(env);
#else
    COHORT_THROW(
        "COHORT_BACKEND=mpi: this build has no MPI support (configure with -DCOHORT_MPI=ON)");
#endif
  }
  if (backend != "cohort") {
    COHORT_THROW("COHORT_BACKEND='" << backend << "': expected cohort or mpi");
  }
  return detail::NativeComm::init_world(env, s);
}

}  // namespace cohort::comm

namespace cohort::comm {
Work make_done_work(const std::string& algo) {
  auto s = std::make_shared<WorkState>();
  s->done = true;
  s->algo = algo;
  return Work(s);
}
}  // namespace cohort::comm
