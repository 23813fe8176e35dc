// The mixed JPEG decoder's arithmetic (src/data/kernels/jpeg_math.h, what the GPU runs after the
// CPU's entropy decoding) on the host, against libjpeg-turbo's own decoding with its accurate
// IDCT: within 1 per sample (in fact equal), over grayscale, 4:4:4, 4:2:2 and 4:2:0, baseline and
// progressive, qualities 50 to 100, and sizes that are and are not whole MCUs. Files the device
// path does not take are named, with the reason.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cohort/data/image.h"
#include "cohort/data/jpeg_coefficients.h"

namespace {

using cohort::data::Image;

// Smooth gradients, a hard edge, fine stripes and noise: every frequency band gets work.
std::vector<uint8_t> test_pattern(int w, int h, int channels, uint32_t seed) {
  std::vector<uint8_t> p(size_t(w) * h * channels);
  uint32_t s = seed;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        s = s * 1664525u + 1013904223u;
        double v = 128 + 90 * std::sin(0.05 * x * (c + 1) + 0.03 * y) + ((x / 7 + y / 5) % 2) * 40 -
                   20 + (x > w / 2 ? 30 : -30) * (c == 1) + double(s >> 27) - 16;
        if ((x / 3) % 2 == 0 && y > h / 2) v += 50 * ((x + c) % 2);
        p[(size_t(y) * w + x) * channels + c] = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
      }
  return p;
}

std::vector<uint8_t> encode_with(const std::vector<uint8_t>& px, int w, int h, int channels,
                                 int sub, int quality, bool progressive) {
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  const int flags = TJFLAG_ACCURATEDCT | (progressive ? TJFLAG_PROGRESSIVE : 0);
  EXPECT_EQ(tjCompress2(t, px.data(), w, 0, h, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &len,
                        sub, quality, flags),
            0)
      << tjGetErrorStr2(t);
  std::vector<uint8_t> out(buf, buf + len);
  tjFree(buf);
  tjDestroy(t);
  return out;
}

Image libjpeg_decode(const std::vector<uint8_t>& jpeg, int w, int h, int channels) {
  tjhandle t = tjInitDecompress();
  Image img;
  img.width = w;
  img.height = h;
  img.channels = channels;
  img.data.resize(img.row_bytes() * h);
  EXPECT_EQ(tjDecompress2(t, jpeg.data(), jpeg.size(), img.data.data(), w, 0, h,
                          channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_ACCURATEDCT),
            0)
      << tjGetErrorStr2(t);
  tjDestroy(t);
  return img;
}

struct SampleDiff {
  int max = 0;
  std::map<int, size_t> counts;  // |difference| -> samples
};

SampleDiff sample_diff(const Image& a, const Image& b) {
  SampleDiff d;
  for (size_t i = 0; i < a.data.size(); ++i) {
    const int e = std::abs(int(a.data[i]) - int(b.data[i]));
    d.max = std::max(d.max, e);
    d.counts[e]++;
  }
  return d;
}

TEST(JpegMath, IdctUpsamplingAndColourMatchLibjpegTurboWithinOne) {
  const std::map<int, const char*> subs = {
      {TJSAMP_GRAY, "gray"}, {TJSAMP_444, "4:4:4"}, {TJSAMP_422, "4:2:2"}, {TJSAMP_420, "4:2:0"}};
  const int sizes[][2] = {{64, 48}, {37, 29}, {500, 375}, {17, 130}};
  size_t samples = 0, off_by_one = 0;
  for (auto [sub, sub_name] : subs) {
    const int channels = sub == TJSAMP_GRAY ? 1 : 3;
    for (auto& wh : sizes) {
      for (int quality : {50, 90, 100}) {
        for (bool progressive : {false, true}) {
          const int w = wh[0], h = wh[1];
          const auto px = test_pattern(w, h, channels, uint32_t(w * 31 + h + quality));
          const auto jpeg = encode_with(px, w, h, channels, sub, quality, progressive);
          cohort::data::JpegCoefficients coef;
          std::string why;
          ASSERT_TRUE(cohort::data::read_jpeg_coefficients(jpeg, "test.jpg", &coef, &why)) << why;
          const Image got = cohort::data::decode_coefficients_on_host(coef);
          const Image want = libjpeg_decode(jpeg, w, h, channels);
          ASSERT_EQ(got.data.size(), want.data.size());
          SampleDiff d = sample_diff(got, want);
          EXPECT_LE(d.max, 1) << sub_name << " " << w << "x" << h << " quality " << quality
                              << (progressive ? " progressive" : " baseline") << ": " << d.counts[2]
                              << " samples off by 2, " << d.counts[1] << " by 1";
          samples += got.data.size();
          off_by_one += d.counts[1];
        }
      }
    }
  }
  // Within 1 is the promise; the same integer arithmetic makes it exact (Debian 12's
  // libjpeg-turbo 2.1.5: 0 of 11.6 million samples differ).
  EXPECT_EQ(off_by_one, 0u) << off_by_one << " of " << samples << " samples off by 1";
}

TEST(JpegMath, LayoutsTheDevicePathDoesNotTakeAreNamed) {
  const auto px = test_pattern(32, 32, 3, 7);
  const auto jpeg = encode_with(px, 32, 32, 3, TJSAMP_411, 90, false);
  cohort::data::JpegCoefficients coef;
  std::string why;
  EXPECT_FALSE(cohort::data::read_jpeg_coefficients(jpeg, "a.jpg", &coef, &why));
  EXPECT_NE(why.find("sampling 1x1 in component 1 of 4x1"), std::string::npos) << why;  // 4:1:1
  // A corrupt file is a DecodeError naming it.
  auto broken = jpeg;
  broken.resize(broken.size() / 3);
  try {
    cohort::data::read_jpeg_coefficients(broken, "broken.jpg", &coef, &why);
    FAIL() << "a truncated file was read";
  } catch (const cohort::data::DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.jpg: JPEG decode failed"), std::string::npos)
        << e.what();
  }
}

}  // namespace
