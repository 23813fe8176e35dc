// Shutdown: a healthy communicator waits for every rank (the store may live in this process);
// a broken one does not wait at all, but the rank hosting the store lingers briefly so that the
// others can read the job's first failure.
#include "cohort/core/log.h"
#include "native_comm.h"

namespace cohort::comm::detail {

NativeComm::~NativeComm() {
  // A clean shutdown waits for every rank (the store may live in this process), a broken one
  // does not wait at all.
  bool healthy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    healthy = !engine_->aborted();
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
  heartbeat_.reset();
  if (server_ && engine_->aborted()) linger_for_peers();
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

}  // namespace cohort::comm::detail
