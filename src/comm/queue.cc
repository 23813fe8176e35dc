// The queue: calls run in issue order, one at a time, by whoever holds run_mu_ (the progress
// thread, or a caller blocked in Work::wait()); a failed call breaks the communicator, publishes
// the job's first failure in the store and aborts every link, so that peers fail promptly.
#include "cohort/comm/store.h"
#include "cohort/core/error.h"
#include "collectives/collectives.h"
#include "native_comm.h"

namespace cohort::comm::detail {

Work NativeComm::submit(Call call) {
  auto w = std::make_shared<WorkState>();
  w->algo = algo_name(call.algo);
  w->reason = call.reason;
  const uint64_t flight_id = flight_->queued(call);
  {
    std::lock_guard<std::mutex> lock(mu_);
    w->owner = weak_from_this();
    queue_.push_back(Queued{call, w, flight_id});
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
  Queued q;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return false;
    q = std::move(queue_.front());
    queue_.pop_front();
  }
  const Call& c = q.call;
  std::exception_ptr err;
  if (engine_->aborted() && broken_.empty()) {
    broken_ = "the communicator was aborted: " + engine_->abort_reason();
  }
  if (!broken_.empty()) {
    err = std::make_exception_ptr(
        CommError(__FILE__, __LINE__,
                  "rank " + std::to_string(rank_) + ": " + c.desc.str() + " refused: " + broken_));
  } else {
    try {
      flight_->started(q.flight_id);
      const Algo ran = run(*engine_, c);
      if (ran != c.algo) {
        q.work->algo = algo_name(ran);
        q.work->reason = "a rank's buffers lie outside shared memory";
      }
      flight_->ended(q.flight_id, true);
    } catch (const CommError& e) {
      std::string msg =
          "rank " + std::to_string(rank_) + ": " + c.desc.str() + " failed: " + e.message();
      std::string cause = fail_broken(msg);
      if (!cause.empty() && cause.find(msg) == std::string::npos) {
        msg += "; first failure in the job: " + cause;
      }
      broken_ = msg;
      flight_->ended(q.flight_id, false);
      const std::string dumped = flight_->dump(msg);
      if (!dumped.empty()) msg += " (flight recorder: " + dumped + ")";
      if (dynamic_cast<const TimeoutError*>(&e)) {
        err = std::make_exception_ptr(TimeoutError(__FILE__, __LINE__, msg));
      } else {
        err = std::make_exception_ptr(CommError(__FILE__, __LINE__, msg));
      }
    } catch (...) {
      flight_->ended(q.flight_id, false);
      err = std::current_exception();
    }
  }
  // Publish, then wake sleepers (the library's notify skips the system call when none sleeps).
  // Sequentially consistent: the store must be visible before notify looks for waiters, or a
  // waiter that counted itself in between could sleep through it.
  q.work->error = err;
  q.work->ready.store(1, std::memory_order_seq_cst);
  q.work->ready.notify_all();
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
  // Publish the first failure so that ranks that only see a closed connection can name it;
  // what the store then holds is the job's first failure, maybe another rank's.
  std::string first;
  try {
    Store quick = store_.with_timeout(std::chrono::milliseconds(2000));
    first = quick.compare_set("abort", "", message);
    quick.add("failed", 1);
  } catch (const std::exception&) {
  }
  engine_->abort_links(message);
  return first;
}

void NativeComm::abort(const std::string& reason) {
  flight_->dump("aborted: " + reason);
  engine_->abort(reason, "rank " + std::to_string(rank_) + " called abort: " + reason);
}

}  // namespace cohort::comm::detail
