// A synthetic scan data set for training tests (binaries that link cohort_data).
#pragma once

#include <cstdint>
#include <string>

#include "cohort/data/scans.h"

namespace cohort::testing {

// Writes `count` square gray scans of `width` pixels under `out` and returns `out`.
inline std::string make_scan_set(const std::string& out, int count, int width, uint64_t seed = 0,
                                 double lesion_fraction = 0.3) {
  data::ScanSetOptions s;
  s.out = out;
  s.count = count;
  s.width = width;
  s.seed = seed;
  s.lesion_fraction = lesion_fraction;
  data::make_scans(s);
  return out;
}

}  // namespace cohort::testing
