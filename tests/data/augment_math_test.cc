// The device operators' arithmetic (src/data/kernels/augment_math.h) on the host against the CPU
// operators: the crop's resampling from the CPU's taps (up and down, colour and gray), the flips'
// index maps. (Rotation, brightness and contrast, the normalisation and core/half.h's bf16
// rounding are the same functions in the CPU operators, which ops and pipeline tests check.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../../src/data/kernels/augment_math.h"
#include "../../src/data/taps.h"
#include "cohort/core/half.h"
#include "cohort/data/ops.h"

namespace {

using namespace cohort::data;

Image test_image(int w, int h, int channels) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = channels;
  img.data.resize(img.row_bytes() * h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c)
        img.data[(size_t(y) * w + x) * channels + c] =
            uint8_t(127 + 100 * std::sin(0.07 * x + 0.11 * y + c) + ((x ^ y) & 15));
  return img;
}

kernels::TapView view(const Taps& t) {
  return kernels::TapView{t.first.data(), t.count.data(), t.weight.data(), t.stride};
}

TEST(AugmentMath, ResamplingFromTheCpuTapsMatchesResizeCrop) {
  const CropBox boxes[] = {
      {10.5, 7.25, 300, 200}, {0, 0, 500, 375}, {40, 30, 60, 45}, {3, 2, 17, 9}};
  for (int channels : {1, 3}) {
    const Image img = test_image(500, 375, channels);
    for (const CropBox& box : boxes) {
      const int S = 64;
      std::vector<float> want(size_t(S) * S * channels);
      resize_crop(img, box, S, S, want.data());
      const Taps tx = make_taps(box.x, box.w, img.width, S);
      const Taps ty = make_taps(box.y, box.h, img.height, S);
      auto at = [&](int x, int y, int c) {
        return float(img.data[(size_t(y) * img.width + x) * channels + c]);
      };
      double worst = 0;
      for (int c = 0; c < channels; ++c)
        for (int y = 0; y < S; ++y)
          for (int x = 0; x < S; ++x) {
            const float got = kernels::resample_point(at, view(tx), view(ty), x, y, c);
            worst = std::max(worst, double(std::abs(got - want[(size_t(c) * S + y) * S + x])));
          }
      // Colour sums in the CPU's order; gray's horizontal sum runs in four lanes there.
      EXPECT_LT(worst, 1e-3) << channels << " channels, box " << box.x << "," << box.y << " "
                             << box.w << "x" << box.h;
    }
  }
}

TEST(AugmentMath, FlipsAreIndexMaps) {
  const int w = 5, h = 3;
  std::vector<float> p(w * h);
  for (int i = 0; i < w * h; ++i) p[i] = float(i);
  std::vector<float> hf = p, vf = p;
  flip_horizontal(hf.data(), 1, h, w);
  flip_vertical(vf.data(), 1, h, w);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      EXPECT_EQ(hf[y * w + x], p[y * w + kernels::flipped(x, w, true)]);
      EXPECT_EQ(vf[y * w + x], p[kernels::flipped(y, h, true) * w + x]);
      EXPECT_EQ(p[y * w + x], p[kernels::flipped(y, h, false) * w + kernels::flipped(x, w, false)]);
    }
}

}  // namespace
