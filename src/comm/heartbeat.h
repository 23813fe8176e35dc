// The heartbeat: a thread per communicator that adds to this rank's counter in the store every
// interval and reads the counters of the peers the engine waits on. A peer whose counter has not
// moved for the heartbeat timeout is stopped or frozen (SIGSTOP, a debugger, a hung node): all
// its threads stand still. A peer busy or deadlocked in user code still beats, and is left to
// the call's timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cohort/comm/store.h"
#include "cohort/core/clock.h"

namespace cohort::comm::detail {

class Heartbeat {
 public:
  Heartbeat(Store store, int rank, std::chrono::milliseconds interval);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The peers whose beats to follow (the engine's waited-on peers; empty: none).
  void watch(const std::vector<int>& peers);
  // How long a watched peer's counter has stood still, once read at least twice; nullopt when
  // it is not watched, or when the store has not answered lately (a store that is down or slow
  // says nothing about the peer).
  std::optional<std::chrono::milliseconds> silent_for(int peer) const;

 private:
  void loop();
  struct Seen {
    int64_t count = -1;
    Clock::time_point since;      // when `count` was first read
    Clock::time_point last_read;  // the last read the store answered
    int reads = 0;
  };
  Store store_;
  int rank_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<int> watched_;
  std::map<int, Seen> seen_;
  std::thread thread_;
};

}  // namespace cohort::comm::detail
