// Decoded images and the codecs that make them: JPEG (libjpeg-turbo, with DCT-domain
// downscaling), PNG 8/16-bit (libspng). Pixels are interleaved; 16-bit samples are native-endian.
#pragma once

#include <cstdint>
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

enum class Format { jpeg, png, dicom, unknown };
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
// The largest JPEG downscale (in eighths) that keeps a w x h region at least `min_side` pixels.
int jpeg_scale_for(int region_w, int region_h, int min_side);

std::vector<uint8_t> encode_png(const Image& img);
std::vector<uint8_t> encode_jpeg(const Image& img, int quality);

std::vector<uint8_t> read_file(const std::string& path);
// Reads into `out`, reusing its capacity (the pipeline reads one file per sample).
void read_file_into(const std::string& path, std::vector<uint8_t>& out);
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);  // atomic rename

}  // namespace cohort::data
