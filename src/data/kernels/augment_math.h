// The arithmetic of the pipeline's operators after decoding, per output element, for the host and
// the GPU (COHORT_HD): the resampling of a crop (the CPU's taps, vertical sums then horizontal),
// the flips as index maps, the rotation's bilinear sample, brightness and contrast, and the
// normalisation into the batch's type. The CPU operators (src/data/ops.cc, the pipeline's
// normalisation) call the same functions where they do the same thing element by element, and
// tests/data/augment_math_test.cc runs the rest against them on the host. bf16 output rounds
// with core/half.h's f32_to_bf16, on either device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cohort/core/host_device.h"

namespace cohort::data::kernels {

// One axis's resampling taps, as ops.cc's make_taps computes them (on the host, once per crop):
// output i reads count[i] source samples from first[i], with weight[i * stride + k].
struct TapView {
  const int* first = nullptr;
  const int* count = nullptr;
  const float* weight = nullptr;
  int stride = 0;
};

// The crop's resampled value at output (ox, oy), channel c, of a source read through
// `at(x, y, c)`: for each horizontal tap the column's vertical sum, tap after tap, then those
// sums weighted horizontally, tap after tap (the CPU's order; its one-channel horizontal sum runs
// in four lanes, which rounds differently in the last bits).
template <class At>
COHORT_HD float resample_point(const At& at, const TapView& tx, const TapView& ty, int ox, int oy,
                               int c) {
  const int x0 = tx.first[ox], nx = tx.count[ox];
  const int y0 = ty.first[oy], ny = ty.count[oy];
  const float* wx = tx.weight + ox * tx.stride;
  const float* wy = ty.weight + oy * ty.stride;
  float s = 0;
  for (int j = 0; j < nx; ++j) {
    float a = wy[0] * at(x0 + j, y0, c);
    for (int k = 1; k < ny; ++k) a = a + wy[k] * at(x0 + j, y0 + k, c);
    s += wx[j] * a;
  }
  return s;
}

// The flips as maps from an output coordinate to the coordinate it takes its value from.
COHORT_HD int flipped(int i, int n, bool flip) {
  return flip ? n - 1 - i : i;
}

// The rotation's value at (x, y) of a w x h plane turned by the angle whose cosine and sine are
// ca, sa (counter-clockwise as displayed) about its centre: the source point that lands there,
// bilinear, 0 outside (torchvision's RandomRotation fill).
COHORT_HD float rotate_point(const float* plane, int w, int h, int x, int y, double ca, double sa) {
  const double cx = (w - 1) / 2.0, cy = (h - 1) / 2.0;
  const double dx = x - cx, dy = y - cy;
  const double sx = ca * dx - sa * dy + cx, sy = sa * dx + ca * dy + cy;
  const int x0 = static_cast<int>(floor(sx)), y0 = static_cast<int>(floor(sy));
  const float fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
  auto at = [&](int xx, int yy) {
    return xx < 0 || yy < 0 || xx >= w || yy >= h ? 0.f : plane[static_cast<int64_t>(yy) * w + xx];
  };
  const float top = at(x0, y0) * (1 - fx) + at(x0 + 1, y0) * fx;
  const float bottom = at(x0, y0 + 1) * (1 - fx) + at(x0 + 1, y0 + 1) * fx;
  return top * (1 - fy) + bottom * fy;
}

// Contrast k about the channel's mean m, then brightness b (in the image's value range).
COHORT_HD float contrast_point(float v, float m, float k, float b) {
  return (v - m) * k + m + b;
}

// (v / max - mean) / std as v * a + b, with a = 1 / (max * std) and b = -mean / std.
COHORT_HD float normalize_point(float v, float a, float b) {
  return v * a + b;
}

// 8-bit output (not normalised): v scaled to 0..255 by a, rounded, clamped.
COHORT_HD uint8_t u8_point(float v, float a) {
  const float r = v * a + 0.5f;
  return static_cast<uint8_t>(r < 0.f ? 0.f : (r > 255.f ? 255.f : r));
}

}  // namespace cohort::data::kernels
