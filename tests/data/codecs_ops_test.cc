#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "cohort/core/rng.h"
#include "cohort/data/image.h"
#include "cohort/data/ops.h"

using namespace cohort::data;

namespace {

Image pattern(int w, int h, int c, int bits) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = c;
  img.bits = bits;
  img.data.resize(img.row_bytes() * h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k) {
        size_t i = (static_cast<size_t>(y) * w + x) * c + k;
        int v = (x * 7 + y * 3 + k * 50) % 256;
        if (bits == 8) {
          img.data[i] = static_cast<uint8_t>(v);
        } else {
          uint16_t s = static_cast<uint16_t>(v * 257 + x);
          std::memcpy(&img.data[2 * i], &s, 2);
        }
      }
    }
  }
  return img;
}

}  // namespace

TEST(Codecs, PngRoundTripIsExactFor8And16BitGrayAndRgb) {
  for (int bits : {8, 16}) {
    for (int c : {1, 3}) {
      Image img = pattern(37, 23, c, bits);
      auto png = encode_png(img);
      EXPECT_EQ(sniff(png.data(), png.size()), Format::png);
      Image back = decode(png, "round-trip.png");
      ASSERT_EQ(back.width, 37);
      ASSERT_EQ(back.height, 23);
      ASSERT_EQ(back.channels, c);
      ASSERT_EQ(back.bits, bits);
      EXPECT_EQ(back.data, img.data) << bits << "-bit, " << c << " channels";
    }
  }
}

TEST(Codecs, JpegDecodedTwoWaysAgrees) {
  Image img = pattern(64, 48, 3, 8);
  auto jpg = encode_jpeg(img, 95);
  Image ours = decode(jpg, "a.jpg");
  // The same file through libjpeg-turbo's API directly.
  tjhandle h = tjInitDecompress();
  std::vector<uint8_t> ref(64 * 48 * 3);
  ASSERT_EQ(
      tjDecompress2(h, jpg.data(), jpg.size(), ref.data(), 64, 0, 48, TJPF_RGB, TJFLAG_FASTDCT), 0);
  tjDestroy(h);
  EXPECT_EQ(ours.data, ref);
  // And, for a smooth image, close to the original pixels.
  Image smooth = pattern(64, 48, 3, 8);
  for (int y = 0; y < 48; ++y) {
    for (int x = 0; x < 64; ++x) {
      for (int k = 0; k < 3; ++k)
        smooth.data[(y * 64 + x) * 3 + k] = static_cast<uint8_t>(x * 2 + y + 40);
    }
  }
  Image back = decode(encode_jpeg(smooth, 95), "smooth.jpg");
  double err = 0;
  for (size_t i = 0; i < smooth.data.size(); ++i)
    err += std::abs(int(smooth.data[i]) - int(back.data[i]));
  EXPECT_LT(err / smooth.data.size(), 2.0);
  // DCT-domain downscaling halves both sides.
  Image half = decode(jpg, "a.jpg", 4);
  EXPECT_EQ(half.width, 32);
  EXPECT_EQ(half.height, 24);
  EXPECT_EQ(jpeg_scale_for(500, 375, 224), 5);  // 5/8 keeps 312 x 234 >= 224
  EXPECT_EQ(jpeg_scale_for(100, 100, 224), 8);
}

// A region decoded alone has the pixels the whole decode has there: at every DCT scale, for
// colour with chroma subsampling and for grey, for regions at the edges and inside, with both
// inverse DCTs. And a truncated file is an error naming it, as for the whole decode.
TEST(Codecs, JpegRegionsMatchTheWholeDecode) {
  for (int c : {3, 1}) {
    Image img = pattern(500, 375, c, 8);
    for (int y = 0; y < 375; ++y) {  // some texture, so that blocks differ
      for (int x = 0; x < 500; ++x) {
        for (int k = 0; k < c; ++k) {
          auto& v = img.data[(static_cast<size_t>(y) * 500 + x) * c + k];
          v = static_cast<uint8_t>((v + ((x / 13) ^ (y / 7)) * 5) & 255);
        }
      }
    }
    const auto jpg = encode_jpeg(img, 85);
    for (Idct idct : {Idct::fast, Idct::accurate}) {
      for (int e : {8, 5, 4, 2}) {
        const Image whole = decode(jpg, "w.jpg", e, idct);
        for (PixelRegion r : {PixelRegion{0, 0, 500, 375}, PixelRegion{123, 77, 201, 150},
                              PixelRegion{350, 260, 150, 115}, PixelRegion{0, 300, 40, 75},
                              PixelRegion{499, 374, 1, 1}}) {
          PixelRegion at;
          const Image part = decode_jpeg_region(jpg, "r.jpg", e, idct, r, &at);
          ASSERT_EQ(part.channels, c);
          // The part covers the region, scaled, and has the whole decode's pixels there.
          const double sx = static_cast<double>(whole.width) / 500;
          const double sy = static_cast<double>(whole.height) / 375;
          const int x0 = static_cast<int>(r.x * sx), y0 = static_cast<int>(r.y * sy);
          const int x1 = std::min(whole.width, static_cast<int>(std::ceil((r.x + r.w) * sx)));
          const int y1 = std::min(whole.height, static_cast<int>(std::ceil((r.y + r.h) * sy)));
          ASSERT_LE(at.x, x0);
          ASSERT_LE(at.y, y0);
          ASSERT_GE(at.x + part.width, x1);
          ASSERT_GE(at.y + part.height, y1);
          int differ = 0;
          for (int y = y0; y < y1; ++y) {
            for (int x = x0; x < x1; ++x) {
              for (int k = 0; k < c; ++k) {
                differ += part.at(x - at.x, y - at.y, k) != whole.at(x, y, k);
              }
            }
          }
          EXPECT_EQ(differ, 0) << c << " channels, scale " << e << "/8, region " << r.x << ","
                               << r.y << " " << r.w << "x" << r.h;
        }
      }
    }
    std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() * 2 / 3));
    PixelRegion at;
    try {
      decode_jpeg_region(cut, "bad/cut.jpg", 8, Idct::fast, PixelRegion{0, 300, 500, 75}, &at);
      FAIL() << "decoded the rows a truncated file does not have";
    } catch (const DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find("bad/cut.jpg"), std::string::npos) << e.what();
    }
  }
}

TEST(Codecs, CorruptTruncatedAndEmptyInputsAreErrorsNamingTheFile) {
  Image img = pattern(64, 48, 3, 8);
  auto jpg = encode_jpeg(img, 90);
  std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2));
  std::vector<uint8_t> empty;
  std::vector<uint8_t> junk(100, 0x42);
  auto png = encode_png(img);
  std::vector<uint8_t> png_cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  for (auto* bytes : {&cut, &empty, &junk, &png_cut}) {
    try {
      decode(*bytes, "bad/file.jpg");
      FAIL() << "decoded a broken file of " << bytes->size() << " bytes";
    } catch (const DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find("bad/file.jpg"), std::string::npos) << e.what();
    }
  }
}

// Every committed fuzz_image input (fuzz/corpus/image: the seeds, and the inputs that once
// aborted the process inside GDCM or asked for a 6 GB buffer) goes through the decoders as the
// fuzz target drives them: each is decoded or refused with an error naming it, in this build
// too, without the fuzzer (a regression aborts this test binary).
TEST(Codecs, CommittedFuzzInputsAreDecodedOrRefusedNamingTheFile) {
  const std::filesystem::path dir = std::filesystem::path(COHORT_SOURCE_DIR) / "fuzz/corpus/image";
  int decoded = 0, refused = 0, regressions = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::vector<uint8_t> all = read_file(e.path().string());
    ASSERT_GE(all.size(), 2u) << e.path();
    const uint8_t mode = all[0];
    const std::span<const uint8_t> bytes(all.data() + 1, all.size() - 1);
    const bool regression = e.path().filename().string().rfind("regress-", 0) == 0;
    regressions += regression;
    try {
      const ImageInfo info = probe(bytes, e.path().string());
      Image img = mode % 3 == 1
                      ? decode(bytes, e.path().string(), 1 + (mode / 3) % 8, Idct::accurate)
                      : decode(bytes, e.path().string());
      EXPECT_GT(img.width, 0);
      if (info.format == Format::jpeg && mode % 3 == 2) {
        PixelRegion origin;
        decode_jpeg_region(bytes, e.path().string(), 8, Idct::fast,
                           {info.width / 4, info.height / 4, std::max(1, info.width / 2),
                            std::max(1, info.height / 2)},
                           &origin);
      }
      ++decoded;
      EXPECT_FALSE(regression) << e.path() << " decoded";
    } catch (const cohort::Error& err) {
      ++refused;
      EXPECT_NE(std::string(err.what()).find(e.path().string()), std::string::npos) << err.what();
    }
  }
  EXPECT_GE(decoded, 10) << "the seeds (one per kind of image) decode";
  EXPECT_GE(regressions, 6);
  EXPECT_EQ(refused, regressions) << "only the malformed inputs are refused";
}

TEST(Ops, ResizeOfAConstantIsConstant) {
  Image img = pattern(50, 40, 1, 8);
  std::fill(img.data.begin(), img.data.end(), 77);
  std::vector<float> out(17 * 13);
  resize_crop(img, {3.5, 2.0, 41.0, 30.0}, 17, 13, out.data());
  for (float v : out) EXPECT_NEAR(v, 77.f, 1e-3);
  std::vector<float> up(90 * 70);
  resize_crop(img, {0, 0, 50, 40}, 90, 70, up.data());
  for (float v : up) EXPECT_NEAR(v, 77.f, 1e-3);
}

TEST(Ops, BilinearByHand) {
  Image img;
  img.width = 4;
  img.height = 1;
  img.channels = 1;
  img.data = {0, 10, 20, 30};
  // Shrinking 4 -> 2: triangle filter widened to support 2 (antialiasing).
  std::vector<float> out(2);
  resize_crop(img, {0, 0, 4, 1}, 2, 1, out.data());
  EXPECT_NEAR(out[0], (0 * 0.75 + 10 * 0.75 + 20 * 0.25) / 1.75, 1e-4);
  EXPECT_NEAR(out[1], (10 * 0.25 + 20 * 0.75 + 30 * 0.75) / 1.75, 1e-4);
  // Enlarging 2 -> 4: plain bilinear with half-pixel centres.
  Image two;
  two.width = 2;
  two.height = 1;
  two.channels = 1;
  two.data = {0, 10};
  std::vector<float> up(4);
  resize_crop(two, {0, 0, 2, 1}, 4, 1, up.data());
  EXPECT_NEAR(up[0], 0.f, 1e-5);
  EXPECT_NEAR(up[1], 2.5f, 1e-5);
  EXPECT_NEAR(up[2], 7.5f, 1e-5);
  EXPECT_NEAR(up[3], 10.f, 1e-5);
  // A crop resized to its own size is the crop itself.
  Image p = pattern(20, 10, 3, 8);
  std::vector<float> same(3 * 6 * 4);
  resize_crop(p, {5, 3, 6, 4}, 6, 4, same.data());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 6; ++x) EXPECT_FLOAT_EQ(same[(c * 4 + y) * 6 + x], p.at(x + 5, y + 3, c));
    }
  }
}

// The triangle filter of the resampler, written from its definition (support widened by the
// scale when shrinking, half-pixel centres, weights normalised over the pixels inside the crop's
// span of whole pixels), applied as one 2-D sum in double: the separable passes must agree with
// it in both directions, shrinking and enlarging, on every channel.
double triangle_2d(const Image& img, CropBox b, int ow, int oh, int c, int i, int j) {
  auto weights = [](double start, double len, int n, int out, int k) {
    const double scale = len / out, f = std::max(scale, 1.0);
    const double center = start + (k + 0.5) * scale;
    const double lo = std::max(0.0, std::floor(start)),
                 hi = std::min<double>(n, std::ceil(start + len));
    std::vector<std::pair<int, double>> w;
    double sum = 0;
    for (int x = static_cast<int>(lo); x < static_cast<int>(hi); ++x) {
      const double d = std::fabs((x + 0.5 - center) / f);
      if (d < 1.0) {
        w.emplace_back(x, 1.0 - d);
        sum += 1.0 - d;
      }
    }
    for (auto& [x, v] : w) v /= sum;
    return w;
  };
  double v = 0;
  for (auto [y, wy] : weights(b.y, b.h, img.height, oh, j)) {
    for (auto [x, wx] : weights(b.x, b.w, img.width, ow, i)) v += wy * wx * img.at(x, y, c);
  }
  return v;
}

TEST(Ops, SeparableResizeEqualsTheTwoDimensionalFilter) {
  for (const auto& [bits, C] : {std::pair{8, 1}, {8, 3}, {16, 1}, {16, 3}}) {
    Image img = pattern(97, 83, C, bits);
    cohort::CounterRng rng(static_cast<uint64_t>(bits * C));
    for (size_t i = 0; i < img.data.size(); ++i) img.data[i] = static_cast<uint8_t>(rng.below(256));
    struct Case {
      CropBox box;
      int w, h;
    };
    // Shrinking by 3.5 and 2.4 (taps in more than one vector of 4), enlarging, the same size.
    for (const Case& k : {Case{{5.25, 7.5, 80.0, 70.0}, 23, 29}, Case{{1, 2, 95, 80}, 40, 33},
                          Case{{10, 3, 17, 11}, 40, 31}, Case{{0, 0, 97, 83}, 97, 83}}) {
      std::vector<float> out(static_cast<size_t>(C) * k.w * k.h);
      resize_crop(img, k.box, k.w, k.h, out.data());
      double worst = 0;
      for (int c = 0; c < C; ++c) {
        for (int j = 0; j < k.h; ++j) {
          for (int i = 0; i < k.w; ++i) {
            const double want = triangle_2d(img, k.box, k.w, k.h, c, i, j);
            const double got = out[(static_cast<size_t>(c) * k.h + j) * k.w + i];
            worst = std::max(worst, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
          }
        }
      }
      EXPECT_LT(worst, 1e-5) << bits << "-bit, " << C << " channel(s), " << k.w << "x" << k.h;
    }
  }
}

// From rows given on demand, only the rows and columns the taps reach are asked for, each row
// once, and the output equals the resize of the whole image.
TEST(Ops, ResizeFromRowsAsksForEachRowOnce) {
  Image img = pattern(300, 200, 1, 16);
  const CropBox box{40.5, 60.25, 150, 90};
  std::vector<float> whole(64 * 48), from_rows(64 * 48);
  resize_crop(img, box, 64, 48, whole.data());
  std::vector<int> asked(200, 0);
  int lo_x = 300, hi_x = 0;
  RowSource src{300, 200, 1, 16, nullptr};
  src.row = [&](int y, int x0, int n, float* out) {
    ++asked[static_cast<size_t>(y)];
    lo_x = std::min(lo_x, x0);
    hi_x = std::max(hi_x, x0 + n);
    for (int x = 0; x < n; ++x) out[x] = img.at(x0 + x, y, 0);
  };
  resize_crop(src, box, 64, 48, from_rows.data());
  EXPECT_EQ(whole, from_rows);
  for (int y = 0; y < 200; ++y) {
    EXPECT_LE(asked[static_cast<size_t>(y)], 1) << "row " << y;
    // The crop spans rows 60.25..150.25, so the taps stay within rows 60..150.
    if (y < 60 || y > 150) {
      EXPECT_EQ(asked[static_cast<size_t>(y)], 0) << "row " << y;
    } else if (y >= 62 && y <= 148) {
      EXPECT_EQ(asked[static_cast<size_t>(y)], 1) << "row " << y;
    }
  }
  EXPECT_GE(lo_x, 40);  // the crop spans columns 40.5..190.5
  EXPECT_LE(hi_x, 191);
}

TEST(Ops, RandomResizedCropFollowsTorchvision) {
  for (uint64_t k = 0; k < 2000; ++k) {
    cohort::CounterRng rng(cohort::key3(1, 2, k));
    CropBox b = random_resized_crop_box(500, 375, rng);
    EXPECT_GE(b.x, 0);
    EXPECT_GE(b.y, 0);
    EXPECT_LE(b.x + b.w, 500);
    EXPECT_LE(b.y + b.h, 375);
    const double frac = b.w * b.h / (500.0 * 375.0);
    EXPECT_GE(frac, 0.08 * 0.95);
    EXPECT_LE(frac, 1.0);
  }
  // A very wide image makes every attempt fail: the fallback is a centred crop at ratio 4/3.
  cohort::CounterRng rng(7);
  CropBox f = random_resized_crop_box(1000, 10, rng, 0.99, 1.0);
  EXPECT_EQ(f.h, 10);
  EXPECT_EQ(f.w, 13);
  EXPECT_EQ(f.x, (1000 - 13) / 2);
  CropBox c = resize_center_crop_box(500, 375, 256, 224);
  EXPECT_NEAR(c.w, 224 * 375.0 / 256, 1e-9);
  EXPECT_NEAR(c.x, (500 - c.w) / 2, 1e-9);
}

TEST(Ops, FlipsAndJitter) {
  std::vector<float> p = {1, 2, 3, 4, 5, 6};  // 1 channel, 2 x 3
  flip_horizontal(p.data(), 1, 2, 3);
  EXPECT_EQ(p, (std::vector<float>{3, 2, 1, 6, 5, 4}));
  flip_vertical(p.data(), 1, 2, 3);
  EXPECT_EQ(p, (std::vector<float>{6, 5, 4, 3, 2, 1}));
  brightness_contrast(p.data(), 1, 2, 3, 1.0f, 2.0f);  // mean 3.5
  EXPECT_FLOAT_EQ(p[0], (6 - 3.5f) * 2 + 3.5f + 1);
}

TEST(Ops, RotationTurnsAboutTheCentreAndFillsCornersWithBlack) {
  // 1 channel, 4 x 4, value = 10 * row + column.
  std::vector<float> p(16), scratch;
  for (int i = 0; i < 16; ++i) p[i] = static_cast<float>(10 * (i / 4) + i % 4);
  std::vector<float> q = p;
  rotate(q.data(), 1, 4, 4, 0.0, scratch);
  EXPECT_EQ(q, p);
  // A quarter turn counter-clockwise: output (row y, column x) comes from (row x, column 3 - y).
  rotate(q.data(), 1, 4, 4, 90.0, scratch);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) EXPECT_NEAR(q[y * 4 + x], p[x * 4 + (3 - y)], 1e-4) << y << x;
  }
  // 45 degrees: the corners come from outside the image and are black; the centre stays.
  std::vector<float> ones(64, 1.f);
  rotate(ones.data(), 1, 8, 8, 45.0, scratch);
  EXPECT_EQ(ones[0], 0.f);
  EXPECT_EQ(ones[63], 0.f);
  EXPECT_NEAR(ones[3 * 8 + 3], 1.f, 1e-6);
}
