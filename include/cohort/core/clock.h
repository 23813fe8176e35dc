#pragma once

#include <chrono>
#include <cstdint>

namespace cohort {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Wall-clock seconds since the epoch: comparable across processes (a launcher's failure time
// and a restarted rank's first step), unlike Clock.
inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace cohort
