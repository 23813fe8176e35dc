// What the files of src/data/dicom/ share: the stored pixels as found in a file, their format,
// the windowing that turns them into the output's 16-bit values, and the steps that find them.
// Private to data (dicom.h is the public face). The jobs, a file each:
//   header.cc       the structure walk that checks a file before GDCM reads it, and the
//                   attributes read from the data set (rescale, window, unsigned shorts)
//   window.cc       rescale and VOI windowing: stored values to output values
//   native.cc       uncompressed pixel data where it lies in the file, and RLE, decoded here
//   gdcm_decode.cc  every other transfer syntax through GDCM, with the repairs GDCM needs, in a
//                   helper process
//   dicom.cc        DicomPixels, probe, decode and the writer
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <streambuf>
#include <string>
#include <vector>

#include "../kernels/window_math.h"
#include "cohort/data/dicom.h"

namespace gdcm {
class DataSet;
class Tag;
}  // namespace gdcm

namespace cohort::data {

// How stored pixel values are laid out: what the pixel loop needs, from the data set (fast path)
// or from GDCM's image (decoded transfer syntaxes).
struct StoredFormat {
  int width = 0, height = 0;
  int bits_allocated = 0, bits_stored = 0, high_bit = -1;
  bool is_signed = false, monochrome1 = false;
  double slope = 1.0, intercept = 0.0;
  int samples = 1;  // 3: RGB, 8-bit, interleaved (converted so when decoded)
};

// A file's stored pixels, found once: native (uncompressed, little-endian) pixel data where it
// lies in the file's bytes (GDCM parses the data set up to the pixel data element and no
// further: no copy of the pixels into GDCM's element, and none out of it), or decoded (RLE here,
// every other transfer syntax by GDCM).
struct StoredPixels {
  StoredFormat format;
  const uint8_t* data = nullptr;  // in the file's bytes, or
  std::vector<uint8_t> decoded;   // decoded (RLE, or GDCM's buffer)
  std::optional<Window> window;   // the file's
  const uint8_t* pixels() const { return decoded.empty() ? data : decoded.data(); }
};

namespace dicom_impl {

// An istream over bytes we already hold, without copying them.
struct SpanBuf : std::streambuf {
  SpanBuf(const uint8_t* p, size_t n) {
    char* b = const_cast<char*>(reinterpret_cast<const char*>(p));
    setg(b, b, b + n);
  }
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
    char* target = dir == std::ios_base::beg   ? eback() + off
                   : dir == std::ios_base::cur ? gptr() + off
                                               : egptr() + off;
    if (target < eback() || target > egptr()) return pos_type(off_type(-1));
    setg(eback(), target, egptr());
    return pos_type(target - eback());
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode m) override {
    return seekoff(off_type(pos), std::ios_base::beg, m);
  }
};

// header.cc
std::optional<double> first_number(const std::string& s);
std::string element_string(const gdcm::DataSet& ds, const gdcm::Tag& t);
void quiet_gdcm();
// Walks the file's structure, every step checked against its size; throws DecodeError naming
// the byte where it breaks.
void check_structure(std::span<const uint8_t> bytes, const std::string& name);
std::optional<int> us_value(const gdcm::DataSet& ds, uint16_t group, uint16_t element);
std::optional<Window> file_window(const gdcm::DataSet& ds);
bool read_rescale(const gdcm::DataSet& ds, StoredFormat& f);

// window.cc
// Stored values to windowed output: stored value -> modality value (rescale, dose scaling) ->
// VOI window -> [0, 65535], MONOCHROME1 inverted. Stored values of up to 16 bits go through one
// table, built once per image (at most 65536 entries); a pixel is then a mask and a lookup.
// (Converting each pixel through a double and lround cost 73.6 ms for a 2048x2048 scan; the
// table: a few ms.) 32-bit values (RT Dose grids, parametric maps) have too many for a table:
// each pixel is windowed from its own modality value, so a window narrower than the image's
// range keeps every distinct value (they were once squeezed onto 16 bits over the whole range
// first, which a narrow window then saw as a few steps).
struct Windowing {
  std::vector<uint16_t> lut;  // up to 16 stored bits: the output value of every stored value
  kernels::WindowParams p;    // the per-pixel maths (kernels/window_math.h), also the GPU's
  // Pixels x0..x0+n-1 of stored row `row`, windowed through `table` (`lut`, or the same values
  // in another type: a table of floats spares the resampler a conversion per pixel). The 1- and
  // 2-byte loops are kernels::stored_bits written out per width, so that they vectorise.
  template <typename Out>
  void apply(const Out* table, const uint8_t* row, int x0, int n, Out* out) const {
    const int shift = p.shift;
    const uint32_t mask = p.mask;
    if (p.bytes == 1) {
      const uint8_t* r = row + x0;
      for (int x = 0; x < n; ++x) out[x] = table[(r[x] >> shift) & mask];
    } else if (p.bytes == 2) {
      const uint8_t* r = row + 2 * static_cast<size_t>(x0);
      for (int x = 0; x < n; ++x) {
        uint16_t u;
        std::memcpy(&u, r + 2 * x, 2);
        out[x] = table[(u >> shift) & mask];
      }
    } else {
      for (int x = 0; x < n; ++x)
        out[x] = static_cast<Out>(kernels::window_value(kernels::stored_bits(row, x0 + x, p), p));
    }
  }
};
Windowing windowing(const uint8_t* raw, const StoredFormat& f, std::optional<Window> window);
Image window_pixels(const uint8_t* raw, const StoredFormat& f, std::optional<Window> window);

// native.cc
std::vector<uint8_t> decode_rle_frame(std::span<const uint8_t> frame, int samples, int bytes,
                                      size_t pixels, const std::string& name);
// Native pixel data where it lies in the file; nullopt for a transfer syntax it does not take.
// pixels = false: the format only.
std::optional<StoredPixels> parse_native(std::span<const uint8_t> bytes, const std::string& name,
                                         bool pixels = true);

// gdcm_decode.cc
StoredPixels decode_with_gdcm(std::span<const uint8_t> bytes, const std::string& name);
StoredPixels decode_general(std::span<const uint8_t> bytes, const std::string& name);

}  // namespace dicom_impl
}  // namespace cohort::data
