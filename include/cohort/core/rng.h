// Counter-based randomness: every draw is a pure function of (seed, stream, counter), so that a
// sample's augmentation does not depend on which thread, rank or resume point produced it.
#pragma once

#include <cstdint>

namespace cohort {

// SplitMix64's finaliser: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t key3(uint64_t a, uint64_t b, uint64_t c) {
  return mix64(mix64(mix64(a) ^ b) ^ c);
}

// A small generator keyed on a counter tuple; draws are reproducible from the key alone.
class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t next() { return mix64(key_ ^ mix64(++n_)); }
  double uniform() {
    return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  }  // [0,1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }

 private:
  uint64_t key_;
  uint64_t n_ = 0;
};

}  // namespace cohort
