// Small integer helpers shared by the layers.
#pragma once

namespace cohort {

// The largest power of two not above n (1 for n <= 1).
constexpr int pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace cohort
