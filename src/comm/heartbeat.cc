#include "heartbeat.h"

#include <string>

namespace cohort::comm::detail {

namespace {
std::string key(int rank) {
  return "hb/" + std::to_string(rank);
}
}  // namespace

Heartbeat::Heartbeat(Store store, int rank, std::chrono::milliseconds interval)
    : store_(store.with_timeout(std::max(interval, std::chrono::milliseconds(500)))),
      rank_(rank),
      interval_(interval) {
  thread_ = std::thread([this] { loop(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::watch(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_ = peers;
  for (auto it = seen_.begin(); it != seen_.end();) {
    bool still = false;
    for (int p : peers) still = still || p == it->first;
    it = still ? std::next(it) : seen_.erase(it);
  }
  // No wake-up: the engine calls this at every wait, and the next beat reads soon enough.
}

std::optional<std::chrono::milliseconds> Heartbeat::silent_for(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = seen_.find(peer);
  if (it == seen_.end() || it->second.reads < 2) return std::nullopt;
  const auto now = Clock::now();
  if (now - it->second.last_read > std::max(3 * interval_, std::chrono::milliseconds(1500))) {
    return std::nullopt;
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.since);
}

void Heartbeat::loop() {
  auto next_beat = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const std::vector<int> peers = watched_;
    const bool beat = Clock::now() >= next_beat;
    lock.unlock();
    // The store may be slow or gone (the job is failing): a beat or a read that fails is
    // skipped, and tried again next time.
    if (beat) {
      next_beat = Clock::now() + interval_;
      try {
        store_.add(key(rank_), 1);
      } catch (const std::exception&) {
      }
    }
    std::vector<std::pair<int, int64_t>> counts;
    for (int p : peers) {
      try {
        auto v = store_.get_for(key(p), std::chrono::milliseconds(0));
        if (v) counts.push_back({p, std::stoll(*v)});
      } catch (const std::exception&) {
      }
    }
    lock.lock();
    const auto now = Clock::now();
    for (auto [p, n] : counts) {
      bool watched = false;
      for (int w : watched_) watched = watched || w == p;
      if (!watched) continue;
      Seen& s = seen_[p];
      if (s.count != n) {
        s.count = n;
        s.since = now;
      }
      s.last_read = now;
      ++s.reads;
    }
    cv_.wait_until(lock, next_beat, [&] { return stopping_; });
  }
}

}  // namespace cohort::comm::detail
