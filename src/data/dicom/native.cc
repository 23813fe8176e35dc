// Uncompressed pixel data found where it lies in the file's bytes, and RLE Lossless decoded
// here (see stored.h).
#include "stored.h"

#include <gdcmAttribute.h>
#include <gdcmDicts.h>
#include <gdcmGlobal.h>
#include <gdcmImageReader.h>
#include <gdcmImageWriter.h>
#include <gdcmReader.h>
#include <gdcmSequenceOfItems.h>
#include <gdcmTrace.h>
#include <gdcmUIDGenerator.h>
#include <gdcmWriter.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <streambuf>

namespace cohort::data {
namespace dicom_impl {

uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// DICOM RLE Lossless (PS3.5 Annex G), one frame: a 64-byte header (the segment count and 15
// offsets, little-endian 32-bit), then PackBits segments; segment k holds byte k % `bytes` (the
// most significant first) of sample k / `bytes` of every pixel. Returns interleaved
// little-endian samples. Every offset and run is checked against the frame's bytes.
// Written here rather than taken from GDCM: GDCM's decoder writes byte by byte through an
// ostream, 300 ms for a 2048x2048 16-bit scan where whole runs by memcpy and memset take a few
// ms; and GDCM 3.0 places 16-bit colour's segments rotated by three bytes (checked against
// pydicom's decoder on files pydicom's encoder wrote, and on pydicom's SC_rgb_rle_16bit.dcm).
std::vector<uint8_t> decode_rle_frame(std::span<const uint8_t> frame, int samples, int bytes,
                                      size_t pixels, const std::string& name) {
  auto bad = [&](const std::string& why) {
    COHORT_THROW_AS(DecodeError, name << ": RLE pixel data: " << why);
  };
  const size_t len = frame.size();
  const uint8_t* p = frame.data();
  const size_t width = static_cast<size_t>(bytes);
  const size_t count = static_cast<size_t>(samples) * width;
  if (pixels == 0) bad("a frame of an image without pixels");  // (and no buffer to place them)
  if (len < 64) bad("a frame of " + std::to_string(len) + " bytes has no RLE header");
  if (le32(p) != count) {
    bad(std::to_string(le32(p)) + " segments for " + std::to_string(samples) + " sample(s) of " +
        std::to_string(8 * bytes) + " bits (expected " + std::to_string(count) + ")");
  }
  // What the frame declares must fit in what an image may take, and in what its bytes can
  // hold: a PackBits run of 2 bytes gives at most 128. (A file of a few KB declaring 65535 x
  // 65535 pixels made the decoder allocate and clear 13 GB before it found the data short.)
  if (pixels * count > kMaxDecodedBytes) {
    bad(std::to_string(pixels) + " pixels of " + std::to_string(count) + " bytes: more than the " +
        std::to_string(kMaxDecodedBytes >> 20) + " MiB an image may take");
  }
  if (pixels * count > (len - 64) * 64 + 64 * count) {
    bad(std::to_string(len) + " bytes cannot hold " + std::to_string(pixels) + " pixels of " +
        std::to_string(count) + " bytes");
  }
  std::vector<uint8_t> out(pixels * count);
  // One byte per pixel: the segment is the image. Otherwise each segment goes to a plane first.
  std::vector<uint8_t> plane(count == 1 ? 0 : pixels);
  uint8_t* dst = count == 1 ? out.data() : plane.data();
  for (size_t s = 0; s < count; ++s) {
    const size_t start = le32(p + 4 + 4 * s);
    const size_t end = s + 1 < count ? le32(p + 8 + 4 * s) : len;
    if (start < 64 || start > end || end > len) {
      bad("segment " + std::to_string(s) + " spans bytes " + std::to_string(start) + ".." +
          std::to_string(end) + " of a " + std::to_string(len) + "-byte frame");
    }
    size_t o = 0, i = start;
    while (o < pixels && i < end) {
      const int c = static_cast<int8_t>(p[i++]);
      if (c >= 0) {  // c + 1 literal bytes
        const size_t k =
            std::min<size_t>(static_cast<size_t>(c) + 1, std::min(end - i, pixels - o));
        std::memcpy(dst + o, p + i, k);
        o += k;
        i += static_cast<size_t>(c) + 1;
      } else if (c != -128) {  // the next byte, 1 - c times
        if (i >= end) break;
        const size_t k = std::min<size_t>(static_cast<size_t>(1 - c), pixels - o);
        std::memset(dst + o, p[i++], k);
        o += k;
      }
    }
    if (o < pixels) {
      bad("segment " + std::to_string(s) + " gives " + std::to_string(o) + " of " +
          std::to_string(pixels) + " bytes");
    }
    if (count == 1) break;
    // Segment s is byte `byte` (0: the least significant) of sample `sample`.
    const size_t sample = s / width, byte = width - 1 - s % width;
    uint8_t* to = out.data() + sample * width + byte;
    for (size_t j = 0; j < pixels; ++j) to[j * count] = plane[j];
  }
  return out;
}

// The first frame's fragment of encapsulated pixel data whose value starts at `at` in the
// file's bytes: items, a basic offset table first, then one fragment per frame.
std::span<const uint8_t> first_frame_at(std::span<const uint8_t> bytes, size_t at,
                                        const std::string& name) {
  auto bad = [&](const std::string& why) {
    COHORT_THROW_AS(DecodeError, name << ": encapsulated pixel data: " << why);
  };
  auto item = [&](size_t p, size_t* len) {
    if (p + 8 > bytes.size()) bad("truncated before an item");
    const uint8_t tag[4] = {0xfe, 0xff, 0x00, 0xe0};
    if (std::memcmp(bytes.data() + p, tag, 4) != 0)
      bad("expected an item at byte " + std::to_string(p));
    *len = le32(bytes.data() + p + 4);
    if (p + 8 + *len > bytes.size())
      bad("an item of " + std::to_string(*len) + " bytes is truncated");
    return p + 8;
  };
  size_t len = 0;
  const size_t table = item(at, &len);          // the basic offset table
  const size_t frag = item(table + len, &len);  // the first frame's fragment
  return bytes.subspan(frag, len);
}

// Nothing when the file is not of that kind or lacks an attribute the fast path needs; the
// general path then decodes it. With `pixels` false, only the format is wanted (no decoding).
std::optional<StoredPixels> parse_native(std::span<const uint8_t> bytes, const std::string& name,
                                         bool pixels) {
  SpanBuf buf(bytes.data(), bytes.size());
  std::istream in(&buf);
  gdcm::Reader reader;
  reader.SetStream(in);
  // Skipping the pixel data tag makes GDCM seek past its value instead of reading it: the
  // stream stops just after the element's header (0.09 ms for an 8 MB file, against a copy).
  const gdcm::Tag pixel_tag(0x7fe0, 0x0010);
  if (!reader.ReadUpToTag(pixel_tag, {pixel_tag})) return std::nullopt;
  const gdcm::TransferSyntax ts = reader.GetFile().GetHeader().GetDataSetTransferSyntax();
  const bool rle = ts == gdcm::TransferSyntax::RLELossless;
  const bool explicit_vr = ts == gdcm::TransferSyntax::ExplicitVRLittleEndian || rle;
  if (!explicit_vr && ts != gdcm::TransferSyntax::ImplicitVRLittleEndian) return std::nullopt;
  const gdcm::DataSet& ds = reader.GetFile().GetDataSet();
  const auto samples = us_value(ds, 0x0028, 0x0002);
  const auto rows = us_value(ds, 0x0028, 0x0010), cols = us_value(ds, 0x0028, 0x0011);
  const auto alloc = us_value(ds, 0x0028, 0x0100);
  if (!rows || !cols || !alloc || (*alloc != 8 && *alloc != 16)) return std::nullopt;
  if (samples && *samples != 1) return std::nullopt;  // the general path names the problem
  // Find the pixel data element's header at (or just after) where the reader stopped.
  const size_t stop = std::min(reader.GetStreamCurrentPosition(), bytes.size());
  const uint8_t tag_bytes[4] = {0xe0, 0x7f, 0x10, 0x00};
  size_t at = bytes.size();
  for (size_t p = stop >= 16 ? stop - 16 : 0; p + 4 <= bytes.size() && p <= stop + 16; ++p) {
    if (std::memcmp(bytes.data() + p, tag_bytes, 4) == 0) {
      at = p;
      break;
    }
  }
  if (at == bytes.size()) return std::nullopt;
  uint32_t length = 0;
  size_t data_at = 0;
  if (explicit_vr) {
    if (at + 12 > bytes.size()) return std::nullopt;
    std::memcpy(&length, bytes.data() + at + 8, 4);
    data_at = at + 12;
  } else {
    if (at + 8 > bytes.size()) return std::nullopt;
    std::memcpy(&length, bytes.data() + at + 4, 4);
    data_at = at + 8;
  }
  if ((length == 0xffffffffu) != rle) return std::nullopt;  // encapsulated: RLE only
  StoredFormat f;
  f.width = *cols;
  f.height = *rows;
  f.bits_allocated = *alloc;
  f.bits_stored = us_value(ds, 0x0028, 0x0101).value_or(*alloc);
  f.high_bit = us_value(ds, 0x0028, 0x0102).value_or(f.bits_stored - 1);
  f.is_signed = us_value(ds, 0x0028, 0x0103).value_or(0) == 1;
  const std::string pi = element_string(ds, gdcm::Tag(0x0028, 0x0004));
  f.monochrome1 = pi.rfind("MONOCHROME1", 0) == 0;
  read_rescale(ds, f);
  if (rle) {
    StoredPixels n{f, nullptr, {}, file_window(ds)};
    if (pixels) {
      n.decoded = decode_rle_frame(first_frame_at(bytes, data_at, name), 1, f.bits_allocated / 8,
                                   static_cast<size_t>(f.width) * f.height, name);
    }
    return n;
  }
  const size_t need = static_cast<size_t>(f.width) * f.height * (f.bits_allocated / 8);
  if (data_at + std::min<size_t>(length, need) > bytes.size() || data_at + need > bytes.size()) {
    COHORT_THROW_AS(DecodeError, name << ": truncated: " << bytes.size()
                                      << " bytes, the pixel data "
                                      << "needs " << data_at + need);
  }
  if (length < need) {
    COHORT_THROW_AS(DecodeError, name << ": " << length << " bytes of pixel data for " << f.width
                                      << "x" << f.height << " at " << f.bits_allocated << " bits");
  }
  return StoredPixels{f, bytes.data() + data_at, {}, file_window(ds)};
}

}  // namespace dicom_impl
}  // namespace cohort::data
