// Decoded images and the codecs that make them: JPEG (libjpeg-turbo, with DCT-domain
// downscaling), PNG 8/16-bit (libspng). Pixels are interleaved; 16-bit samples are native-endian.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::data {

// A file that cannot be decoded; the message names it.
class DecodeError : public Error {
 public:
  using Error::Error;
};

struct Image {
  int width = 0, height = 0, channels = 0;
  int bits = 8;  // 8 or 16
  std::vector<uint8_t> data;
  size_t row_bytes() const { return static_cast<size_t>(width) * channels * (bits / 8); }
  float at(int x, int y, int c) const {
    size_t i = (static_cast<size_t>(y) * width + x) * channels + c;
    if (bits == 8) return data[i];
    uint16_t v;
    __builtin_memcpy(&v, data.data() + 2 * i, 2);
    return v;
  }
};

// An image read a row at a time, as float values in its own range (0..255 for 8 bits, 0..65535
// for 16): `row(y, x0, n, out)` writes pixels x0..x0+n-1 of row y, channels interleaved. A
// decoder that can give rows on demand (stored DICOM values through their window) so hands an
// image to an operator without the whole image, or a copy of it, in memory.
struct RowSource {
  int width = 0, height = 0, channels = 0;
  int bits = 8;  // of the values: 8 or 16
  std::function<void(int y, int x0, int n, float* out)> row;
};

// A rectangle of an image, in pixels.
struct PixelRegion {
  int x = 0, y = 0, w = 0, h = 0;
};

enum class Format { jpeg, png, dicom, unknown };
// The most bytes one decoded image may take (at 16 bits per sample): a header that declares more
// is refused before anything is allocated (see probe).
constexpr size_t kMaxDecodedBytes = size_t{1} << 30;
Format sniff(const uint8_t* p, size_t n);

struct ImageInfo {
  int width = 0, height = 0, channels = 0;
  Format format = Format::unknown;
};
ImageInfo probe(std::span<const uint8_t> bytes, const std::string& name);

// JPEG's inverse DCT: libjpeg-turbo's fast integer one (the pipeline's default: bench/compare-data
// measures what it costs in accuracy) or its accurate one.
enum class Idct { fast, accurate };

// Decodes `bytes` (DICOM: see dicom.h, with the file's window). For JPEG, `scale_eighths`/8
// (1..8) asks for DCT-domain downscaling.
Image decode(std::span<const uint8_t> bytes, const std::string& name, int scale_eighths = 8,
             Idct idct = Idct::fast);
// The part of a JPEG that covers `region` (in the image's own pixels) and a margin of 16 pixels,
// downscaled by `scale_eighths`/8 in the DCT domain. Inside the region its pixels are those a
// whole decode gives (at a cut, chroma upsampling restarts: the margin absorbs that). Rows
// below are never decoded; rows above are entropy-decoded only; columns are cut to whole blocks.
// `origin` gets the returned image's top-left corner in the scaled image. A random crop needs half
// a training image on average: measured by bench/compare-data. CMYK and YCCK files, which libjpeg
// cannot convert to RGB, are decoded whole (origin 0, 0).
Image decode_jpeg_region(std::span<const uint8_t> bytes, const std::string& name, int scale_eighths,
                         Idct idct, PixelRegion region, PixelRegion* origin);
// The largest JPEG downscale (in eighths) that keeps a w x h region at least `min_side` pixels.
int jpeg_scale_for(int region_w, int region_h, int min_side);

std::vector<uint8_t> encode_png(const Image& img);
std::vector<uint8_t> encode_jpeg(const Image& img, int quality);

std::vector<uint8_t> read_file(const std::string& path);
// Reads into `out`, reusing its capacity (the pipeline reads one file per sample).
void read_file_into(const std::string& path, std::vector<uint8_t>& out);
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);  // atomic rename

}  // namespace cohort::data
