// The mixed JPEG decoder on a GPU (src/data/jpeg_device.h): a batch of files in every layout the
// device path takes, entropy-decoded on the CPU and finished on the device, gives the host run
// of the same arithmetic and libjpeg-turbo's accurate decoding to the bit. Label gpu.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <vector>

#include "../../src/data/jpeg_device.h"
#include "cohort/core/cuda.h"
#include "testing/gpu.h"

namespace {

std::vector<uint8_t> make_jpeg(int w, int h, int sub, int quality) {
  const int ch = sub == TJSAMP_GRAY ? 1 : 3;
  std::vector<uint8_t> px(size_t(w) * h * ch);
  for (size_t i = 0; i < px.size(); ++i)
    px[i] = uint8_t(128 + 100 * std::sin(0.01 * double(i) * (1 + i % 3)) + (i * 7919) % 23);
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  EXPECT_EQ(tjCompress2(t, px.data(), w, 0, h, ch == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &len, sub,
                        quality, TJFLAG_ACCURATEDCT),
            0);
  std::vector<uint8_t> out(buf, buf + len);
  tjFree(buf);
  tjDestroy(t);
  return out;
}

TEST(JpegGpu, ABatchDecodesToLibjpegTurbosPixels) {
  COHORT_REQUIRE_GPU();
  std::vector<std::vector<uint8_t>> files;
  for (int sub : {TJSAMP_420, TJSAMP_422, TJSAMP_444, TJSAMP_GRAY})
    for (auto [w, h] : {std::pair{500, 375}, std::pair{37, 29}, std::pair{224, 224}})
      files.push_back(make_jpeg(w, h, sub, 90));
  std::vector<cohort::data::JpegCoefficients> batch(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    std::string why;
    ASSERT_TRUE(cohort::data::read_jpeg_coefficients(files[i], "f.jpg", &batch[i], &why)) << why;
  }
  cohort::data::DeviceJpegDecoder dec;
  const cohort::cuda::Stream s = cohort::cuda::Stream::compute();
  for (int round = 0; round < 2; ++round) {  // the second reuses the buffers
    const auto out = dec.decode(batch, s);
    s.synchronize();
    ASSERT_EQ(out.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const cohort::data::Image want = cohort::data::decode_coefficients_on_host(batch[i]);
      std::vector<uint8_t> got(want.data.size());
      cohort::cuda::copy_to_host(got.data(), out[i].pixels, got.size(), s);
      s.synchronize();
      ASSERT_EQ(got, want.data) << "image " << i << " round " << round;
    }
  }
}

}  // namespace
