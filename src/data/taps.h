// The resampler's taps (ops.cc): per output sample of one axis, the first source sample, how
// many it reads and their weights (a triangle filter widened by the scale when shrinking). The
// CPU resampler and the device's (kernels/augment_math.h) read the same taps.
#pragma once

#include <vector>

namespace cohort::data {

struct Taps {
  std::vector<int> first;     // first source index per output
  std::vector<int> count;     // taps per output
  std::vector<float> weight;  // count[i] weights per output, stride = max taps
  int stride = 0;
};

// Taps for resampling [start, start + len) of a line of src_len samples to `out` samples.
Taps make_taps(double start, double len, int src_len, int out);

}  // namespace cohort::data
