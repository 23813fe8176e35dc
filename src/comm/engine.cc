// The engine: groups from the topology, scratch memory, and the progress loop behind
// `exchange`, which moves every transfer of one step of an algorithm at once, frames and checks
// headers, reduces on arrival, and while idle spins, yields, then sleeps, checking peers, aborts
// and the deadline.
#include "engine.h"

#include <immintrin.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "cohort/core/error.h"

namespace cohort::comm::detail {

void Engine::build_groups() {
  const auto& h = topo_.host_of_rank;
  const int me = rank_;
  natural_ = Group{};
  for (int r = 0; r < topo_.world; ++r) natural_.ranks.push_back(r);
  natural_.me = me;
  world_ = natural_;
  std::stable_sort(world_.ranks.begin(), world_.ranks.end(), [&](int a, int b) {
    return h[static_cast<size_t>(a)] < h[static_cast<size_t>(b)];
  });
  world_.me = static_cast<int>(std::find(world_.ranks.begin(), world_.ranks.end(), me) -
                               world_.ranks.begin());
  local_ = Group{};
  for (int r = 0; r < topo_.world; ++r) {
    if (h[static_cast<size_t>(r)] == h[static_cast<size_t>(me)]) {
      if (r == me) local_.me = local_.size();
      local_.ranks.push_back(r);
    }
  }
  cross_ = Group{};
  for (int host = 0; host < topo_.num_hosts; ++host) {
    int seen = 0;
    for (int r = 0; r < topo_.world; ++r) {
      if (h[static_cast<size_t>(r)] != host) continue;
      if (seen++ == local_.me) {
        if (r == me) cross_.me = cross_.size();
        cross_.ranks.push_back(r);
      }
    }
  }
}

void* Engine::scratch(size_t bytes, int slot) {
  auto& v = scratch_.at(static_cast<size_t>(slot));
  if (v.size() < bytes + 64) v.resize(bytes + 64);
  auto p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

void Engine::set_link_figures(LinkModel shm, LinkModel net) {
  topo_.shm = shm;
  topo_.net = net;
}

void Engine::abort(const std::string& reason, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_reason_ = reason;
  }
  abort_links(message);
}

void Engine::abort_links(const std::string& message) {
  aborted_.store(true);
  for (auto& lanes : links_.lanes) {
    for (auto& l : lanes) l->abort(message);
  }
  for (auto& l : links_.eager) {
    if (l) l->abort(message);
  }
}

std::string Engine::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_reason_;
}

// ---------------------------------------------------------------- exchange
namespace {

constexpr size_t kSlice = 512u << 10;  // bytes moved per link per turn, so that links interleave
constexpr unsigned kFlushAfter = 200;

}  // namespace

// One message (or one lane's part of one) in flight. Small sends are staged with their header so
// that the peer sees them complete in a single ring update.
struct Engine::Transfer {
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
  size_t staged = 0;  // bytes of header+payload in `stage`: a small send's, a small receive's
  uint8_t stage[sizeof(wire::MsgHeader) + kInlineBytes];
};

// Defined here, after Transfer, because xfers_ needs the complete type (clang insists).
Engine::Engine(int rank, Topology topo, LinkSet links, const Settings& s)
    : rank_(rank), topo_(std::move(topo)), links_(std::move(links)), settings_(s) {
  build_groups();
  scratch_.resize(4);
}

Engine::~Engine() = default;

void Engine::mismatch(const CollDesc& d, int peer, const wire::MsgHeader& h) {
  COHORT_THROW_AS(CommError, "collective mismatch: this rank issued " << d.str() << " but rank "
                                                                      << peer << " issued "
                                                                      << CollDesc::of(h).str());
}

void Engine::exchange_n(const Call& c, const SendOp* sends, size_t ns, const RecvOp* recvs,
                        size_t nr) {
  const CollDesc& desc = c.desc;
  const size_t es = c.esize();
  auto& ts = xfers_;
  size_t nts = 0;
  auto add = [&](int peer, bool is_send, const void* src, void* dst, const void* local,
                 size_t bytes) {
    COHORT_CHECK(peer >= 0 && peer < size() && peer != rank_, "bad peer " << peer);
    auto& lanes = links_.lanes[static_cast<size_t>(peer)];
    Link* eager = bytes <= kInlineBytes ? links_.eager[static_cast<size_t>(peer)].get() : nullptr;
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
        const wire::MsgHeader h = desc.header(t.bytes);
        if (t.bytes <= kInlineBytes) {
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
  auto check_header = [&](const Transfer& t, const uint8_t* hdr) {
    const wire::MsgHeader h = wire::parse_header(hdr, sizeof(t.hdr_buf));
    if (!desc.matches(h)) mismatch(desc, t.peer, h);
    if (h.bytes != t.bytes) {
      COHORT_THROW_AS(CommError, "in " << desc.str() << " rank " << t.peer << " sent " << h.bytes
                                       << " bytes where this rank expected " << t.bytes
                                       << " (is COHORT_ALGO set differently?)");
    }
  };
  // A small message (sent staged, header and payload together) is taken in one call as well:
  // over TCP a receive is a system call, and two per message were measurable in latency.
  auto step_recv_small = [&](Transfer& t) -> bool {
    const size_t total = sizeof(t.hdr_buf) + t.bytes;
    const size_t before = t.staged;
    t.staged += t.link->recv_into(t.stage + t.staged, total - t.staged);
    if (before < sizeof(t.hdr_buf) && t.staged >= sizeof(t.hdr_buf)) check_header(t, t.stage);
    if (t.staged < total) return t.staged > before;
    const uint8_t* payload = t.stage + sizeof(t.hdr_buf);
    if (t.local != nullptr) {
      c.reduce_into(t.dst, t.local, payload, t.bytes / es);
    } else if (t.bytes > 0) {
      std::memcpy(t.dst, payload, t.bytes);
    }
    t.done = t.bytes;
    t.finished = true;
    return true;
  };
  auto step_recv = [&](Transfer& t) -> bool {
    if (t.bytes <= kInlineBytes) return step_recv_small(t);  // stripes are whole elements
    bool moved = false;
    if (t.hdr_done < sizeof(t.hdr_buf)) {
      size_t k = t.link->recv_into(t.hdr_buf + t.hdr_done, sizeof(t.hdr_buf) - t.hdr_done);
      t.hdr_done += k;
      moved = k > 0;
      if (t.hdr_done < sizeof(t.hdr_buf)) return moved;
      check_header(t, t.hdr_buf);
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
          const size_t part = std::min(es - t.carry_n, n);
          std::memcpy(t.carry + t.carry_n, p, part);
          t.carry_n += part;
          used = part;
          if (t.carry_n == es) {
            c.reduce_into(t.dst + t.done, t.local + t.done, t.carry, 1);
            t.done += es;
            t.carry_n = 0;
          }
        }
        size_t whole = (n - used) / es * es;
        if (whole > 0) {
          c.reduce_into(t.dst + t.done, t.local + t.done, p + used, whole / es);
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

  // Transfers whose every link can be waited on (TCP, UCX) and that still run after 1 ms are
  // bound by the link, not by latency: from then on an idle pass waits in poll() instead of
  // spinning. Measured: PyTorch DDP through the torch backend over two emulated hosts at
  // 1 Gbit/s, where spinning progress threads took the cores from backward.
  const bool waitable = std::all_of(ts.begin(), ts.begin() + static_cast<long>(nts),
                                    [](const Transfer& t) { return t.link->wait_fd() >= 0; });
  const auto started = Clock::now();
  bool link_bound = false;
  auto poll_links = [&] {
    std::vector<pollfd> fds;
    for (size_t i = 0; i < nts; ++i) {
      if (ts[i].active && !ts[i].finished) {
        fds.push_back(
            {ts[i].link->wait_fd(), static_cast<short>(ts[i].send ? POLLOUT : POLLIN), 0});
      }
    }
    ::poll(fds.data(), fds.size(), 1);
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
    if (idle == 1 && waitable && !link_bound) {
      link_bound = Clock::now() - started > std::chrono::milliseconds(1);
    }
    if (link_bound && idle < settings_.spin) {  // no spinning, no yielding
      for (size_t i = 0; i < nts; ++i) ts[i].link->flush();
      idle = settings_.spin;
    }
    if (idle < settings_.spin) {
      _mm_pause();
      continue;
    }
    if (idle == settings_.spin) {
      idle_since = Clock::now();
      if (wait_observer_) {  // no allocation: both vectors keep their capacity
        std::vector<int>& peers = waiting_scratch_;
        peers.clear();
        for (size_t i = 0; i < nts; ++i) {
          if (ts[i].active && !ts[i].finished &&
              std::find(peers.begin(), peers.end(), ts[i].peer) == peers.end()) {
            peers.push_back(ts[i].peer);
          }
        }
        if (peers != waiting_on_) {
          waiting_on_.assign(peers.begin(), peers.end());
          wait_observer_(waiting_on_);
        }
      }
    }
    // Ranks may outnumber cores: give the core away instead of spinning. Peers and aborts are
    // checked every 64 idle passes; the deadline on every pass, since 64 sleeps of up to 1 ms
    // would make a timeout late by more than the 0.1 s PyTorch's users allow.
    auto waited = Clock::now() - idle_since;
    if ((idle & 63) == 0 || waited > settings_.timeout) check_while_idle(desc, idle_since);
    if (waited < std::chrono::milliseconds(2) && !link_bound) {
      sched_yield();
    } else if (waitable) {
      poll_links();
    } else {
      // Each sleep at most 2% of the time waited so far (20 us to 1 ms): a long wait (a
      // pipeline stage's bubble, a straggler) then stops taking a core from the ranks that
      // compute with its wake-ups.
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(waited).count();
      ::usleep(static_cast<useconds_t>(std::clamp<int64_t>(us / 50, 20, 1000)));
    }
  }
  for (size_t i = 0; i < nts; ++i) ts[i].link->flush();
  if (!waiting_on_.empty()) {
    waiting_on_.clear();
    wait_observer_(waiting_on_);
  }
}

std::vector<Link*> Engine::links_of(int peer) const {
  std::vector<Link*> out;
  for (const auto& l : links_.lanes[static_cast<size_t>(peer)]) out.push_back(l.get());
  if (links_.eager[static_cast<size_t>(peer)])
    out.push_back(links_.eager[static_cast<size_t>(peer)].get());
  return out;
}

void Engine::check_while_idle(const CollDesc& d, Clock::time_point idle_since) {
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    COHORT_THROW_AS(CommError, "the communicator was aborted: " << abort_reason_);
  }
  for (int p = 0; p < size(); ++p) {
    for (Link* l : links_of(p)) l->check_peer();
  }
  auto waited = Clock::now() - idle_since;
  if (waited > std::chrono::milliseconds(100) && d.coll != Coll::sendrecv) {
    // A peer blocked in a different collective would never send what we wait for; its header
    // may be sitting unread on a link we are not reading from.
    for (int p = 0; p < size(); ++p) {
      for (Link* l : links_of(p)) {
        uint8_t buf[sizeof(wire::MsgHeader)];
        if (l->peek(buf, sizeof(buf)) < sizeof(buf)) continue;
        wire::MsgHeader h;
        std::memcpy(&h, buf, sizeof(h));
        // Only a header of this same call number can contradict it; later calls may be queued.
        if (h.magic != wire::kMsgMagic || h.seq != d.seq) continue;
        if (h.coll == static_cast<uint8_t>(Coll::sendrecv)) continue;
        if (!d.matches(h)) mismatch(d, p, h);
      }
    }
  }
  if (silence_check_ && waited > settings_.heartbeat_timeout && !waiting_on_.empty()) {
    const std::string silent = silence_check_(waiting_on_);
    if (!silent.empty()) COHORT_THROW_AS(CommError, silent);
  }
  if (waited > settings_.timeout) {
    std::string on;
    for (int p : waiting_on_) on += (on.empty() ? " waiting on rank " : ", ") + std::to_string(p);
    COHORT_THROW_AS(TimeoutError, "Timed out: no progress for "
                                      << settings_.timeout.count() / 1000.0 << " s (COHORT_TIMEOUT)"
                                      << on
                                      << "; a peer is stuck or did not issue "
                                         "this collective");
  }
}

}  // namespace cohort::comm::detail
