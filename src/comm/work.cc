// Work: the handle every call returns. wait() runs queued calls itself when no other thread is
// running them (no thread hand-off), then sleeps on the call's futex.
#include "native_comm.h"

namespace cohort::comm {

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
  return s_ ? s_->algo.load() : "";
}

std::string Work::reason() const {
  return s_ ? s_->reason.load() : "";
}

int Work::source() const {
  return s_ && s_->ready.load(std::memory_order_acquire) ? s_->source.load() : -1;
}

Work make_done_work(const char* algo, const char* reason) {
  auto s = std::make_shared<WorkState>();
  s->ready.store(1);
  s->algo = algo;
  s->reason = reason;
  return Work(s);
}

}  // namespace cohort::comm
