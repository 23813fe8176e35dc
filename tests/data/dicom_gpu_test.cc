// DICOM windowing on a GPU (src/data/dicom_device.h) against the CPU decoder: scans of every
// stored depth (8, 12 of 16, 16 signed and rescaled, 32-bit RT Dose), under the file's window,
// a given one, and LINEAR_EXACT below width 1, give DicomPixels::window's values exactly
// (both run kernels/window_math.h). Label gpu.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../../src/data/dicom_device.h"
#include "cohort/core/cuda.h"
#include "cohort/data/dicom.h"
#include "testing/gpu.h"

namespace {

using namespace cohort::data;

Image stored(int w, int h, int bits, uint32_t seed) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = 1;
  img.bits = bits;
  img.data.resize(img.row_bytes() * h);
  uint32_t s = seed;
  for (size_t i = 0; i < img.data.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    img.data[i] = static_cast<uint8_t>(s >> 24);
  }
  return img;
}

TEST(DicomGpu, WindowingMatchesTheCpuDecoderAtEveryDepth) {
  COHORT_REQUIRE_GPU();
  struct Case {
    int bits, stored;
    bool is_signed;
    double slope, intercept;
    bool dose;
  };
  const std::vector<Case> cases = {{8, 8, false, 1, 0, false},
                                   {16, 12, false, 1, -1024, false},
                                   {16, 16, true, 0.75, -1024.5, false},
                                   {32, 32, false, 3e-8, 0, true}};
  DeviceDicomWindow dev;
  const cohort::cuda::Stream s = cohort::cuda::Stream::compute();
  for (const Case& c : cases) {
    DicomWriteOptions o;
    o.bits_stored = c.stored;
    o.is_signed = c.is_signed;
    if (c.dose) {
      o.dose_grid_scaling = c.slope;
    } else {
      o.slope = c.slope;
      o.intercept = c.intercept;
    }
    o.window = Window{c.dose ? 40.0 : 300.0, c.dose ? 60.0 : 900.0};
    const auto bytes = encode_dicom(stored(640, 480, c.bits, c.stored), o);
    const DicomPixels px(bytes, "case.dcm");
    for (const std::optional<Window>& w :
         {std::optional<Window>(), std::optional<Window>(Window{100, 400}),
          std::optional<Window>(Window{c.dose ? 20.0 : 50.0, 0.5, false})}) {
      const Image want = px.window(w);
      void* got_dev = cohort::cuda::device_malloc(want.data.size());
      dev.window(px, w, static_cast<uint16_t*>(got_dev), s);
      std::vector<uint8_t> got(want.data.size());
      cohort::cuda::copy_to_host(got.data(), got_dev, got.size(), s);
      s.synchronize();
      cohort::cuda::device_free(got_dev);
      ASSERT_EQ(got, want.data) << c.bits << "/" << c.stored << " bits"
                                << (w ? " under a given window" : " under the file's");
    }
  }
}

}  // namespace
