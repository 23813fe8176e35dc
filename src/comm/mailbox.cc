// Communicator::open_mailbox, and the Mailbox over Cohort's links (mailbox.h): posting, the
// matching of arriving messages to receives, held messages, the progress thread, timeouts and
// dead peers.
#include "mailbox.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/hash.h"
#include "native_comm.h"

namespace cohort::comm {

std::shared_ptr<Mailbox> Communicator::open_mailbox() {
  COHORT_THROW_AS(CommError, "this backend (" << describe()
                                              << ") has no mailbox (isend/irecv with tags and "
                                                 "from any source); Cohort's own backend has one");
}

namespace detail {

namespace {

// Payload bytes moved per link per pass, so that one large message does not hold up the others.
constexpr size_t kMailboxSlice = 512u << 10;
// How often timeouts and dead peers are looked for while calls are pending: well inside the
// 0.1 s that PyTorch's users allow a timeout to be late.
constexpr auto kMailboxCheckEvery = std::chrono::milliseconds(5);

std::exception_ptr comm_error(const std::string& what) {
  return std::make_exception_ptr(CommError(__FILE__, __LINE__, what));
}

std::exception_ptr timeout_error(const std::string& what) {
  return std::make_exception_ptr(TimeoutError(__FILE__, __LINE__, what));
}

}  // namespace

std::shared_ptr<Mailbox> NativeComm::open_mailbox() {
  const uint32_t seq = mailbox_seq_++;
  barrier().wait();  // ordered with the collectives issued before it, as split is
  const std::string name = name_ + "/m" + std::to_string(seq);
  return std::make_shared<NativeMailbox>(store_.prefixed(name + "/"), token_, name, rank_, members_,
                                         settings_);
}

NativeMailbox::NativeMailbox(Store store, const std::string& token, const std::string& name,
                             int rank, const std::vector<PeerDesc>& members, const Settings& s)
    : rank_(rank), size_(static_cast<int>(members.size())), settings_(s) {
  links_ = connect_links(store, token, fnv1a64(name), rank, members, s);
  peers_.resize(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p != rank_)
      peers_[static_cast<size_t>(p)].link = links_.lanes[static_cast<size_t>(p)].at(0).get();
  }
  drop_.resize(64u << 10);
  thread_ = std::thread([this] { progress_loop(); });
}

NativeMailbox::~NativeMailbox() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::vector<Answer> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) fail_peer(p, "the mailbox was closed", answers);
    }
    for (const OpPtr& op : posted_) {
      answer(op, comm_error(describe(*op) + ": the mailbox was closed"), -1, answers);
    }
    posted_.clear();
  }
  deliver(answers);
}

std::string NativeMailbox::describe(const Op& op) const {
  std::string s = "rank " + std::to_string(rank_) + "'s " + (op.send ? "isend" : "irecv") + " of " +
                  std::to_string(op.bytes) + " bytes with tag " + std::to_string(op.tag);
  if (op.send) return s + " to rank " + std::to_string(op.peer);
  return s + (op.peer == kAnySource ? " from any rank" : " from rank " + std::to_string(op.peer));
}

NativeMailbox::OpPtr NativeMailbox::make_op(bool send, int peer, int tag, size_t bytes,
                                            Done done) const {
  auto op = std::make_shared<Op>();
  op->send = send;
  op->peer = peer;
  op->tag = tag;
  op->bytes = bytes;
  op->deadline = Clock::now() + settings_.timeout;
  op->work = std::make_shared<WorkState>();
  op->work->algo = "direct";
  op->work->reason = "mailbox";
  op->done = std::move(done);
  return op;
}

Work NativeMailbox::isend(const void* data, size_t bytes, int peer, int tag, Done done) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    COHORT_THROW("isend: peer " << peer << " is not another rank of 0.." << size_ - 1);
  }
  if (bytes > wire::kMaxMessage) COHORT_THROW("isend: " << bytes << " bytes is not plausible");
  OpPtr op = make_op(true, peer, tag, bytes, std::move(done));
  op->src = static_cast<const uint8_t*>(data);
  Work w(op->work);
  std::vector<Answer> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    Peer& pr = peers_[static_cast<size_t>(peer)];
    if (!pr.failed.empty()) {
      answer(op, comm_error(describe(*op) + ": " + pr.failed), -1, answers);
    } else {
      pr.out.queue.push_back(op);
    }
  }
  cv_.notify_one();
  deliver(answers);
  return w;
}

Work NativeMailbox::irecv(void* data, size_t bytes, int peer, int tag, Done done) {
  if (peer != kAnySource && (peer < 0 || peer >= size_ || peer == rank_)) {
    COHORT_THROW("irecv: peer " << peer << " is not another rank of 0.." << size_ - 1
                                << " nor kAnySource");
  }
  OpPtr op = make_op(false, peer, tag, bytes, std::move(done));
  op->dst = static_cast<uint8_t*>(data);
  Work w(op->work);
  std::vector<Answer> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto held = std::find_if(held_.begin(), held_.end(), [&](const Held& h) {
      return !h.taker && (peer == kAnySource || h.peer == peer) && h.tag == tag;
    });
    if (peer != kAnySource && !peers_[static_cast<size_t>(peer)].failed.empty() &&
        held == held_.end()) {
      answer(op, comm_error(describe(*op) + ": " + peers_[static_cast<size_t>(peer)].failed), -1,
             answers);
    } else if (held != held_.end() && held->data.size() != bytes) {
      answer(op,
             comm_error(describe(*op) + ": rank " + std::to_string(held->peer) + " sent " +
                        std::to_string(held->data.size()) + " bytes with that tag; the receive " +
                        "expects " + std::to_string(bytes)),
             -1, answers);
    } else if (held != held_.end() && held->complete) {
      if (bytes > 0) std::memcpy(op->dst, held->data.data(), bytes);
      answer(op, nullptr, held->peer, answers);
      held_.erase(held);
    } else if (held != held_.end()) {
      held->taker = op;  // answered once the rest of it arrived
    } else {
      posted_.push_back(op);
    }
  }
  cv_.notify_one();
  deliver(answers);
  return w;
}

void NativeMailbox::answer(const OpPtr& op, std::exception_ptr error, int source,
                           std::vector<Answer>& answers) {
  if (!op->work) return;  // answered already (a send that timed out part way still goes out)
  Answer a;
  a.work = std::move(op->work);
  a.done = std::move(op->done);
  a.error = std::move(error);
  a.source = source;
  answers.push_back(std::move(a));
  op->work = nullptr;
}

void NativeMailbox::deliver(std::vector<Answer>& answers) {
  for (Answer& a : answers) {
    a.work->error = a.error;
    a.work->source.store(a.error ? -1 : a.source);
    a.work->ready.store(1, std::memory_order_seq_cst);
    a.work->ready.notify_all();
    if (a.done) a.done(Work(a.work));
  }
  answers.clear();
}

bool NativeMailbox::pending() const {
  if (!posted_.empty()) return true;
  for (const Held& h : held_) {
    if (h.taker) return true;
  }
  for (const Peer& p : peers_) {
    if (!p.out.queue.empty() || p.in.in_message || p.in.header_done > 0) return true;
  }
  return false;
}

NativeMailbox::OpPtr NativeMailbox::match_posted(int peer, int tag) {
  auto it = std::find_if(posted_.begin(), posted_.end(), [&](const OpPtr& op) {
    return (op->peer == kAnySource || op->peer == peer) && op->tag == tag;
  });
  if (it == posted_.end()) return nullptr;
  OpPtr op = *it;
  posted_.erase(it);
  return op;
}

bool NativeMailbox::pass_out(int p, std::vector<Answer>& answers) {
  Peer& pr = peers_[static_cast<size_t>(p)];
  Outgoing& o = pr.out;
  bool moved = false;
  while (!o.queue.empty()) {
    const OpPtr op = o.queue.front();
    if (!o.started) {
      wire::MsgHeader h;
      h.coll = static_cast<uint8_t>(Coll::sendrecv);
      h.dtype = static_cast<uint8_t>(DataType::u8);
      h.seq = o.sent++;
      h.root = static_cast<uint32_t>(op->tag);
      h.count = op->bytes;
      h.bytes = op->bytes;
      std::memcpy(o.header, &h, sizeof(h));
      o.header_done = 0;
      o.done = 0;
      o.started = true;
    }
    if (o.header_done < sizeof(o.header)) {
      const size_t k =
          pr.link->send_some(o.header + o.header_done, sizeof(o.header) - o.header_done);
      o.header_done += k;
      moved = moved || k > 0;
      if (o.header_done < sizeof(o.header)) break;
    }
    if (o.done < op->bytes) {
      const size_t k =
          pr.link->send_some(op->src + o.done, std::min(kMailboxSlice, op->bytes - o.done));
      o.done += k;
      moved = moved || k > 0;
      if (o.done < op->bytes) break;
    }
    if (!pr.link->sends_complete()) break;
    answer(op, nullptr, -1, answers);
    o.queue.pop_front();
    o.started = false;
  }
  return moved;
}

bool NativeMailbox::pass_in(int p, std::vector<Answer>& answers) {
  Peer& pr = peers_[static_cast<size_t>(p)];
  Incoming& in = pr.in;
  bool moved = false;
  for (int message = 0; message < 64; ++message) {  // bounded, so that other peers get turns
    if (!in.in_message) {
      const size_t k =
          pr.link->recv_into(in.header + in.header_done, sizeof(in.header) - in.header_done);
      in.header_done += k;
      moved = moved || k > 0;
      if (in.header_done < sizeof(in.header)) break;
      in.h = wire::parse_header(in.header, sizeof(in.header));
      if (in.h.coll != static_cast<uint8_t>(Coll::sendrecv)) {
        COHORT_THROW_AS(CommError, "rank " << p << " sent a " << CollDesc::of(in.h).str()
                                           << " message on a mailbox link");
      }
      in.header_done = 0;
      in.in_message = true;
      in.done = 0;
      in.discard = false;
      in.op = nullptr;
      const int tag = static_cast<int>(in.h.root);
      // The oldest receive that takes it; one that expects another size fails, saying so.
      while (OpPtr op = match_posted(p, tag)) {
        if (op->bytes == in.h.bytes) {
          in.op = op;
          break;
        }
        answer(op,
               comm_error(describe(*op) + ": rank " + std::to_string(p) + " sent " +
                          std::to_string(in.h.bytes) + " bytes with that tag; the receive " +
                          "expects " + std::to_string(op->bytes)),
               -1, answers);
      }
      if (!in.op) {
        held_.push_back(Held{p, tag, std::vector<uint8_t>(in.h.bytes), false, nullptr});
        in.held = std::prev(held_.end());
      }
    }
    if (in.done < in.h.bytes) {
      const size_t want = std::min<size_t>(kMailboxSlice, in.h.bytes - in.done);
      size_t k = 0;
      if (in.op) {
        k = pr.link->recv_into(in.op->dst + in.done, want);
      } else if (in.discard) {
        k = pr.link->recv_into(drop_.data(), std::min(want, drop_.size()));
      } else {
        k = pr.link->recv_into(in.held->data.data() + in.done, want);
      }
      in.done += k;
      moved = moved || k > 0;
      if (in.done < in.h.bytes) break;
    }
    in.in_message = false;
    if (in.op) {
      answer(in.op, nullptr, p, answers);
      in.op = nullptr;
    } else if (!in.discard) {
      in.held->complete = true;
      if (OpPtr taker = in.held->taker) {
        if (taker->bytes > 0) std::memcpy(taker->dst, in.held->data.data(), taker->bytes);
        answer(taker, nullptr, p, answers);
        held_.erase(in.held);
      }
    }
  }
  if (moved) pr.link->flush();
  return moved;
}

bool NativeMailbox::pass(std::vector<Answer>& answers) {
  bool moved = false;
  for (int p = 0; p < size_; ++p) {
    Peer& pr = peers_[static_cast<size_t>(p)];
    if (p == rank_ || !pr.failed.empty()) continue;
    try {
      moved = pass_out(p, answers) || moved;
      moved = pass_in(p, answers) || moved;
    } catch (const Error& e) {
      fail_peer(p, e.message(), answers);
    } catch (const std::exception& e) {  // a held message too large to allocate, say
      fail_peer(p,
                std::string("the mailbox failed on rank ") + std::to_string(p) +
                    "'s messages: " + e.what(),
                answers);
    }
  }
  return moved;
}

void NativeMailbox::expire(Clock::time_point now, std::vector<Answer>& answers) {
  const std::string after = COHORT_STR("Timed out after " << settings_.timeout.count() / 1000.0
                                                          << " s (the communicator's timeout, "
                                                             "COHORT_TIMEOUT): ");
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->deadline > now) {
      ++it;
      continue;
    }
    answer(*it, timeout_error(after + describe(**it) + " got no message"), -1, answers);
    it = posted_.erase(it);
  }
  for (Held& h : held_) {
    if (h.taker && h.taker->deadline <= now) {
      answer(h.taker,
             timeout_error(after + describe(*h.taker) + ": rank " + std::to_string(h.peer) +
                           "'s message stopped arriving"),
             -1, answers);
      h.taker = nullptr;
    }
  }
  for (int p = 0; p < size_; ++p) {
    Peer& pr = peers_[static_cast<size_t>(p)];
    if (pr.in.in_message && pr.in.op && pr.in.op->deadline <= now) {
      answer(pr.in.op,
             timeout_error(after + describe(*pr.in.op) + ": rank " + std::to_string(p) +
                           "'s message stopped arriving after " + std::to_string(pr.in.done) +
                           " bytes"),
             -1, answers);
      pr.in.op = nullptr;
      pr.in.discard = true;  // the rest is read and dropped: the receiver's buffer is its own again
    }
    auto& q = pr.out.queue;
    if (!q.empty() && pr.out.started && q.front()->deadline <= now) {
      // Part of it is on the wire, and a transport that sends in place (UCX) may still read the
      // caller's buffer: the stream to that rank cannot go on. Its link is closed (which ends
      // such reads) and every call with that rank fails with the timeout.
      const std::string why = after + describe(*q.front()) + ": rank " + std::to_string(p) +
                              " stopped taking it part way (its process or its mailbox is " +
                              "stuck); the mailbox's link to rank " + std::to_string(p) +
                              " is closed";
      pr.link->abort(why);
      fail_peer(p, why, answers, /*timed_out=*/true);
      continue;
    }
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->deadline > now) {
        ++it;
        continue;
      }
      answer(*it,
             timeout_error(after + describe(**it) + ": rank " + std::to_string(p) +
                           " did not take it (its process or its mailbox is stuck)"),
             -1, answers);
      it = q.erase(it);
    }
  }
}

void NativeMailbox::check_peers(std::vector<Answer>& answers) {
  for (int p = 0; p < size_; ++p) {
    Peer& pr = peers_[static_cast<size_t>(p)];
    if (p == rank_ || !pr.failed.empty()) continue;
    try {
      pr.link->check_peer();
    } catch (const Error& e) {
      fail_peer(p, e.message(), answers);
    }
  }
}

void NativeMailbox::fail_peer(int p, const std::string& why, std::vector<Answer>& answers,
                              bool timed_out) {
  Peer& pr = peers_[static_cast<size_t>(p)];
  if (pr.failed.empty()) pr.failed = why;
  auto error = [&](const Op& op) {
    return timed_out ? timeout_error(why) : comm_error(describe(op) + ": " + why);
  };
  for (const OpPtr& op : pr.out.queue) answer(op, error(*op), -1, answers);
  pr.out.queue.clear();
  if (pr.in.op) answer(pr.in.op, error(*pr.in.op), -1, answers);
  pr.in = Incoming{};
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->peer != p || it->complete) {
      ++it;
      continue;
    }
    if (it->taker) answer(it->taker, error(*it->taker), -1, answers);
    it = held_.erase(it);
  }
  bool anyone_left = false;
  for (int q = 0; q < size_; ++q) {
    anyone_left = anyone_left || (q != rank_ && peers_[static_cast<size_t>(q)].failed.empty());
  }
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer == p || ((*it)->peer == kAnySource && !anyone_left)) {
      answer(*it, error(**it), -1, answers);
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
}

void NativeMailbox::progress_loop() {
  unsigned idle = 0;
  auto idle_since = Clock::now();
  auto last_check = Clock::now();
  auto quiet_wait = std::chrono::microseconds(1000);
  std::vector<Answer> answers;
  for (;;) {
    bool moved = false, busy = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) return;
      moved = pass(answers);
      const auto now = Clock::now();
      if (now - last_check >= kMailboxCheckEvery) {
        expire(now, answers);
        if (pending()) check_peers(answers);
        last_check = now;
      }
      busy = pending();
      if (!moved && !busy && answers.empty()) {
        // Nothing posted: look for messages that arrive before their receives now and then,
        // waking at once for a new call.
        idle = 0;
        cv_.wait_for(lock, quiet_wait, [&] { return stopping_ || pending(); });
        quiet_wait = std::min(quiet_wait * 2, std::chrono::microseconds(10000));
        continue;
      }
      quiet_wait = std::chrono::microseconds(1000);
    }
    deliver(answers);
    if (moved) {
      idle = 0;
      continue;
    }
    const unsigned spin = std::max(1u, settings_.spin);
    if (++idle < spin) {
      _mm_pause();
      continue;
    }
    if (idle == spin) idle_since = Clock::now();
    const auto waited = Clock::now() - idle_since;
    if (waited < std::chrono::milliseconds(2)) {
      sched_yield();
      continue;
    }
    // A long wait (a peer still computing) sleeps in steps of 2% of the time waited so far,
    // 20 us to 1 ms, as the engine does; a new call wakes it.
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(waited).count();
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t calls_before = calls_;
    cv_.wait_for(lock, std::chrono::microseconds(std::clamp<int64_t>(us / 50, 20, 1000)),
                 [&] { return stopping_ || calls_ != calls_before; });
  }
}

}  // namespace detail
}  // namespace cohort::comm
