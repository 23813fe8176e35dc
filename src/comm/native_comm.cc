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
#include <sstream>

#include "cohort/comm/reduce.h"
#include "cohort/comm/wire.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef COHORT_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace cohort::comm {

// ---------------------------------------------------------------- Work
class WorkState {
 public:
  // 0 until finished; waited on with C++20's atomic wait (a futex), which costs nothing at
  // completion when nobody sleeps: no mutex or condition variable to build per call.
  std::atomic<int> ready{0};
  std::weak_ptr<detail::NativeComm> owner;  // whose queue wait() may help to drain
  std::exception_ptr error;                 // written before `ready`
  const char* algo = "";                    // a static name
};

void Work::wait() {
  if (!s_) return;
  // Run queued collectives on this thread when the progress thread is not busy with them.
  if (!s_->ready.load(std::memory_order_acquire)) {
    if (auto c = s_->owner.lock()) {
      while (!s_->ready.load(std::memory_order_acquire)) {
        if (!c->help(s_->ready)) break;
      }
    }
  }
  while (!s_->ready.load(std::memory_order_acquire)) s_->ready.wait(0, std::memory_order_acquire);
  if (s_->error) std::rethrow_exception(s_->error);
}

bool Work::test() {
  if (!s_) return true;
  return s_->ready.load(std::memory_order_acquire);
}

std::string Work::algorithm() const {
  return s_ ? s_->algo : "";
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
#ifdef COHORT_HAVE_UCX
  if (tr != "auto" && tr != "tcp" && tr != "shm" && tr != "ucx") {
    COHORT_THROW("COHORT_TRANSPORT='" << tr << "': expected auto, shm, tcp or ucx");
  }
  s.ucx = tr == "ucx";
  s.ucx_remote = tr == "auto" && ucx_has_rdma();
#else
  if (tr == "ucx") COHORT_THROW("COHORT_TRANSPORT=ucx, but this build has no UCX (libucx-dev)");
  if (tr != "auto" && tr != "tcp" && tr != "shm") {
    COHORT_THROW("COHORT_TRANSPORT='" << tr << "': expected auto, shm or tcp");
  }
#endif
  s.force_tcp = tr == "tcp";
  s.tcp_streams = static_cast<int>(env::int_or("COHORT_TCP_STREAMS", 2));
  if (s.tcp_streams < 1 || s.tcp_streams > 16) {
    COHORT_THROW("COHORT_TCP_STREAMS=" << s.tcp_streams << ": expected 1..16");
  }
  s.shm_ring = env::parse_bytes(env::get_or("COHORT_SHM_RING_BYTES", "4M"));
  s.algo = parse_algo(env::get_or("COHORT_ALGO", "auto"));
  return s;
}

wire::MsgHeader CollDesc::header(uint64_t payload_bytes) const {
  wire::MsgHeader h;
  h.coll = static_cast<uint8_t>(coll);
  h.dtype = static_cast<uint8_t>(dtype);
  h.redop = static_cast<uint8_t>(op);
  h.seq = seq;
  h.root = root;
  h.count = count;
  h.bytes = payload_bytes;
  return h;
}

CollDesc CollDesc::of(const wire::MsgHeader& h) {
  CollDesc d;
  d.coll = static_cast<Coll>(h.coll);
  d.dtype = static_cast<DataType>(h.dtype);
  d.op = static_cast<RedOp>(h.redop);
  d.seq = h.seq;
  d.root = h.root;
  d.count = h.count;
  return d;
}

bool CollDesc::matches(const wire::MsgHeader& h) const {
  const wire::MsgHeader mine = header(h.bytes);
  const bool p2p = coll == Coll::sendrecv;
  return h.coll == mine.coll && h.seq == mine.seq && h.count == mine.count &&
         h.dtype == mine.dtype && (p2p || (h.redop == mine.redop && h.root == mine.root));
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

void Engine::build_groups() {
  const auto& h = topology().host_of_rank;
  const int me = rank();
  natural_ = Group{};
  for (int r = 0; r < size(); ++r) natural_.ranks.push_back(r);
  natural_.me = me;
  world_ = natural_;
  std::stable_sort(world_.ranks.begin(), world_.ranks.end(), [&](int a, int b) {
    return h[static_cast<size_t>(a)] < h[static_cast<size_t>(b)];
  });
  world_.me = static_cast<int>(std::find(world_.ranks.begin(), world_.ranks.end(), me) -
                               world_.ranks.begin());
  local_ = Group{};
  for (int r = 0; r < size(); ++r) {
    if (h[static_cast<size_t>(r)] == h[static_cast<size_t>(me)]) {
      if (r == me) local_.me = local_.size();
      local_.ranks.push_back(r);
    }
  }
  cross_ = Group{};
  for (int host = 0; host < topology().num_hosts; ++host) {
    int seen = 0;
    for (int r = 0; r < size(); ++r) {
      if (h[static_cast<size_t>(r)] != host) continue;
      if (seen++ == local_.me) {
        if (r == me) cross_.me = cross_.size();
        cross_.ranks.push_back(r);
      }
    }
  }
}

Algo Engine::pick(Collective c, size_t bytes) const {
  const uint64_t key = (static_cast<uint64_t>(c) << 56) ^ bytes;
  auto it = picks_.find(key);
  if (it != picks_.end()) return it->second;
  Algo a = choose(c, topology(), bytes);
  if (picks_.size() > 4096) picks_.clear();
  picks_.emplace(key, a);
  return a;
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
  topo_.net_everywhere = settings_.net_everywhere();
  build_groups();
  local_rank_ = local().me;
  local_size_ = local().size();
  // Callers run queued work themselves (no thread hand-off) when every rank of this host can
  // have a core; with more ranks than cores, a thread that spins on behalf of a caller costs
  // the ranks that would make progress, so the progress thread alone runs the queue.
  callers_run_ = local_size_ <= static_cast<int>(std::thread::hardware_concurrency()) &&
                 env::int_or("COHORT_CALLER_RUNS", 1) != 0;
  send_seq_.assign(static_cast<size_t>(n), 0);
  recv_seq_.assign(static_cast<size_t>(n), 0);
  scratch_.resize(4);
  connect_links();
  thread_ = std::thread([this] { progress_loop(); });
}

void NativeComm::connect_links() {
  const int n = size();
  links_.resize(static_cast<size_t>(n));
  eager_.resize(static_cast<size_t>(n));
  if (n == 1) return;
  const PeerDesc& me = members_[static_cast<size_t>(rank_)];
  // Reserve the listener before publishing, so peers never dial a closed port.
  std::unique_ptr<TcpListener> listener;
  std::vector<PeerDesc> tcp_peers, ucx_peers;
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    const PeerDesc& peer = members_[static_cast<size_t>(p)];
    if (settings_.ucx || (settings_.ucx_remote && peer.host != me.host)) {
      ucx_peers.push_back(peer);
    } else if (settings_.force_tcp || peer.host != me.host) {
      tcp_peers.push_back(peer);
    }
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
    if (!settings_.net_everywhere() && peer.host == me.host) {
      links_[static_cast<size_t>(p)].push_back(connect_shm(store_, so, me, peer));
      // Small messages get a ring of their own: a few KiB that stay in cache, where the bulk
      // ring's lines would come from memory.
      ShmOptions eager = so;
      eager.ring_bytes = 64u << 10;
      eager.name_prefix += "e";
      eager_[static_cast<size_t>(p)] = connect_shm(store_, eager, me, peer);
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
#ifdef COHORT_HAVE_UCX
  if (!ucx_peers.empty()) {
    UcxOptions uo;
    uo.token = token_;
    uo.comm_id = comm_id_;
    uo.deadline = Clock::now() + settings_.timeout;
    uo.chunk_bytes = env::parse_bytes(env::get_or("COHORT_UCX_CHUNK", "256K"));
    uo.chunks = static_cast<int>(env::int_or("COHORT_UCX_CHUNKS", 8));
    auto links = connect_ucx_peers(store_, uo, me, ucx_peers);
    for (auto& [p, l] : links) links_[static_cast<size_t>(p)].push_back(std::move(l));
  }
#endif
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
  if (env::flag("COHORT_PROBE")) c->probe_links();
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
  if (server_ && aborted_.load()) linger_for_peers();
}

// This process hosts the store and the job is failing: the other ranks are about to look up
// the first failure there. Keep serving until they have (each counts itself in "failed"), or
// until no one has for a while; at most a few seconds.
void NativeComm::linger_for_peers() {
  const auto t0 = Clock::now();
  auto last_change = t0;
  int64_t last = -1;
  Store quick = store_.with_timeout(std::chrono::milliseconds(500));
  while (Clock::now() - t0 < std::chrono::seconds(3)) {
    int64_t failed = 0;
    try {
      failed = quick.add("failed", 0);
    } catch (const std::exception&) {
      return;
    }
    if (failed >= size() - 1) return;
    if (failed != last) {
      last = failed;
      last_change = Clock::now();
    } else if (Clock::now() - last_change > std::chrono::milliseconds(500) &&
               Clock::now() - t0 > std::chrono::seconds(1)) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string NativeComm::topology_report() const {
  std::ostringstream o;
  o << describe() << "\n";
  std::map<int, std::vector<int>> by_host;
  for (int r = 0; r < size(); ++r) by_host[topo_.host_of_rank[static_cast<size_t>(r)]].push_back(r);
  for (const auto& [h, ranks] : by_host) {
    o << "host " << h << " (" << members_[static_cast<size_t>(ranks.front())].host << "): ranks";
    for (int r : ranks) o << " " << r;
    o << "\n";
  }
  o << "transport from rank " << rank_ << ":";
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    const auto& lanes = links_[static_cast<size_t>(p)];
    o << " " << p << "=" << (lanes.empty() ? "none" : lanes[0]->kind());
    if (lanes.size() > 1) o << "x" << lanes.size();
  }
#ifdef COHORT_HAVE_UCX
  const std::vector<std::string> rdma = ucx_rdma_devices();
  o << "\nRDMA devices (UCX):";
  for (const auto& d : rdma) o << " " << d;
  if (rdma.empty()) o << " none";
  if (settings_.ucx_remote) o << " (UCX between hosts)";
#endif
  o << "\nlinks (" << (probed_ ? "measured" : "model defaults") << "): shm " << topo_.shm.latency_us
    << " us, " << topo_.shm.gbytes_per_s << " GB/s; network " << topo_.net.latency_us << " us, "
    << topo_.net.gbytes_per_s << " GB/s\n";
  o << "algorithm by size:\n";
  const Collective colls[] = {Collective::allreduce, Collective::broadcast, Collective::reduce,
                              Collective::allgather};
  char line[160];
  std::snprintf(line, sizeof(line), "%12s %14s %14s %14s %14s\n", "bytes", "allreduce", "broadcast",
                "reduce", "allgather");
  o << line;
  for (size_t b = 8; b <= (1ull << 30); b *= 16) {
    std::snprintf(line, sizeof(line), "%12zu", b);
    o << line;
    for (Collective c : colls) {
      auto est = estimate(c, topo_, b);
      std::snprintf(line, sizeof(line), " %7s %6.0fus", algo_name(est.front().algo),
                    est.front().us);
      o << line;
    }
    o << "\n";
  }
  return o.str();
}

void NativeComm::probe_links() {
  // A short, bounded probe on the world's first pairs: ping-pong for latency, a few 4 MiB
  // transfers for bandwidth. Rank 0 then shares the figures so every rank models the same.
  double fig[4] = {topo_.shm.latency_us, topo_.shm.gbytes_per_s, topo_.net.latency_us,
                   topo_.net.gbytes_per_s};
  auto measure = [&](int a, int b, double* lat_us, double* gbps) {
    if (rank_ != a && rank_ != b) return;
    const int peer = rank_ == a ? b : a;
    std::vector<uint8_t> small(8), big(4u << 20);
    auto t0 = Clock::now();
    const int pings = 200;
    for (int i = 0; i < pings; ++i) {
      if (rank_ == a) {
        send(small.data(), 8, DataType::u8, peer).wait();
        recv(small.data(), 8, DataType::u8, peer).wait();
      } else {
        recv(small.data(), 8, DataType::u8, peer).wait();
        send(small.data(), 8, DataType::u8, peer).wait();
      }
    }
    *lat_us = seconds_since(t0) * 1e6 / (2 * pings);
    t0 = Clock::now();
    const int reps = 4;
    for (int i = 0; i < reps; ++i) {
      if (rank_ == a) {
        send(big.data(), big.size(), DataType::u8, peer).wait();
      } else {
        recv(big.data(), big.size(), DataType::u8, peer).wait();
      }
    }
    if (rank_ == a) recv(small.data(), 1, DataType::u8, peer).wait();
    if (rank_ == b) send(small.data(), 1, DataType::u8, peer).wait();
    *gbps = static_cast<double>(big.size()) * reps / seconds_since(t0) / 1e9;
  };
  // Shared memory: the first two ranks of rank 0's host. Network: rank 0 and the first rank
  // elsewhere (or rank 1 when TCP is forced). Rank 0 measures both, then shares them.
  const Group& lg = local();
  const bool on_first_host =
      topo_.host_of_rank[static_cast<size_t>(rank_)] == topo_.host_of_rank[0];
  if (on_first_host && lg.size() > 1 && !settings_.net_everywhere())
    measure(lg.at(0), lg.at(1), &fig[0], &fig[1]);
  int other = -1;
  for (int r = 1; r < size() && other < 0; ++r) {
    if (settings_.net_everywhere() ||
        topo_.host_of_rank[static_cast<size_t>(r)] != topo_.host_of_rank[0])
      other = r;
  }
  if (other > 0) measure(0, other, &fig[2], &fig[3]);
  broadcast(fig, fig, 4, DataType::f64, 0, CollOptions{}).wait();
  topo_.shm = LinkModel{fig[0], fig[1]};
  topo_.net = LinkModel{fig[2], fig[3]};
  forget_picks();
  probed_ = true;
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
Work NativeComm::submit(Task task) {
  auto w = std::make_shared<WorkState>();
  task.work = w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w->owner = weak_from_this();
    queue_.push_back(std::move(task));
    ++submitted_;
  }
  // A progress thread that has been idle for a while sleeps long: wake it, unless waiting
  // callers have been running the calls themselves; then it polls often enough
  // (kCallerPollUs) for a call nobody waits for. A wake-up costs a system call and a thread
  // that takes a core from a rank for nothing: a third of a small blocking allreduce on a
  // 2-core machine. One that ran work recently polls often enough by itself.
  // A wake-up missed in a race with the flag only delays a call nobody waits for by the
  // progress thread's current poll interval: it checks the queue under mu_ before every sleep.
  const bool asleep = poll_us_.load(std::memory_order_relaxed) >= kWakeAboveUs;
  if (!callers_run_ || (asleep && !callers_ran_.load(std::memory_order_relaxed))) cv_.notify_one();
  return Work(std::move(w));
}

// Tasks run in issue order, one at a time, by whoever holds run_mu_: the progress thread, or a
// caller blocked in Work::wait(), which runs queued tasks itself instead of waiting for a
// thread hand-off (two wake-ups per call on a busy machine).
bool NativeComm::run_next() {
  Task t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return false;
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
      run_task(t);
      t.work->algo = ran_algo_;
    } catch (const CommError& e) {
      std::string msg =
          "rank " + std::to_string(rank_) + ": " + desc_.str() + " failed: " + e.message();
      std::string cause = fail_broken(msg);
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
  // Publish, then wake sleepers (the library's notify skips the system call when none sleeps).
  // Sequentially consistent: the store must be visible before notify looks for waiters, or a
  // waiter that counted itself in between could sleep through it.
  t.work->error = err;
  t.work->ready.store(1, std::memory_order_seq_cst);
  t.work->ready.notify_all();
  return true;
}

bool NativeComm::help(const std::atomic<int>& ready) {
  if (!callers_run_) return false;
  std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
  if (!run.owns_lock()) return false;
  bool ran = false;
  while (!ready.load(std::memory_order_acquire) && run_next()) ran = true;
  if (ran && !callers_ran_.load(std::memory_order_relaxed)) {
    callers_ran_.store(true, std::memory_order_relaxed);
  }
  return true;
}

void NativeComm::progress_loop() {
  int poll_us = kMinPollUs;
  bool caller_busy = false;  // a caller held the queue last time we looked
  uint64_t seen = 0;         // submitted_ when we last found the queue empty
  int quiet_us = 0;          // how long no call was submitted while callers ran them
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (callers_ran_.load(std::memory_order_relaxed)) poll_us = std::min(poll_us, kCallerPollUs);
      poll_us_.store(poll_us, std::memory_order_relaxed);
      if (!callers_run_) {
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      } else if (caller_busy) {  // sleep: the queue is not empty, but someone is running it
        cv_.wait_for(lock, std::chrono::microseconds(poll_us), [&] { return stopping_; });
      } else {
        cv_.wait_for(lock, std::chrono::microseconds(poll_us),
                     [&] { return stopping_ || !queue_.empty(); });
      }
      if (queue_.empty() && stopping_) return;
      if (queue_.empty()) {
        caller_busy = false;
        // Callers that stopped calling: sleep long again, and let the next call wake us.
        quiet_us = submitted_ == seen ? quiet_us + poll_us : 0;
        seen = submitted_;
        if (quiet_us > kCallerQuietUs) callers_ran_.store(false, std::memory_order_relaxed);
        poll_us = std::min(poll_us * 2, kMaxPollUs);  // idle: back off
        continue;
      }
    }
    // A waiting caller may be running the queue: do not block on it (its unlock would then
    // have to wake this thread), and do not poll it hard either: look again later.
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) {
      caller_busy = true;
      poll_us = std::min(poll_us * 2, kMaxPollUs);
      continue;
    }
    caller_busy = false;
    poll_us = kMinPollUs;
    bool ran = false;
    while (run_next()) ran = true;
    // Calls nobody waited for: wake-ups on submit are worth their cost again.
    if (ran) callers_ran_.store(false, std::memory_order_relaxed);
  }
}

std::string NativeComm::fail_broken(const std::string& message) {
  aborted_.store(true);
  // Publish the first failure so that ranks that only see a closed connection can name it;
  // what the store then holds is the job's first failure, maybe another rank's.
  std::string first;
  try {
    Store quick = store_.with_timeout(std::chrono::milliseconds(2000));
    first = quick.compare_set("abort", "", message);
    quick.add("failed", 1);
  } catch (const std::exception&) {
  }
  for (auto& lanes : links_) {
    for (auto& l : lanes) l->abort(message);
  }
  for (auto& l : eager_) {
    if (l) l->abort(message);
  }
  return first;
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
  for (auto& l : eager_) {
    if (l) l->abort("rank " + std::to_string(rank_) + " called abort: " + reason);
  }
}

// ---------------------------------------------------------------- the progress engine
namespace {

constexpr size_t kSlice = 512u << 10;  // bytes moved per link per turn, so that links interleave
constexpr size_t kInline = 2048;       // payloads this small travel in one piece with the header

}  // namespace

// One message (or one lane's part of one) in flight. Small sends are staged with their header so
// that the peer sees them complete in a single ring update.
struct NativeComm::Transfer {
  Link* link = nullptr;
  int peer = -1;
  bool send = false;
  bool active = false;  // oldest unfinished transfer of its direction on its link
  bool finished = false;
  uint8_t hdr_buf[sizeof(wire::MsgHeader)];
  size_t hdr_done = 0;
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  const uint8_t* local = nullptr;
  size_t bytes = 0;
  size_t done = 0;
  uint8_t carry[8];
  size_t carry_n = 0;
  size_t staged = 0;  // send: bytes of header+payload staged in `stage`
  uint8_t stage[sizeof(wire::MsgHeader) + kInline];
};

void NativeComm::mismatch(int peer, const wire::MsgHeader& h) {
  COHORT_THROW_AS(CommError, "collective mismatch: this rank issued " << desc_.str() << " but rank "
                                                                      << peer << " issued "
                                                                      << CollDesc::of(h).str());
}

// At least one poll, so that the idle clock below always starts.
static const unsigned kSpin =
    static_cast<unsigned>(std::max<int64_t>(1, env::int_or("COHORT_SPIN", 2000)));
constexpr unsigned kFlushAfter = 200;

void NativeComm::exchange_n(const SendOp* sends, size_t ns, const RecvOp* recvs, size_t nr) {
  const size_t es = esize();
  auto& ts = xfers_;
  size_t nts = 0;
  auto add = [&](int peer, bool is_send, const void* src, void* dst, const void* local,
                 size_t bytes) {
    COHORT_CHECK(peer >= 0 && peer < size() && peer != rank_, "bad peer " << peer);
    auto& lanes = links_[static_cast<size_t>(peer)];
    Link* eager = bytes <= kInline ? eager_[static_cast<size_t>(peer)].get() : nullptr;
    size_t parts = (bytes >= settings_.stripe_min && lanes.size() > 1) ? lanes.size() : 1;
    size_t elems = bytes / es;
    for (size_t k = 0; k < parts; ++k) {
      size_t lo = elems * k / parts * es,
             hi = k + 1 == parts ? bytes : elems * (k + 1) / parts * es;
      if (ts.size() <= nts) ts.resize(nts + 8);
      Transfer& t = ts[nts++];
      t.link = eager ? eager : lanes[k].get();
      t.peer = peer;
      t.send = is_send;
      t.active = false;
      t.finished = false;
      t.bytes = hi - lo;
      t.hdr_done = 0;
      t.done = 0;
      t.carry_n = 0;
      t.staged = 0;
      if (is_send) {
        t.src = static_cast<const uint8_t*>(src) + lo;
        const wire::MsgHeader h = desc_.header(t.bytes);
        if (t.bytes <= kInline) {
          std::memcpy(t.stage, &h, sizeof(h));
          if (t.bytes) std::memcpy(t.stage + sizeof(h), t.src, t.bytes);
          t.staged = sizeof(h) + t.bytes;
        } else {
          std::memcpy(t.hdr_buf, &h, sizeof(h));
        }
      } else {
        t.dst = static_cast<uint8_t*>(dst) + lo;
        t.local = local ? static_cast<const uint8_t*>(local) + lo : nullptr;
      }
    }
  };
  for (size_t i = 0; i < ns; ++i)
    add(sends[i].peer, true, sends[i].data, nullptr, nullptr, sends[i].bytes);
  for (size_t i = 0; i < nr; ++i)
    add(recvs[i].peer, false, nullptr, recvs[i].dst, recvs[i].local, recvs[i].bytes);

  // Each link is a stream: only the oldest unfinished send and receive on it may progress.
  auto activate = [&] {
    for (size_t i = 0; i < nts; ++i) {
      Transfer& t = ts[i];
      if (t.finished || t.active) continue;
      bool first = true;
      for (size_t j = 0; j < i && first; ++j) {
        first = ts[j].finished || ts[j].link != t.link || ts[j].send != t.send;
      }
      t.active = first;
    }
  };
  activate();
  size_t remaining = nts;

  auto step_send = [&](Transfer& t) -> bool {
    if (t.staged) {
      size_t k = t.link->send_some(t.stage + t.done, t.staged - t.done);
      t.done += k;
      if (t.done == t.staged && t.link->sends_complete()) t.finished = true;
      return k > 0;
    }
    bool moved = false;
    if (t.hdr_done < sizeof(t.hdr_buf)) {
      size_t k = t.link->send_some(t.hdr_buf + t.hdr_done, sizeof(t.hdr_buf) - t.hdr_done);
      t.hdr_done += k;
      moved = k > 0;
      if (t.hdr_done < sizeof(t.hdr_buf)) return moved;
    }
    if (t.done < t.bytes) {
      size_t k = t.link->send_some(t.src + t.done, std::min(kSlice, t.bytes - t.done));
      t.done += k;
      moved = moved || k > 0;
    }
    // Bytes sent in place are the caller's until the transport is done with them.
    if (t.done == t.bytes && t.link->sends_complete()) t.finished = true;
    return moved;
  };
  auto step_recv = [&](Transfer& t) -> bool {
    bool moved = false;
    if (t.hdr_done < sizeof(t.hdr_buf)) {
      size_t k = t.link->recv_into(t.hdr_buf + t.hdr_done, sizeof(t.hdr_buf) - t.hdr_done);
      t.hdr_done += k;
      moved = k > 0;
      if (t.hdr_done < sizeof(t.hdr_buf)) return moved;
      const wire::MsgHeader h = wire::parse_header(t.hdr_buf, sizeof(t.hdr_buf));
      if (!desc_.matches(h)) mismatch(t.peer, h);
      if (h.bytes != t.bytes) {
        COHORT_THROW_AS(CommError, "in " << desc_.str() << " rank " << t.peer << " sent " << h.bytes
                                         << " bytes where this rank expected " << t.bytes
                                         << " (is COHORT_ALGO set differently?)");
      }
    }
    size_t want = t.bytes - t.done - t.carry_n;
    size_t k = 0;
    if (want > 0 && t.local == nullptr) {
      k = t.link->recv_into(t.dst + t.done, std::min(kSlice, want));
      t.done += k;
    } else if (want > 0) {
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
    if (t.done == t.bytes) t.finished = true;
    return moved || k > 0;
  };

  Clock::time_point idle_since;
  unsigned idle = 0;
  while (remaining > 0) {
    bool moved = false, finished_one = false;
    for (size_t i = 0; i < nts; ++i) {
      Transfer& t = ts[i];
      if (!t.active || t.finished) continue;
      moved |= t.send ? step_send(t) : step_recv(t);
      if (t.finished) {
        --remaining;
        finished_one = true;
      }
    }
    if (finished_one) activate();
    if (moved) {
      idle = 0;
      continue;
    }
    // Consumption is published lazily: a sender only needs it when its ring is full, and then
    // this side soon idles long enough to get here.
    if (idle == kFlushAfter) {
      for (size_t i = 0; i < nts; ++i) ts[i].link->flush();
    }
    ++idle;
    if (idle < kSpin) {
      _mm_pause();
      continue;
    }
    if (idle == kSpin) idle_since = Clock::now();
    // Ranks may outnumber cores: give the core away instead of spinning.
    if ((idle & 63) == 0) check_while_idle(idle_since);
    auto waited = Clock::now() - idle_since;
    if (waited < std::chrono::milliseconds(2)) {
      sched_yield();
    } else if (std::all_of(ts.begin(), ts.begin() + static_cast<long>(nts),
                           [](const Transfer& t) { return t.link->wait_fd() >= 0; })) {
      std::vector<pollfd> fds;
      for (size_t i = 0; i < nts; ++i) {
        if (ts[i].active && !ts[i].finished) {
          fds.push_back(
              {ts[i].link->wait_fd(), static_cast<short>(ts[i].send ? POLLOUT : POLLIN), 0});
        }
      }
      ::poll(fds.data(), fds.size(), 1);
    } else {
      ::usleep(waited < std::chrono::milliseconds(50) ? 20 : 200);
    }
  }
  for (size_t i = 0; i < nts; ++i) ts[i].link->flush();
}

std::vector<Link*> NativeComm::links_of(int peer) const {
  std::vector<Link*> out;
  for (const auto& l : links_[static_cast<size_t>(peer)]) out.push_back(l.get());
  if (eager_[static_cast<size_t>(peer)]) out.push_back(eager_[static_cast<size_t>(peer)].get());
  return out;
}

void NativeComm::check_while_idle(Clock::time_point idle_since) {
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    COHORT_THROW_AS(CommError, "the communicator was aborted: " << abort_reason_);
  }
  for (int p = 0; p < size(); ++p) {
    for (Link* l : links_of(p)) l->check_peer();
  }
  auto waited = Clock::now() - idle_since;
  if (waited > std::chrono::milliseconds(100) && desc_.coll != Coll::sendrecv) {
    // A peer blocked in a different collective would never send what we wait for; its header
    // may be sitting unread on a link we are not reading from.
    for (int p = 0; p < size(); ++p) {
      for (Link* l : links_of(p)) {
        uint8_t buf[sizeof(wire::MsgHeader)];
        if (l->peek(buf, sizeof(buf)) < sizeof(buf)) continue;
        wire::MsgHeader h;
        std::memcpy(&h, buf, sizeof(h));
        // Only a header of this same call number can contradict it; later calls may be queued.
        if (h.magic != wire::kMsgMagic || h.seq != desc_.seq) continue;
        if (h.coll == static_cast<uint8_t>(Coll::sendrecv)) continue;
        if (!desc_.matches(h)) mismatch(p, h);
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
  return submit({make(Coll::allreduce, t, op, next_seq_++, 0, count), s, r, COHORT_ALGO_OF(o)});
}

Work NativeComm::reduce_scatter(const void* s, void* r, size_t count, DataType t, RedOp op,
                                CollOptions o) {
  validate_args("reduce_scatter", count, 0, -1);
  return submit(
      {make(Coll::reduce_scatter, t, op, next_seq_++, 0, count), s, r, COHORT_ALGO_OF(o)});
}

Work NativeComm::allgather(const void* s, void* r, size_t count, DataType t, CollOptions o) {
  validate_args("allgather", count, 0, -1);
  return submit(
      {make(Coll::allgather, t, RedOp::sum, next_seq_++, 0, count), s, r, COHORT_ALGO_OF(o)});
}

Work NativeComm::broadcast(const void* s, void* r, size_t count, DataType t, int root,
                           CollOptions o) {
  validate_args("broadcast", count, root, -1);
  return submit(
      {make(Coll::broadcast, t, RedOp::sum, next_seq_++, root, count), s, r, COHORT_ALGO_OF(o)});
}

Work NativeComm::reduce(const void* s, void* r, size_t count, DataType t, RedOp op, int root,
                        CollOptions o) {
  validate_args("reduce", count, root, -1);
  return submit({make(Coll::reduce, t, op, next_seq_++, root, count), s, r, COHORT_ALGO_OF(o)});
}

Work NativeComm::alltoall(const void* s, void* r, size_t count, DataType t, CollOptions) {
  validate_args("alltoall", count, 0, -1);
  return submit({make(Coll::alltoall, t, RedOp::sum, next_seq_++, 0, count), s, r});
}

Work NativeComm::gather(const void* s, void* r, size_t count, DataType t, int root, CollOptions) {
  validate_args("gather", count, root, -1);
  return submit({make(Coll::gather, t, RedOp::sum, next_seq_++, root, count), s, r});
}

Work NativeComm::scatter(const void* s, void* r, size_t count, DataType t, int root, CollOptions) {
  validate_args("scatter", count, root, -1);
  return submit({make(Coll::scatter, t, RedOp::sum, next_seq_++, root, count), s, r});
}

Work NativeComm::send(const void* data, size_t count, DataType t, int peer) {
  validate_args("send", count, 0, peer);
  uint32_t seq = send_seq_[static_cast<size_t>(peer)]++;
  return submit({make(Coll::sendrecv, t, RedOp::sum, seq, 0, count), data, nullptr, Algo::direct,
                 peer, true});
}

Work NativeComm::recv(void* data, size_t count, DataType t, int peer) {
  validate_args("recv", count, 0, peer);
  uint32_t seq = recv_seq_[static_cast<size_t>(peer)]++;
  return submit({make(Coll::sendrecv, t, RedOp::sum, seq, 0, count), nullptr, data, Algo::direct,
                 peer, false});
}

Work NativeComm::barrier() {
  return submit(
      {make(Coll::barrier, DataType::u8, RedOp::sum, next_seq_++, 0, 0), nullptr, nullptr});
}

void NativeComm::run_task(const Task& t) {
  const CollDesc& d = t.desc;
  const size_t n = d.count;
  const int root = static_cast<int>(d.root);
  Algo a = t.algo;
  switch (d.coll) {
    case Coll::allreduce:
      if (a == Algo::automatic) a = pick(Coll::allreduce, n * dtype_size(d.dtype));
      ran_algo_ = algo_name(a);
      return detail::allreduce(*this, t.send, t.recv, n, a);
    case Coll::reduce_scatter:
      return detail::reduce_scatter(*this, t.send, t.recv, n,
                                    a == Algo::ring ? a : Algo::automatic);
    case Coll::allgather:
      if (a != Algo::ring && a != Algo::recursive_doubling) a = Algo::automatic;
      return detail::allgather(*this, t.send, t.recv, n, a);
    case Coll::broadcast:
      if (a != Algo::ring && a != Algo::tree) a = Algo::automatic;
      return detail::broadcast(*this, t.send, t.recv, n, root, a);
    case Coll::reduce:
      if (a != Algo::ring && a != Algo::tree) a = Algo::automatic;
      return detail::reduce(*this, t.send, t.recv, n, root, a);
    case Coll::alltoall:
      return detail::alltoall(*this, t.send, t.recv, n);
    case Coll::gather:
      return detail::gather(*this, t.send, t.recv, n, root);
    case Coll::scatter:
      return detail::scatter(*this, t.send, t.recv, n, root);
    case Coll::barrier:
      return detail::barrier(*this);
    case Coll::sendrecv:
      if (t.is_send) {
        SendOp op{t.peer, t.send, n * dtype_size(d.dtype)};
        return exchange_n(&op, 1, nullptr, 0);
      } else {
        RecvOp op{t.peer, t.recv, n * dtype_size(d.dtype)};
        return exchange_n(nullptr, 0, &op, 1);
      }
  }
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
Work make_done_work(const char* algo) {
  auto s = std::make_shared<WorkState>();
  s->ready.store(1);
  s->algo = algo;
  return Work(s);
}
}  // namespace cohort::comm
