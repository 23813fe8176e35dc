#include "cohort/data/dicom.h"
#include "cohort/data/pipeline.h"
#include "cohort/data/source.h"

#include <gdcmImageChangePhotometricInterpretation.h>
#include <gdcmImageChangeTransferSyntax.h>
#include <gdcmImageReader.h>
#include <gdcmImageWriter.h>
#include <gdcmReader.h>
#include <gdcmWriter.h>
#include <gtest/gtest.h>
#include <unistd.h>

// jpeglib.h needs FILE and size_t declared first; it has a block of its own, since
// clang-format sorts the includes within a block.
#include <cstdio>
#include <cstdlib>

#include <jpeglib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

using namespace cohort::data;

namespace {

// An image of w x h, its samples zero.
Image blank(int w, int h, int channels, int bits) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = channels;
  img.bits = bits;
  img.data.resize(static_cast<size_t>(w) * h * channels * (bits / 8));
  return img;
}

Image stored16(int w, int h, int lo, int hi) {
  Image img = blank(w, h, 1, 16);
  for (int i = 0; i < w * h; ++i) {
    int16_t v = static_cast<int16_t>(lo + (static_cast<long>(hi - lo) * i) / (w * h - 1));
    std::memcpy(&img.data[2 * static_cast<size_t>(i)], &v, 2);
  }
  return img;
}

uint16_t pixel(const Image& img, int i) {
  uint16_t u;
  std::memcpy(&u, &img.data[2 * static_cast<size_t>(i)], 2);
  return u;
}

int16_t stored(const Image& img, int i) {
  int16_t s;
  std::memcpy(&s, &img.data[2 * static_cast<size_t>(i)], 2);
  return s;
}

}  // namespace

TEST(Dicom, LinearVoiFunctionOfPs3_3) {
  Window w{40, 400};
  EXPECT_EQ(voi_linear(-160, w), 0.0);   // x <= c - 0.5 - (w-1)/2
  EXPECT_EQ(voi_linear(239.5, w), 1.0);  // x >  c - 0.5 + (w-1)/2
  EXPECT_NEAR(voi_linear(39.5, w), 0.5, 1e-12);
  EXPECT_NEAR(voi_linear(139.0, w), (139.0 - 39.5) / 399.0 + 0.5, 1e-12);
}

TEST(Dicom, SignedRescaledAndWindowedAsTheFormulaSays) {
  Image src = stored16(40, 30, -2000, 3000);
  DicomWriteOptions o;
  o.bits_stored = 16;
  o.is_signed = true;
  o.slope = 2.0;
  o.intercept = -10;
  o.window = Window{300, 1500};
  auto bytes = encode_dicom(src, o);
  EXPECT_EQ(sniff(bytes.data(), bytes.size()), Format::dicom);
  Image img = decode_dicom(bytes, "signed.dcm");
  ASSERT_EQ(img.width, 40);
  ASSERT_EQ(img.height, 30);
  for (int i = 0; i < 40 * 30; ++i) {
    double x = stored(src, i) * 2.0 - 10;
    ASSERT_EQ(pixel(img, i), std::lround(voi_linear(x, {300, 1500}) * 65535)) << "pixel " << i;
  }
  // What GDCM itself reads back is the stored values we wrote.
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  gdcm::ImageReader r;
  r.SetStream(in);
  ASSERT_TRUE(r.Read());
  std::vector<char> raw(r.GetImage().GetBufferLength());
  r.GetImage().GetBuffer(raw.data());
  EXPECT_EQ(std::memcmp(raw.data(), src.data.data(), src.data.size()), 0);
  EXPECT_DOUBLE_EQ(r.GetImage().GetSlope(), 2.0);
  // A window from the configuration wins over the file's.
  Image narrow = decode_dicom(bytes, "signed.dcm", Window{0, 100});
  EXPECT_EQ(pixel(narrow, 0), 0);
  EXPECT_EQ(pixel(narrow, 40 * 30 - 1), 65535);
}

TEST(Dicom, Monochrome1IsInvertedAndTwelveBitWithoutWindowUsesFullRange) {
  Image src = stored16(16, 16, 0, 4095);
  DicomWriteOptions o;
  o.bits_stored = 12;
  o.monochrome1 = true;
  Image img = decode_dicom(encode_dicom(src, o), "mono1.dcm");
  EXPECT_EQ(pixel(img, 0), 65535);  // the lowest value is white in MONOCHROME1
  EXPECT_EQ(pixel(img, 16 * 16 - 1), 0);
  o.monochrome1 = false;
  Image m2 = decode_dicom(encode_dicom(src, o), "mono2.dcm");
  for (int i = 0; i < 256; ++i) EXPECT_EQ(pixel(m2, i), 65535 - pixel(img, i));
}

TEST(Dicom, EightBitUnsigned) {
  Image src;
  src.width = 8;
  src.height = 2;
  src.channels = 1;
  src.bits = 8;
  for (int i = 0; i < 16; ++i) src.data.push_back(static_cast<uint8_t>(i * 16));
  DicomWriteOptions o;
  o.bits_stored = 8;
  o.window = Window{128, 256};
  Image img = decode_dicom(encode_dicom(src, o), "u8.dcm");
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(pixel(img, i), std::lround(voi_linear(i * 16, {128, 256}) * 65535));
  }
}

namespace {

// `file` read by GDCM's reader `R`, changed by `edit` (false: a failure), and written back by
// `W` (empty on a failure).
template <class R, class W>
std::vector<uint8_t> through_gdcm(const std::vector<uint8_t>& file,
                                  const std::function<bool(R&, W&)>& edit) {
  std::istringstream in(std::string(file.begin(), file.end()));
  R r;
  r.SetStream(in);
  if (!r.Read()) return {};
  W w;
  w.SetFile(r.GetFile());
  if (!edit(r, w)) return {};
  std::ostringstream os;
  w.SetStream(os);
  if (!w.Write()) return {};
  const std::string s = os.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

// `file` read as a plain data set, changed by `edit`, and written back (empty on failure).
std::vector<uint8_t> rewritten(const std::vector<uint8_t>& file,
                               const std::function<void(gdcm::File&)>& edit) {
  return through_gdcm<gdcm::Reader, gdcm::Writer>(file, [&](gdcm::Reader& r, gdcm::Writer&) {
    edit(r.GetFile());
    return true;
  });
}

// The file again, its image passed through one of GDCM's image filters (already configured);
// empty on a failure.
template <class Filter>
std::vector<uint8_t> filtered(const std::vector<uint8_t>& plain, Filter& change) {
  return through_gdcm<gdcm::ImageReader, gdcm::ImageWriter>(
      plain, [&](gdcm::ImageReader& r, gdcm::ImageWriter& w) {
        change.SetInput(r.GetImage());
        if (!change.Change()) return false;
        w.SetImage(change.GetOutput());
        return true;
      });
}

// The same image re-encoded by GDCM in another transfer syntax.
std::vector<uint8_t> transcode(const std::vector<uint8_t>& plain, const gdcm::TransferSyntax& ts) {
  gdcm::ImageChangeTransferSyntax change;
  change.SetTransferSyntax(ts);
  return filtered(plain, change);
}

}  // namespace

// Native pixel data is read in place (explicit and implicit VR little endian); other transfer
// syntaxes go through GDCM's decoder: all give the same pixels, also with bits above BitsStored
// set (overlay bits, which are masked), signed and windowless.
TEST(Dicom, NativeAndDecodedPathsAgreeOnEveryTransferSyntax) {
  for (bool is_signed : {false, true}) {
    Image src = stored16(40, 30, is_signed ? -2000 : 0, is_signed ? 2000 : 4000);
    if (!is_signed) {  // set the top bits of some 12-bit values: they are not part of the value
      for (size_t i = 0; i < src.data.size(); i += 14) src.data[i + 1] |= 0xf0;
    }
    DicomWriteOptions o;
    o.bits_stored = 12;
    o.is_signed = is_signed;
    if (is_signed) {
      for (size_t i = 0; i + 1 < src.data.size(); i += 2) {  // 12-bit two's complement
        int16_t v;
        std::memcpy(&v, &src.data[i], 2);
        const uint16_t u = static_cast<uint16_t>(v) & 0x0fff;
        std::memcpy(&src.data[i], &u, 2);
      }
    }
    const auto plain = encode_dicom(src, o);
    const Image want = decode_dicom(plain, "plain.dcm");
    for (const auto& ts :
         {gdcm::TransferSyntax::ImplicitVRLittleEndian, gdcm::TransferSyntax::RLELossless,
          gdcm::TransferSyntax::JPEGLSLossless}) {
      const auto other = transcode(plain, ts);
      ASSERT_FALSE(other.empty()) << ts;
      EXPECT_EQ(decode_dicom(other, "other.dcm").data, want.data) << ts << " signed " << is_signed;
    }
    // And the values are the formula's: the lowest stored value black, the highest white.
    uint16_t lo = 65535, hi = 0;
    for (int i = 0; i < 40 * 30; ++i)
      lo = std::min(lo, pixel(want, i)), hi = std::max(hi, pixel(want, i));
    EXPECT_EQ(lo, 0);
    EXPECT_EQ(hi, 65535);
  }
}

// Colour DICOM (ultrasound, dermatology, secondary captures): 8-bit RGB, interleaved or planar,
// native or through GDCM's decoders, comes back as the same interleaved RGB; a region is that
// rectangle; probing says 3 channels.
TEST(Dicom, RgbInterleavedAndPlanarDecodeToTheSamePixels) {
  Image src = blank(40, 30, 3, 8);
  for (size_t i = 0; i < src.data.size(); ++i) src.data[i] = static_cast<uint8_t>((i * 37) % 251);
  for (bool planar : {false, true}) {
    DicomWriteOptions o;
    o.planar = planar;
    const auto file = encode_dicom(src, o);
    EXPECT_EQ(probe(file, "rgb.dcm").channels, 3);
    const Image got = decode_dicom(file, "rgb.dcm");
    ASSERT_EQ(got.channels, 3);
    ASSERT_EQ(got.bits, 8);
    EXPECT_EQ(got.data, src.data) << "planar " << planar;
    // Rows on demand (the pipeline's crops) are the same pixels.
    const DicomPixels pixels(file, "rgb.dcm");
    const RowSource rows = pixels.rows(std::nullopt);
    ASSERT_EQ(rows.channels, 3);
    std::vector<float> row(10 * 3);
    for (int y = 4; y < 11; ++y) {
      rows.row(y, 5, 10, row.data());
      for (int x = 0; x < 10; ++x) {
        for (int c = 0; c < 3; ++c) ASSERT_EQ(row[3 * x + c], src.at(5 + x, y, c));
      }
    }
    for (const auto& ts :
         {gdcm::TransferSyntax::ImplicitVRLittleEndian, gdcm::TransferSyntax::RLELossless}) {
      const auto other = transcode(file, ts);
      ASSERT_FALSE(other.empty()) << ts;
      EXPECT_EQ(decode_dicom(other, "other.dcm").data, src.data) << ts << " planar " << planar;
    }
  }
  // The same pixels as YBR_FULL (GDCM converts them): back to RGB within rounding.
  gdcm::ImageChangePhotometricInterpretation to_ybr;
  to_ybr.SetPhotometricInterpretation(gdcm::PhotometricInterpretation::YBR_FULL);
  const auto ybr = filtered(encode_dicom(src, DicomWriteOptions{}), to_ybr);
  ASSERT_NE(std::string(ybr.begin(), ybr.end()).find("YBR_FULL"), std::string::npos);
  const Image back = decode_dicom(ybr, "ybr.dcm");
  ASSERT_EQ(back.data.size(), src.data.size());
  int worst = 0;
  for (size_t i = 0; i < src.data.size(); ++i)
    worst = std::max(worst, std::abs(int(back.data[i]) - int(src.data[i])));
  EXPECT_LE(worst, 3);
}

// A DICOM image of `bits` bits allocated, written by GDCM from raw bytes as they are stored.
std::vector<uint8_t> raw_dicom(
    int w, int h, unsigned short bits, const std::vector<uint8_t>& data, gdcm::TransferSyntax ts,
    unsigned short samples = 1,
    gdcm::PhotometricInterpretation::PIType pi = gdcm::PhotometricInterpretation::MONOCHROME2) {
  gdcm::SmartPointer<gdcm::Image> im = new gdcm::Image;
  im->SetNumberOfDimensions(2);
  im->SetDimension(0, static_cast<unsigned>(w));
  im->SetDimension(1, static_cast<unsigned>(h));
  im->SetPixelFormat(
      gdcm::PixelFormat(samples, bits, bits, static_cast<unsigned short>(bits - 1), 0));
  im->SetPhotometricInterpretation(pi);
  im->SetTransferSyntax(ts);
  gdcm::DataElement pixel(gdcm::Tag(0x7fe0, 0x0010));
  pixel.SetByteValue(reinterpret_cast<const char*>(data.data()),
                     static_cast<uint32_t>(data.size()));
  im->SetDataElement(pixel);
  gdcm::ImageWriter wr;
  wr.SetImage(*im);
  std::ostringstream os;
  wr.SetStream(os);
  if (!wr.Write()) return {};
  const std::string s = os.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

// 16-bit RGB (scaled to 8 bits) and native YBR_FULL_422 (two pixels share their chroma; GDCM
// expands it) decode to the RGB they were made from.
TEST(Dicom, SixteenBitColourAndYbrFull422Decode) {
  const int w = 8, h = 6;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {  // each horizontal pair one colour, so 4:2:2 loses nothing
      for (int c = 0; c < 3; ++c) {
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x / 2 * 61 + y * 37 + c * 89) % 256);
      }
    }
  }
  std::vector<uint8_t> wide(rgb.size() * 2);
  for (size_t i = 0; i < rgb.size(); ++i) {
    const uint16_t v = static_cast<uint16_t>(rgb[i] * 257);
    std::memcpy(wide.data() + 2 * i, &v, 2);
  }
  const auto file16 = raw_dicom(w, h, 16, wide, gdcm::TransferSyntax::ExplicitVRLittleEndian, 3,
                                gdcm::PhotometricInterpretation::RGB);
  ASSERT_FALSE(file16.empty());
  const Image got16 = decode_dicom(file16, "rgb16.dcm");
  ASSERT_EQ(got16.channels, 3);
  ASSERT_EQ(got16.bits, 8);
  EXPECT_EQ(got16.data, rgb) << "16-bit RGB scaled to 8 bits";

  // Y, Cb, Cr of PS3.3 C.7.6.3.1.2 (YBR_FULL), stored as Y1 Y2 Cb Cr per pair.
  std::vector<uint8_t> stored;
  for (size_t p = 0; p < rgb.size() / 3; p += 2) {
    const double r = rgb[p * 3], g = rgb[p * 3 + 1], b = rgb[p * 3 + 2];
    auto q = [](double v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); };
    const uint8_t y = q(0.299 * r + 0.587 * g + 0.114 * b);
    stored.insert(stored.end(), {y, y, q(-0.168736 * r - 0.331264 * g + 0.5 * b + 128),
                                 q(0.5 * r - 0.418688 * g - 0.081312 * b + 128)});
  }
  const auto file422 = raw_dicom(w, h, 8, stored, gdcm::TransferSyntax::ExplicitVRLittleEndian, 3,
                                 gdcm::PhotometricInterpretation::YBR_FULL_422);
  ASSERT_FALSE(file422.empty());
  const Image got422 = decode_dicom(file422, "ybr422.dcm");
  ASSERT_EQ(got422.data.size(), rgb.size());
  int worst = 0;
  for (size_t i = 0; i < rgb.size(); ++i)
    worst = std::max(worst, std::abs(int(got422.data[i]) - int(rgb[i])));
  EXPECT_LE(worst, 3) << "YBR_FULL_422 back to RGB";
  // Lossy JPEG (baseline) as GDCM writes it: labelled RGB, its stream YCbCr, which GDCM hands
  // out unconverted ("DICOM says RGB but JPEG says 3"): converted here. A smooth image of
  // distinct colours, so that the loss is small and a wrong colour space is not.
  Image src = blank(32, 32, 3, 8);
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 32; ++x) {
      const uint8_t v[3] = {static_cast<uint8_t>(200 - 3 * x), static_cast<uint8_t>(20 + 4 * y),
                            static_cast<uint8_t>(60 + 2 * x + y)};
      std::memcpy(&src.data[(static_cast<size_t>(y) * 32 + x) * 3], v, 3);
    }
  }
  const auto jpeg =
      transcode(encode_dicom(src, DicomWriteOptions{}), gdcm::TransferSyntax::JPEGBaselineProcess1);
  ASSERT_FALSE(jpeg.empty());
  const Image got_jpeg = decode_dicom(jpeg, "jpeg422.dcm");
  ASSERT_EQ(got_jpeg.data.size(), src.data.size());
  double err = 0;
  for (size_t i = 0; i < src.data.size(); ++i)
    err += std::abs(int(got_jpeg.data[i]) - int(src.data[i]));
  EXPECT_LT(err / static_cast<double>(src.data.size()), 4) << "lossy JPEG far from its RGB";
  // Half the pixel data of a 4:2:2 image is an error naming the file, as for any short image.
  const auto cut = raw_dicom(w, h, 8, std::vector<uint8_t>(stored.begin(), stored.begin() + 40),
                             gdcm::TransferSyntax::ExplicitVRLittleEndian, 3,
                             gdcm::PhotometricInterpretation::YBR_FULL_422);
  try {
    decode_dicom(cut, "short422.dcm");
    ADD_FAILURE() << "a short 4:2:2 image decoded";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("short422.dcm"), std::string::npos) << e.what();
  }
}

namespace {

// `plain` with its pixel data replaced by one fragment holding `frame` (another encoder's than
// GDCM's), under transfer syntax `ts`.
std::vector<uint8_t> encapsulated(const std::vector<uint8_t>& plain, const gdcm::TransferSyntax& ts,
                                  std::vector<uint8_t> frame) {
  if (frame.size() % 2) frame.push_back(0);
  gdcm::Fragment fragment;
  fragment.SetByteValue(reinterpret_cast<const char*>(frame.data()),
                        static_cast<uint32_t>(frame.size()));
  gdcm::SmartPointer<gdcm::SequenceOfFragments> fragments = new gdcm::SequenceOfFragments;
  fragments->AddFragment(fragment);
  gdcm::DataElement pixels(gdcm::Tag(0x7fe0, 0x0010));
  pixels.SetValue(*fragments);
  pixels.SetVLToUndefined();  // before the VR: GDCM asserts on an undefined length for OB
  pixels.SetVR(gdcm::VR::OB);
  return rewritten(plain, [&](gdcm::File& f) {
    f.GetDataSet().Replace(pixels);
    f.GetHeader().SetDataSetTransferSyntax(ts);
  });
}

// DICOM RLE Lossless (PS3.5 Annex G) of samples of `bytes` bytes, written from the standard: one
// segment per byte of each sample, the most significant first, each PackBits (runs of a repeated
// byte, and literal runs).
std::vector<uint8_t> rle_frame(const std::vector<uint32_t>& values, int samples, int bytes) {
  std::vector<uint8_t> out(64, 0);
  const size_t pixels = values.size() / static_cast<size_t>(samples);
  uint32_t count = static_cast<uint32_t>(samples * bytes);
  std::memcpy(out.data(), &count, 4);
  for (uint32_t k = 0; k < count; ++k) {
    const uint32_t at = static_cast<uint32_t>(out.size());
    std::memcpy(out.data() + 4 + 4 * k, &at, 4);
    std::vector<uint8_t> seg(pixels);
    for (size_t p = 0; p < pixels; ++p) {
      seg[p] =
          static_cast<uint8_t>(values[p * samples + k / bytes] >> (8 * (bytes - 1 - k % bytes)));
    }
    for (size_t i = 0; i < pixels;) {
      size_t run = 1;
      while (i + run < pixels && run < 128 && seg[i + run] == seg[i]) ++run;
      if (run >= 2) {
        out.push_back(static_cast<uint8_t>(static_cast<int8_t>(1 - static_cast<int>(run))));
        out.push_back(seg[i]);
        i += run;
        continue;
      }
      size_t lit = 1;
      while (i + lit < pixels && lit < 128 &&
             !(i + lit + 1 < pixels && seg[i + lit] == seg[i + lit + 1])) {
        ++lit;
      }
      out.push_back(static_cast<uint8_t>(lit - 1));
      out.insert(out.end(), seg.begin() + static_cast<long>(i),
                 seg.begin() + static_cast<long>(i + lit));
      i += lit;
    }
    if (out.size() % 2) out.push_back(0);
  }
  return out;
}

// A baseline JPEG of RGB samples stored as they are (no colour transform), with no JFIF or
// Adobe marker and component ids 0, 1, 2, as in pydicom's SC_jpeg_no_color_transform.dcm.
std::vector<uint8_t> rgb_jpeg_without_markers(const Image& src) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &mem, &size);
  c.image_width = static_cast<JDIMENSION>(src.width);
  c.image_height = static_cast<JDIMENSION>(src.height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, JCS_RGB);
  jpeg_set_quality(&c, 98, TRUE);
  c.write_JFIF_header = FALSE;
  c.write_Adobe_marker = FALSE;
  for (int i = 0; i < 3; ++i) c.comp_info[i].component_id = i;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(src.data.data() + c.next_scanline * src.row_bytes());
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::vector<uint8_t> out(mem, mem + size);
  std::free(mem);
  return out;
}

}  // namespace

// Two colour cases GDCM 3.0 decodes wrongly, from files written by other encoders than GDCM's:
// 16-bit RGB in RLE (GDCM places the segments rotated by three bytes; Cohort decodes RLE colour
// of 16 bits itself), and a JPEG labelled RGB whose stream holds RGB without saying so (libjpeg
// would take it for YCbCr; the label is kept). Both checked against pydicom on its test files.
TEST(Dicom, ColourFromOtherEncodersDecodes) {
  const int w = 7, h = 5;
  std::vector<uint32_t> values(static_cast<size_t>(w) * h * 3), values32(values.size());
  std::vector<uint8_t> wide(values.size() * 2), wide32(values.size() * 4), want(values.size()),
      want32(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    // Distinct high and low bytes per channel, and runs along each row (both kinds of run).
    const size_t p = i / 3, c = i % 3;
    values[i] = (0x1000 * (c * 5 + 1) + 0x0101 * ((p % w) / 3) + 0x2200 * (p / w)) & 0xffff;
    const uint16_t v16 = static_cast<uint16_t>(values[i]);
    std::memcpy(wide.data() + 2 * i, &v16, 2);
    want[i] = static_cast<uint8_t>((values[i] * 255u + 65535 / 2) / 65535);
    values32[i] = values[i] << 16 | (values[i] ^ 0x5a5a);
    std::memcpy(wide32.data() + 4 * i, &values32[i], 4);
    want32[i] = static_cast<uint8_t>((values32[i] * 255ull + 0xffffffffull / 2) / 0xffffffffull);
  }
  const auto plain = raw_dicom(w, h, 16, wide, gdcm::TransferSyntax::ExplicitVRLittleEndian, 3,
                               gdcm::PhotometricInterpretation::RGB);
  const auto rle = encapsulated(plain, gdcm::TransferSyntax::RLELossless, rle_frame(values, 3, 2));
  ASSERT_FALSE(rle.empty());
  const Image got = decode_dicom(rle, "rle16.dcm");
  ASSERT_EQ(got.channels, 3);
  EXPECT_EQ(got.data, want) << "16-bit RGB in RLE";
  // 32-bit RGB, native and in RLE (scaled to 8 bits as 16-bit is).
  const auto plain32 = raw_dicom(w, h, 32, wide32, gdcm::TransferSyntax::ExplicitVRLittleEndian, 3,
                                 gdcm::PhotometricInterpretation::RGB);
  ASSERT_FALSE(plain32.empty());
  EXPECT_EQ(decode_dicom(plain32, "rgb32.dcm").data, want32) << "32-bit RGB";
  const auto rle32 =
      encapsulated(plain32, gdcm::TransferSyntax::RLELossless, rle_frame(values32, 3, 4));
  EXPECT_EQ(decode_dicom(rle32, "rle32.dcm").data, want32) << "32-bit RGB in RLE";
  // A segment cut short is an error naming the file.
  auto short_frame = rle_frame(values, 3, 2);
  short_frame.resize(short_frame.size() - 8);
  try {
    decode_dicom(encapsulated(plain, gdcm::TransferSyntax::RLELossless, short_frame), "cut.dcm");
    ADD_FAILURE() << "a cut RLE frame decoded";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.dcm"), std::string::npos) << e.what();
  }

  Image src = blank(24, 16, 3, 8);
  for (size_t i = 0; i < src.data.size(); ++i) {
    src.data[i] = static_cast<uint8_t>(i % 3 == 0 ? 220 : i % 3 == 1 ? 40 + (i / 3) % 24 * 4 : 90);
  }
  const auto jpeg =
      encapsulated(encode_dicom(src, DicomWriteOptions{}),
                   gdcm::TransferSyntax::JPEGBaselineProcess1, rgb_jpeg_without_markers(src));
  ASSERT_FALSE(jpeg.empty());
  const Image rgb = decode_dicom(jpeg, "rgb-jpeg.dcm");
  ASSERT_EQ(rgb.data.size(), src.data.size());
  double err = 0;
  for (size_t i = 0; i < src.data.size(); ++i) err += std::abs(int(rgb.data[i]) - int(src.data[i]));
  EXPECT_LT(err / static_cast<double>(src.data.size()), 3) << "an RGB stream taken for YCbCr";
}

// Masks (1 bit, packed, first pixel in the lowest bit) come out as 0 and 65535; 32-bit values
// (RT Dose grids) as their full range mapped linearly, within one step in 65535.
TEST(Dicom, OneBitMasksAndThirtyTwoBitGridsDecode) {
  const int w = 13, h = 7;  // not a multiple of 8 pixels
  std::vector<uint8_t> packed((w * h + 7) / 8, 0);
  std::vector<int> bit(w * h);
  for (int i = 0; i < w * h; ++i) {
    bit[static_cast<size_t>(i)] = (i * 7 + i / 5) % 3 == 0;
    if (bit[static_cast<size_t>(i)]) packed[static_cast<size_t>(i / 8)] |= uint8_t(1u << (i % 8));
  }
  const auto mask = raw_dicom(w, h, 1, packed, gdcm::TransferSyntax::ExplicitVRLittleEndian);
  ASSERT_FALSE(mask.empty());
  const Image m = decode_dicom(mask, "mask.dcm");
  ASSERT_EQ(m.width, w);
  ASSERT_EQ(m.height, h);
  for (int i = 0; i < w * h; ++i)
    EXPECT_EQ(pixel(m, i), bit[static_cast<size_t>(i)] ? 65535 : 0) << i;
  // A mask shorter than its pixels is refused (GDCM would fill it out, whatever size it declared).
  std::vector<uint8_t> cut(packed.begin(), packed.end() - 2);
  try {
    decode_dicom(raw_dicom(w, h, 1, cut, gdcm::TransferSyntax::ExplicitVRLittleEndian),
                 "short-mask.dcm");
    ADD_FAILURE() << "a mask of " << cut.size() << " bytes for " << w << "x" << h << " decoded";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("short-mask.dcm"), std::string::npos) << e.what();
  }

  std::vector<uint8_t> grid(static_cast<size_t>(w * h) * 4);
  std::vector<uint32_t> value(w * h);
  for (int i = 0; i < w * h; ++i) {
    value[static_cast<size_t>(i)] = 1000000u + static_cast<uint32_t>(i) * 37000u;  // > 16 bits
    std::memcpy(&grid[static_cast<size_t>(i) * 4], &value[static_cast<size_t>(i)], 4);
  }
  // (Big endian is checked against pydicom's rtdose_expb.dcm, not here: GDCM's writer swaps
  // the raw bytes it is given in 16-bit words, so it cannot write a reference file.)
  for (const auto& ts : {gdcm::TransferSyntax::ExplicitVRLittleEndian,
                         gdcm::TransferSyntax::ImplicitVRLittleEndian}) {
    const auto dose = raw_dicom(w, h, 32, grid, ts);
    ASSERT_FALSE(dose.empty());
    const Image d = decode_dicom(dose, "dose.dcm");
    const double lo = value.front(), hi = value.back();
    for (int i = 0; i < w * h; ++i) {
      const double want = (value[static_cast<size_t>(i)] - lo) / (hi - lo) * 65535;
      EXPECT_NEAR(pixel(d, i), want, 1.5) << ts << " pixel " << i;
    }
  }
}

TEST(Dicom, CompressedTransferSyntaxDecodesToTheSamePixels) {
  Image src = stored16(32, 24, 0, 4000);
  DicomWriteOptions o;
  o.bits_stored = 12;
  o.window = Window{2000, 4000};
  auto plain = encode_dicom(src, o);
  const auto rle = transcode(plain, gdcm::TransferSyntax::RLELossless);
  ASSERT_FALSE(rle.empty());
  ASSERT_NE(rle.size(), plain.size());
  Image a = decode_dicom(plain, "plain.dcm");
  Image b = decode_dicom(rle, "rle.dcm");
  EXPECT_EQ(a.data, b.data);
}

TEST(Dicom, TruncatedFileIsAnErrorNamingIt) {
  Image src = stored16(32, 24, 0, 4000);
  auto bytes = encode_dicom(src, {});
  bytes.resize(bytes.size() / 2);
  try {
    decode_dicom(bytes, "scans/cut.dcm");
    FAIL() << "decoded a truncated file";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("scans/cut.dcm"), std::string::npos) << e.what();
  }
}

// Rows on demand (what the pipeline resamples a crop from) are those of the whole image, under
// the file's range and under a given window; the size comes without decoding.
TEST(Dicom, RowsOnDemandAreThoseOfTheWholeImage) {
  Image src = stored16(64, 48, 0, 4000);
  DicomWriteOptions o;
  o.bits_stored = 12;
  const auto bytes = encode_dicom(src, o);
  const ImageInfo info = probe_dicom(bytes, "r.dcm");
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.height, 48);
  for (const std::optional<Window> window :
       {std::optional<Window>(), std::optional(Window{900, 700})}) {
    const Image whole = decode_dicom(bytes, "r.dcm", window);
    const DicomPixels pixels(bytes, "r.dcm");
    const RowSource rows = pixels.rows(window);
    ASSERT_EQ(rows.width, 64);
    ASSERT_EQ(rows.height, 48);
    ASSERT_EQ(rows.bits, 16);
    std::vector<float> row(33);
    for (int y = 7; y < 27; ++y) {
      rows.row(y, 10, 33, row.data());
      for (int x = 0; x < 33; ++x)
        ASSERT_EQ(row[static_cast<size_t>(x)], pixel(whole, y * 64 + x + 10)) << x << "," << y;
    }
  }
}

// RLE pixel data that lies (a segment past the fragment, too few bytes) is an error naming the
// file, never a crash; 8-bit RLE decodes as the plain file does.
TEST(Dicom, RleCorruptIsAClearErrorAndEightBitDecodes) {
  Image src = stored16(48, 40, 0, 4000);
  DicomWriteOptions o;
  o.bits_stored = 12;
  const auto plain = encode_dicom(src, o);
  auto rle = transcode(plain, gdcm::TransferSyntax::RLELossless);
  ASSERT_FALSE(rle.empty());
  // The RLE header follows the first (empty) item of the pixel data: find "segments = 2".
  size_t header = 0;
  for (size_t p = 0; p + 8 < rle.size(); ++p) {
    const uint8_t want[8] = {2, 0, 0, 0, 64, 0, 0, 0};
    if (std::memcmp(rle.data() + p, want, 8) == 0) {
      header = p;
      break;
    }
  }
  ASSERT_NE(header, 0u);
  auto lying = rle;
  const uint32_t far = 1u << 30;
  std::memcpy(&lying[header + 8], &far, 4);  // the second segment starts far past the fragment
  for (const auto& bytes : {lying, std::vector<uint8_t>(rle.begin(), rle.end() - 300)}) {
    try {
      decode_dicom(bytes, "bad-rle.dcm");
      ADD_FAILURE() << "a corrupt RLE file decoded";
    } catch (const DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find("bad-rle.dcm"), std::string::npos) << e.what();
    }
  }
  Image src8;
  src8.width = 30;
  src8.height = 20;
  src8.channels = 1;
  src8.bits = 8;
  for (int i = 0; i < 600; ++i)
    src8.data.push_back(static_cast<uint8_t>(i % 7 == 0 ? 200 : i % 50));
  DicomWriteOptions o8;
  o8.bits_stored = 8;
  const auto plain8 = encode_dicom(src8, o8);
  const auto rle8 = transcode(plain8, gdcm::TransferSyntax::RLELossless);
  ASSERT_FALSE(rle8.empty());
  EXPECT_EQ(decode_dicom(rle8, "rle8.dcm").data, decode_dicom(plain8, "plain8.dcm").data);
}

namespace {

// A 12-bit scan with its window, as the project's writer stores it.
std::vector<uint8_t> windowed12(int w, int h) {
  DicomWriteOptions o;
  o.bits_stored = 12;
  o.window = Window{2000, 4000};
  return encode_dicom(stored16(w, h, 0, 4000), o);
}

void set_element(gdcm::DataSet& ds, gdcm::Tag tag, gdcm::VR vr, const void* value, size_t n) {
  gdcm::DataElement de(tag);
  de.SetVR(vr);
  de.SetByteValue(static_cast<const char*>(value), static_cast<uint32_t>(n));
  ds.Replace(de);
}

}  // namespace

// A valid file with a Frame Increment Pointer and no Number of Frames (as one-frame RT Dose files
// from other toolkits) made GDCM's image reader assert and abort the process. It decodes now, to
// the pixels of the same image without those attributes.
TEST(Dicom, FrameIncrementPointerWithoutNumberOfFramesDecodes) {
  const auto plain = windowed12(24, 20);
  const auto jls = transcode(plain, gdcm::TransferSyntax::JPEGLSLossless);  // GDCM's path
  ASSERT_FALSE(jls.empty());
  const auto rtdose_like = rewritten(jls, [](gdcm::File& f) {
    gdcm::DataSet& ds = f.GetDataSet();
    ds.Remove(gdcm::Tag(0x0028, 0x0008));
    const uint16_t points_at[2] = {0x3004, 0x000c};  // Grid Frame Offset Vector, as RT Dose has
    set_element(ds, gdcm::Tag(0x0028, 0x0009), gdcm::VR::AT, points_at, 4);
    set_element(ds, gdcm::Tag(0x3004, 0x000c), gdcm::VR::DS, "0 ", 2);
    // An RT Dose image, as GDCM reads those frame by frame along the Grid Frame Offset Vector.
    const char rtdose[] = "1.2.840.10008.5.1.4.1.1.481.2";  // with its padding NUL: even length
    set_element(ds, gdcm::Tag(0x0008, 0x0016), gdcm::VR::UI, rtdose, sizeof(rtdose));
    set_element(f.GetHeader(), gdcm::Tag(0x0002, 0x0002), gdcm::VR::UI, rtdose, sizeof(rtdose));
  });
  ASSERT_FALSE(rtdose_like.empty());
  EXPECT_EQ(decode_dicom(rtdose_like, "rtdose-like.dcm").data,
            decode_dicom(plain, "plain.dcm").data);
}

// The deflated transfer syntax was reported as truncated (its declared lengths are those of the
// inflated data set); it decodes to the same pixels as the plain file.
TEST(Dicom, DeflatedTransferSyntaxDecodes) {
  const auto plain = windowed12(24, 20);
  const auto deflated = rewritten(plain, [](gdcm::File& f) {
    f.GetHeader().SetDataSetTransferSyntax(gdcm::TransferSyntax::DeflatedExplicitVRLittleEndian);
  });
  ASSERT_FALSE(deflated.empty());
  ASSERT_LT(deflated.size(), plain.size()) << "not deflated";
  EXPECT_EQ(decode_dicom(deflated, "deflated.dcm").data, decode_dicom(plain, "plain.dcm").data);
}

// An RLE file that declares more pixels than an image may take (65535 x 65535 in a few KB), or
// more than its bytes can hold (a PackBits run of 2 bytes gives at most 128), is refused at once,
// naming the file, before anything of that size is allocated (it took 60 s and 13 GB before).
TEST(Dicom, RleDeclaringMorePixelsThanItsBytesHoldIsRefusedAtOnce) {
  const auto rle = transcode(windowed12(24, 20), gdcm::TransferSyntax::RLELossless);
  ASSERT_FALSE(rle.empty());
  for (const uint16_t side : {uint16_t{65535}, uint16_t{4000}}) {
    const auto huge = rewritten(rle, [&](gdcm::File& f) {
      set_element(f.GetDataSet(), gdcm::Tag(0x0028, 0x0010), gdcm::VR::US, &side, 2);
      set_element(f.GetDataSet(), gdcm::Tag(0x0028, 0x0011), gdcm::VR::US, &side, 2);
    });
    ASSERT_FALSE(huge.empty());
    const auto t0 = std::chrono::steady_clock::now();
    try {
      decode_dicom(huge, "huge.dcm");
      ADD_FAILURE() << side << " x " << side << " decoded";
    } catch (const cohort::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("huge.dcm"), std::string::npos) << what;
      EXPECT_NE(what.find(side == 65535 ? "MiB an image may take" : "cannot hold"),
                std::string::npos)
          << what;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  }
}

namespace {

// The helper processes (cohort-gdcm) this process has started and not yet reaped.
int helpers_running() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    // pid (comm) state ppid ...
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || stat.find("(cohort-gdcm)") == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == static_cast<long>(getpid())) ++n;
  }
  return n;
}

// Runs f on a thread of its own (a thread has its own helper, started with the environment of
// the moment), with `name`=`value` set meanwhile.
void on_new_thread(const char* name, const char* value, const std::function<void()>& f) {
  ::setenv(name, value, 1);
  std::thread t(f);
  t.join();
  ::unsetenv(name);
}

}  // namespace

// GDCM decodes in a helper process per thread: JPEG-LS comes back with the native pixels from
// there; a decoder that aborts costs its file a DecodeError naming it, the signal and GDCM's last
// words (the abort is injected: every abort fuzzing found is refused before GDCM now), and the
// next file decodes in a fresh helper; a decoder that loops is stopped at COHORT_DECODE_TIMEOUT;
// a thread's helper ends with it.
TEST(Dicom, GdcmDecodesInAHelperProcessThatDiesInsteadOfTheCaller) {
  const auto plain = windowed12(40, 30);
  const auto jpegls = transcode(plain, gdcm::TransferSyntax::JPEGLSLossless);
  ASSERT_FALSE(jpegls.empty());
  const Image want = decode_dicom(plain, "plain.dcm");
  const int before = helpers_running();
  on_new_thread("COHORT_GDCM_HELPER_FAULT", "abort:fault-abort", [&] {
    EXPECT_EQ(decode_dicom(jpegls, "scans/a.dcm").data, want.data);
    EXPECT_EQ(helpers_running(), before + 1) << "no helper decoded it";
    try {
      decode_dicom(jpegls, "scans/fault-abort.dcm");
      ADD_FAILURE() << "the aborting decoder returned";
    } catch (const DecodeError& e) {
      const std::string what = e.what();
      for (const char* part :
           {"scans/fault-abort.dcm", "signal 6", "injected fault (abort)", "this one goes on"})
        EXPECT_NE(what.find(part), std::string::npos) << part << " missing: " << what;
    }
    EXPECT_EQ(helpers_running(), before) << "the dead helper was not reaped";
    EXPECT_EQ(decode_dicom(jpegls, "scans/b.dcm").data, want.data);  // a fresh helper
    EXPECT_EQ(helpers_running(), before + 1);
  });
  EXPECT_EQ(helpers_running(), before) << "a thread's helper outlived it";

  ::setenv("COHORT_DECODE_TIMEOUT", "1.5", 1);
  on_new_thread("COHORT_GDCM_HELPER_FAULT", "hang:stuck", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      decode_dicom(jpegls, "scans/stuck.dcm");
      ADD_FAILURE() << "the looping decoder returned";
    } catch (const DecodeError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("scans/stuck.dcm: decoding took longer than 1.5 s"), std::string::npos)
          << what;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GT(s, 1.4);
    EXPECT_LT(s, 5.0);
    EXPECT_EQ(decode_dicom(jpegls, "scans/c.dcm").data, want.data);
  });
  ::unsetenv("COHORT_DECODE_TIMEOUT");
  EXPECT_EQ(helpers_running(), before);

  // In the pipeline: the file whose decoder died is skipped and counted, the others train.
  const std::string dir = ::testing::TempDir() + "/cohort-helper-" + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/a");
  for (int i = 0; i < 6; ++i) {
    std::ofstream out(
        dir + "/a/" + (i == 3 ? std::string("fault-abort") : std::to_string(i)) + ".dcm",
        std::ios::binary);
    out.write(reinterpret_cast<const char*>(jpegls.data()),
              static_cast<std::streamsize>(jpegls.size()));
  }
  on_new_thread("COHORT_GDCM_HELPER_FAULT", "abort:fault-abort", [&] {
    PipelineOptions o;
    o.batch = 3;
    o.size = 16;
    o.shuffle = false;
    Pipeline p(open_source(dir), o);
    p.start_epoch(0);
    Batch b;
    int images = 0;
    while (p.next(&b)) images += b.size;
    EXPECT_EQ(images, 5);
    EXPECT_EQ(p.stats().skipped, 1u);
  });
  EXPECT_EQ(helpers_running(), before) << "the pipeline's workers left helpers behind";
  std::filesystem::remove_all(dir);
}

namespace {

// DICOM's VOI functions written out here from PS3.3, apart from voi_linear: LINEAR
// (C.11.2.1.2.1) for a width of 1 or more, LINEAR_EXACT (C.11.2.1.3.2) for a narrower one.
double standard_window(double x, double center, double width) {
  if (width < 1) {
    if (x <= center - width / 2) return 0;
    if (x > center + width / 2) return 1;
    return (x - center) / width + 0.5;
  }
  if (x <= center - 0.5 - (width - 1) / 2) return 0;
  if (x > center - 0.5 + (width - 1) / 2) return 1;
  return ((x - (center - 0.5)) / (width - 1) + 0.5);
}

// A number as the file holds it (a DS of at most 10 significant digits, as encode_dicom writes).
double as_ds(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", v);
  return std::strtod(text, nullptr);
}

}  // namespace

// Every bit depth and pixel representation: 8 bits stored in 8, 12 and 16 in 16, 32 in 32,
// unsigned and signed, without a rescale, with Rescale Slope/Intercept, and as an RT Dose grid
// scaled by Dose Grid Scaling; native, implicit VR, deflated (GDCM's reader) and RLE. Each is
// windowed by two windows given in modality units (a wide one, and one 200 stored steps wide
// over a run of consecutive stored values) and by the file's own, and compared with the
// standard's window formula on the modality values computed here from the stored ones. The
// whole image and the rows on demand agree. (32-bit grids were once squeezed onto 16 bits over
// their whole range, so a narrow window saw a few steps; 16-bit RT Dose was left in stored
// units; a window narrower than 1, as dose windows in Gy are, was widened to 1.)
TEST(Dicom, EveryBitDepthAndRepresentationUnderExplicitAndFileWindows) {
  const int w = 32, h = 32, n = w * h;
  struct Depth {
    int allocated, stored;
  };
  enum class Scale { none, rescale, dose };
  int cases = 0;
  for (const Depth d : {Depth{8, 8}, Depth{16, 12}, Depth{16, 16}, Depth{32, 32}}) {
    for (const bool is_signed : {false, true}) {
      for (const Scale scale : {Scale::none, Scale::rescale, Scale::dose}) {
        if (scale == Scale::dose && d.allocated == 8) continue;  // RT Dose: 16 or 32 bits
        const int64_t lo = is_signed ? -(int64_t{1} << (d.stored - 1)) : 0;
        const int64_t hi =
            is_signed ? (int64_t{1} << (d.stored - 1)) - 1 : (int64_t{1} << d.stored) - 1;
        // Half the pixels spread over the whole stored range (both ends included), half a run
        // of consecutive values around 37% of it.
        std::vector<int64_t> value(n);
        const int64_t around = lo + static_cast<int64_t>(0.37 * static_cast<double>(hi - lo));
        for (int i = 0; i < n / 2; ++i) {
          value[i] = lo + static_cast<int64_t>(static_cast<long double>(hi - lo) * i / (n / 2 - 1));
        }
        for (int i = n / 2; i < n; ++i) value[i] = std::clamp(around + (i - 3 * n / 4), lo, hi);
        Image src = blank(w, h, 1, d.allocated);
        for (int i = 0; i < n; ++i) {
          const uint32_t u =
              static_cast<uint32_t>(value[i]) & (d.stored == 32 ? ~0u : (1u << d.stored) - 1u);
          std::memcpy(&src.data[static_cast<size_t>(i) * (d.allocated / 8)], &u,
                      static_cast<size_t>(d.allocated / 8));
        }
        DicomWriteOptions o;
        o.bits_stored = d.stored;
        o.is_signed = is_signed;
        double slope = 1, intercept = 0;
        if (scale == Scale::rescale) {
          slope = d.allocated == 32 ? 2.5e-4 : 0.75;
          intercept = -1024.5;
          o.slope = slope;
          o.intercept = intercept;
          o.monochrome1 = is_signed;  // and MONOCHROME1 (inverted) once at every depth
        } else if (scale == Scale::dose) {
          slope = d.allocated == 32 ? 3.0e-8 : 1.5e-3;  // Gy per stored step
          o.dose_grid_scaling = slope;
        }
        auto modality = [&](int64_t s) { return static_cast<double>(s) * slope + intercept; };
        const double mlo = std::min(modality(lo), modality(hi));
        const double range = std::max(modality(lo), modality(hi)) - mlo;
        o.window = Window{as_ds(mlo + 0.6 * range), as_ds(0.5 * range)};  // the file's own
        const Window wide{mlo + 0.3 * range, 0.4 * range};
        const Window narrow{modality(around), 200 * slope};
        const std::string what = std::to_string(d.stored) + "/" + std::to_string(d.allocated) +
                                 (is_signed ? " signed" : " unsigned") +
                                 (scale == Scale::none      ? ""
                                  : scale == Scale::rescale ? " rescaled"
                                                            : " dose");
        const auto plain = encode_dicom(src, o);
        std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
            {"explicit VR", plain},
            {"implicit VR", transcode(plain, gdcm::TransferSyntax::ImplicitVRLittleEndian)},
            {"deflated", rewritten(plain, [](gdcm::File& f) {
               f.GetHeader().SetDataSetTransferSyntax(
                   gdcm::TransferSyntax::DeflatedExplicitVRLittleEndian);
             })}};
        if (d.allocated <= 16) {
          files.emplace_back("RLE", transcode(plain, gdcm::TransferSyntax::RLELossless));
        }
        for (const auto& [syntax, bytes] : files) {
          ASSERT_FALSE(bytes.empty()) << what << ", " << syntax;
          const DicomPixels pixels(bytes, what + ".dcm");
          for (const auto& [window_name, window] :
               std::vector<std::pair<std::string, std::optional<Window>>>{
                   {"wide", wide}, {"narrow", narrow}, {"the file's", std::nullopt}}) {
            const Window used = window ? *window : *o.window;
            const Image img = pixels.window(window);
            ASSERT_EQ(img.width, w);
            ASSERT_EQ(img.bits, 16);
            int inside = 0;  // pixels strictly inside the window: the window was exercised
            for (int i = 0; i < n; ++i) {
              double y = standard_window(modality(value[i]), used.center, used.width);
              inside += y > 0 && y < 1;
              if (o.monochrome1) y = 1 - y;
              ASSERT_NEAR(pixel(img, i), y * 65535, 1.0)
                  << what << ", " << syntax << ", " << window_name << " window (" << used.center
                  << ", " << used.width << "), pixel " << i << " stored " << value[i];
            }
            EXPECT_GE(inside, 20) << what << ", " << window_name << " window";
            const RowSource rows = pixels.rows(window);
            std::vector<float> row(w);
            for (int y = 0; y < h; ++y) {
              rows.row(y, 0, w, row.data());
              for (int x = 0; x < w; ++x) ASSERT_EQ(row[x], pixel(img, y * w + x)) << what;
            }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, (2 * 2 * 4) + (2 * 3 * 4) + (2 * 3 * 4) + (2 * 3 * 3));
  // A window must have a width: a caller's width of 0 or less is refused, naming it.
  const auto some = encode_dicom(stored16(4, 4, 0, 100), DicomWriteOptions{});
  EXPECT_THROW(decode_dicom(some, "some.dcm", Window{50, 0}), cohort::Error);
}
