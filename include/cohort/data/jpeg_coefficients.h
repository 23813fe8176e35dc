// JPEG decoding split as DALI's "mixed" decoder splits it: the CPU entropy-decodes a file into
// quantised DCT coefficients (libjpeg-turbo's coefficient API), and the device does the rest
// (dequantisation, IDCT, chroma upsampling, colour conversion; src/data/kernels/jpeg_math.h).
// Baseline and progressive Huffman files in grayscale or YCbCr with 4:4:4, 4:2:2 or 4:2:0 chroma
// take this path; anything else (CMYK, YCCK, 4:4:0, 4:1:1, 12-bit, arithmetic coding) is left to
// the CPU decoder, and read_jpeg_coefficients says why.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/data/image.h"

namespace cohort::data {

struct JpegComponent {
  int h = 1, v = 1;                // sampling factors relative to the largest (1 or 2)
  int width = 0, height = 0;       // samples that count (the image's size over h, v, rounded up)
  int blocks_w = 0, blocks_h = 0;  // 8x8 blocks stored, padded to whole MCUs
  std::vector<int16_t> coef;       // blocks_w * blocks_h blocks of 64, natural order
  std::array<uint16_t, 64> quant{};
};

struct JpegCoefficients {
  int width = 0, height = 0;
  std::vector<JpegComponent> components;  // 1 (gray) or 3 (Y, Cb, Cr)
};

// Entropy-decodes `bytes` into `out`. Returns false, with the reason in `why_not`, for a file
// the device path does not take (the CPU decoder then decodes it whole); a corrupt file is a
// DecodeError naming `name`, as in decode().
bool read_jpeg_coefficients(std::span<const uint8_t> bytes, const std::string& name,
                            JpegCoefficients* out, std::string* why_not);

// The rest of the decode on the host, with the device's arithmetic (jpeg_math.h): what the GPU
// path gives for the file, as an 8-bit RGB or gray Image.
Image decode_coefficients_on_host(const JpegCoefficients& c);

}  // namespace cohort::data
