// Every transfer syntax the native paths do not take, through GDCM's image reader, with the
// repairs GDCM needs, in a helper process that dies in GDCM's place (see stored.h).
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

#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <streambuf>

#include "../helper_process.h"
#include "cohort/core/settings.h"

// Where GDCM decodes by default: the helper executable's path, or "off" (in this process: the
// fuzz target, whose sanitizers must see GDCM's faults).
#ifndef COHORT_GDCM_HELPER_DEFAULT
#error "COHORT_GDCM_HELPER_DEFAULT must name the GDCM helper (or be \"off\")"
#endif

namespace cohort::data {
namespace dicom_impl {

// Every transfer syntax the fast paths do not take (JPEG, JPEG-LS, JPEG 2000, big endian,
// deflated): GDCM's image reader decodes the pixels.
// GDCM's image reader asserts, aborting the process, on valid files that have a Frame Increment
// Pointer (0028,0009) and no Number of Frames (0028,0008), as one-frame RT Dose files written by
// other toolkits do, or an RT Dose Grid Frame Offset Vector (3004,000C) of fewer than two values.
// It also asserts on many forms of overlays and curves, which Cohort does not use, and on a
// Recognition Code that is not ACR-NEMA's.
// Such a file is read as a plain data set; the frame geometry, which decoding the first frame
// does not need, is removed and Number of Frames set to 1 where absent, overlays and curves are
// removed; it is written back to memory, and the image reader reads that. Empty when no repair is
// needed; an error naming the file when one is needed and cannot be made.
// `whole`: the file read whole by a plain reader, sorted as GDCM's image reader will see it
// (reading up to the pixel data stops early at an element out of order, and missed overlays
// after it: fuzz_image); it is edited in place when a repair is needed.
std::string repaired_for_gdcm(gdcm::File& whole, const std::string& name) {
  const gdcm::DataSet& read = whole.GetDataSet();
  const gdcm::Tag frames(0x0028, 0x0008), increment(0x0028, 0x0009), grid(0x3004, 0x000c);
  const std::string offsets = element_string(read, grid);
  const bool short_grid =
      read.FindDataElement(grid) && std::count(offsets.begin(), offsets.end(), '\\') < 1;
  const bool no_frames = read.FindDataElement(increment) && !read.FindDataElement(frames);
  // Overlays (60xx) and curves (50xx): Cohort uses neither, and GDCM's image reader asserts on
  // many of their forms (more than 16 planes, an element it does not know: fuzz_image), so
  // they are left out of what it reads.
  auto overlay_or_curve = [](const gdcm::Tag& t) {
    const uint16_t g = t.GetGroup();
    return (g >= 0x5000 && g <= 0x50ff) || (g >= 0x6000 && g <= 0x60ff);
  };
  const bool extras =
      std::any_of(read.GetDES().begin(), read.GetDES().end(),
                  [&](const gdcm::DataElement& de) { return overlay_or_curve(de.GetTag()); });
  // A Recognition Code (0008,0010) that does not start ACR-NEMA or ACRNEMA: the image reader
  // asserts that it does (fuzz_image). Only an ACR-NEMA file's is of use to it.
  const gdcm::Tag code(0x0008, 0x0010);
  const std::string code_value = element_string(read, code);
  const bool bad_code = read.FindDataElement(code) && !read.GetDataElement(code).IsEmpty() &&
                        code_value.rfind("ACR-NEMA", 0) != 0 && code_value.rfind("ACRNEMA", 0) != 0;
  // A Rescale Intercept without a Rescale Slope, or with an empty one (DICOM has them together):
  // GDCM 3.0.21 then takes the slope of an MR image as 0 and asserts that it is not (a
  // 10-minute fuzz_image campaign). The slope of 1 that DICOM's absence means is written in, as
  // the native path reads it.
  const gdcm::Tag intercept_tag(0x0028, 0x1052), slope_tag(0x0028, 0x1053);
  const bool no_slope =
      read.FindDataElement(intercept_tag) &&
      (!read.FindDataElement(slope_tag) || read.GetDataElement(slope_tag).IsEmpty());
  if (!short_grid && !no_frames && !extras && !bad_code && !no_slope) return {};
  auto cannot = [&]() {
    COHORT_THROW_AS(DecodeError, name << ": its frame geometry, overlays, curves, Recognition "
                                         "Code or missing Rescale Slope, which GDCM's image "
                                         "reader cannot take, cannot be repaired");
  };
  gdcm::DataSet& ds = whole.GetDataSet();
  std::vector<gdcm::Tag> drop;
  for (const gdcm::DataElement& de : ds.GetDES()) {
    if (overlay_or_curve(de.GetTag())) drop.push_back(de.GetTag());
  }
  if (bad_code) drop.push_back(code);
  for (const gdcm::Tag& t : drop) ds.Remove(t);
  if (short_grid || no_frames) {
    ds.Remove(increment);
    ds.Remove(grid);
    if (!ds.FindDataElement(frames)) {
      gdcm::DataElement de(frames);
      de.SetVR(gdcm::VR::IS);
      de.SetByteValue("1 ", 2);
      ds.Insert(de);
    }
  }
  if (no_slope) {
    ds.Remove(slope_tag);
    gdcm::DataElement de(slope_tag);
    de.SetVR(gdcm::VR::DS);
    de.SetByteValue("1 ", 2);
    ds.Insert(de);
  }
  std::ostringstream out;
  gdcm::Writer writer;
  writer.SetStream(out);
  writer.SetFile(whole);
  if (!writer.Write()) cannot();
  return out.str();
}

// 1-bit pixels (masks, overlays), packed eight to a byte with the first pixel in the lowest bit
// (PS3.5 8.1.1), as 8-bit values 0 and 1.
void unpack_bits(std::vector<uint8_t>& raw, size_t px, StoredFormat& f) {
  std::vector<uint8_t> out(px);
  for (size_t i = 0; i < px; ++i) out[i] = (raw[i / 8] >> (i % 8)) & 1u;
  raw = std::move(out);
  f.bits_allocated = 8;
  f.bits_stored = 1;
  f.high_bit = 0;
  f.is_signed = false;
}

// Colour pixels as interleaved RGB: planes (RRR... GGG... BBB...) interleaved, and YBR_FULL
// (full-range YCbCr, PS3.3 C.7.6.3.1.2) converted with its inverse.
void to_interleaved_rgb(std::vector<uint8_t>& raw, size_t px, bool planar, bool ybr) {
  if (planar) {
    std::vector<uint8_t> out(px * 3);
    for (size_t i = 0; i < px; ++i) {
      for (size_t c = 0; c < 3; ++c) out[3 * i + c] = raw[c * px + i];
    }
    std::memcpy(raw.data(), out.data(), px * 3);
  }
  if (!ybr) return;
  auto clamp8 = [](double v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); };
  for (size_t i = 0; i < px; ++i) {
    const double y = raw[3 * i], cb = raw[3 * i + 1] - 128.0, cr = raw[3 * i + 2] - 128.0;
    raw[3 * i] = clamp8(y + 1.402 * cr);
    raw[3 * i + 1] = clamp8(y - 0.344136 * cb - 0.714136 * cr);
    raw[3 * i + 2] = clamp8(y + 1.772 * cb);
  }
}

// GDCM's image reader asserts on attribute values it does not expect. fuzz_image found Samples
// per Pixel above 4 and a PALETTE COLOR image without its lookup tables; its source asserts on
// an unknown Photometric Interpretation too. The pixel module is checked from a plain read of
// the data set first (the whole of it: elements out of order hide behind the pixel data from a
// read that stops there), and such a file refused naming the attribute.
void check_pixel_module(const gdcm::DataSet& ds, const std::string& name) {
  auto refuse = [&](const std::string& what) {
    COHORT_THROW_AS(DecodeError, name << ": " << what);
  };
  // GDCM's image reader reads the image's attributes (groups 0018, 0020, 0028, 3004) through
  // typed attributes, which assert that an element's VR is the dictionary's, or unknown (implicit
  // VR): fuzz_image found High Bit and Number of Frames with other VRs.
  const gdcm::Dict& dict = gdcm::Global::GetInstance().GetDicts().GetPublicDict();
  for (const gdcm::DataElement& de : ds.GetDES()) {
    const gdcm::Tag& t = de.GetTag();
    const uint16_t g = t.GetGroup();
    if (t.IsPrivate() || (g != 0x0018 && g != 0x0020 && g != 0x0028 && g != 0x3004)) continue;
    const gdcm::VR vr = de.GetVR();
    if (vr == gdcm::VR::INVALID || vr == gdcm::VR::UN) continue;
    const gdcm::VR want = dict.GetDictEntry(t).GetVR();
    if (want == gdcm::VR::INVALID || want == gdcm::VR::UN || want.Compatible(vr)) continue;
    char tag[16];
    std::snprintf(tag, sizeof tag, "(%04x,%04x)", g, t.GetElement());
    refuse(std::string("element ") + tag + " has VR " + gdcm::VR::GetVRString(vr) +
           " where DICOM says " + gdcm::VR::GetVRString(want));
  }
  // A Rescale Slope of 0, at the top or in a functional group's sequence: GDCM asserts that the
  // slope it takes is not 0 (fuzz_image, in the 20 s run of scripts/test).
  const gdcm::Tag slope_tag(0x0028, 0x1053);
  std::function<void(const gdcm::DataSet&, int)> slopes = [&](const gdcm::DataSet& d, int depth) {
    if (depth > 16) return;
    for (const gdcm::DataElement& de : d.GetDES()) {
      if (de.GetTag() == slope_tag) {
        const gdcm::ByteValue* bv = de.GetByteValue();
        const auto v = bv ? first_number(std::string(bv->GetPointer(), bv->GetLength()))
                          : std::optional<double>();
        if (v && *v == 0) refuse("Rescale Slope (0028,1053) is 0");
      }
      const auto* sq =
          de.IsEmpty() ? nullptr : dynamic_cast<const gdcm::SequenceOfItems*>(&de.GetValue());
      if (sq) {
        for (size_t i = 1; i <= sq->GetNumberOfItems(); ++i) {
          slopes(sq->GetItem(i).GetNestedDataSet(), depth + 1);
        }
      }
    }
  };
  slopes(ds, 0);
  const auto planar = us_value(ds, 0x0028, 0x0006);
  if (planar && *planar > 1) {
    refuse("Planar Configuration (0028,0006) is " + std::to_string(*planar) +
           "; DICOM allows 0 or 1");
  }
  // Pixel Representation other than 0 (unsigned) or 1 (signed): GDCM asserts on the scalar type
  // it makes of it (fuzz_image: 14382).
  const auto representation = us_value(ds, 0x0028, 0x0103);
  if (representation && *representation > 1) {
    refuse("Pixel Representation (0028,0103) is " + std::to_string(*representation) +
           "; DICOM allows 0 (unsigned) or 1 (signed)");
  }
  const auto spp = us_value(ds, 0x0028, 0x0002);
  // 4 samples (ARGB, CMYK: retired) are allowed by DICOM but read by nothing here, and GDCM's
  // RLE decoder asserts on them (found by fuzz_image): refused before GDCM sees them.
  if (spp && *spp != 1 && *spp != 3) {
    refuse("Samples per Pixel (0028,0002) is " + std::to_string(*spp) +
           "; grayscale (1) or colour (3) DICOM only");
  }
  // Nor those that say 4 samples by their Photometric Interpretation, whatever Samples per
  // Pixel says: GDCM takes the 4 from it, and its RLE decoder asserts while the reader reads
  // (fuzz_image: CMYK with 3 samples).
  std::string photometric = element_string(ds, gdcm::Tag(0x0028, 0x0004));
  while (!photometric.empty() && (photometric.back() == ' ' || photometric.back() == '\0'))
    photometric.pop_back();
  if (photometric == "CMYK" || photometric == "ARGB") {
    refuse("Photometric Interpretation (0028,0004) is " + photometric +
           ", 4 samples per pixel; grayscale or colour (RGB, YBR) DICOM only");
  }
  // Bits Stored above Bits Allocated, or High Bit past Bits Stored (after GDCM's reading of
  // 0xffff, 0x0fff and 0x00ff as 16, 12 and 8).
  auto bits = [&](uint16_t e) -> std::optional<int> {
    auto v = us_value(ds, 0x0028, e);
    if (v && (*v == 0xffff || *v == 0x0fff || *v == 0x00ff))
      v = *v == 0xffff ? 16 : *v == 0x0fff ? 12 : 8;
    return v;
  };
  const auto allocated = bits(0x0100), stored = bits(0x0101), high = bits(0x0102);
  if (!allocated || *allocated == 0) refuse("no Bits Allocated (0028,0100)");
  // Unused bits in a sample of other than 16 bits: GDCM clears unused bits of 16-bit samples
  // only, and asserts on any other (fuzz_image: 32 bits allocated and 1 stored; 8-bit RGB with
  // 3 stored). (8-bit grayscale in little endian, read without GDCM, may have them.)
  if (stored && *stored != *allocated && *allocated != 16) {
    refuse("Bits Stored (0028,0101) " + std::to_string(*stored) + " in " +
           std::to_string(*allocated) +
           " bits allocated; GDCM's decoders take unused bits in 16-bit samples only");
  }
  if (stored && *stored > *allocated) {
    refuse("Bits Stored (0028,0101) " + std::to_string(*stored) + " exceeds Bits Allocated " +
           std::to_string(*allocated));
  }
  if (stored && high && *high >= *stored && *stored > 0) {
    refuse("High Bit (0028,0102) " + std::to_string(*high) + " is not below Bits Stored " +
           std::to_string(*stored));
  }
  // A High Bit at or beyond the bits allocated, which Bits Stored, when missing, cannot catch:
  // GDCM then takes a sample type it has not and asserts (fuzz_image: 1 bit allocated, signed,
  // High Bit 15, no Bits Stored).
  if (high && *high >= *allocated) {
    refuse("High Bit (0028,0102) " + std::to_string(*high) + " is not below Bits Allocated " +
           std::to_string(*allocated));
  }
  // The image reader allocates every frame (see kMaxDecodedBytes).
  const double frames =
      std::max(1.0, first_number(element_string(ds, gdcm::Tag(0x0028, 0x0008))).value_or(1.0));
  const double decoded = static_cast<double>(us_value(ds, 0x0028, 0x0010).value_or(0)) *
                         us_value(ds, 0x0028, 0x0011).value_or(0) * spp.value_or(1) *
                         std::max(1, us_value(ds, 0x0028, 0x0100).value_or(8) / 8) * frames;
  if (decoded > static_cast<double>(kMaxDecodedBytes)) {
    refuse("declares " + std::to_string(static_cast<int64_t>(decoded / (1 << 20))) +
           " MiB of pixels: more than the " + std::to_string(kMaxDecodedBytes >> 20) +
           " MiB an image may take");
  }
  std::string pi = element_string(ds, gdcm::Tag(0x0028, 0x0004));
  while (!pi.empty() && (pi.back() == ' ' || pi.back() == '\0')) pi.pop_back();
  static const char* const kKnown[] = {"MONOCHROME1",
                                       "MONOCHROME2",
                                       "PALETTE COLOR",
                                       "RGB",
                                       "HSV",
                                       "ARGB",
                                       "CMYK",
                                       "YBR_FULL",
                                       "YBR_FULL_422",
                                       "YBR_PARTIAL_422",
                                       "YBR_PARTIAL_420",
                                       "YBR_ICT",
                                       "YBR_RCT"};
  if (!pi.empty() &&
      std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return pi == k; })) {
    refuse("Photometric Interpretation (0028,0004) '" + pi + "' is none DICOM defines");
  }
  if (pi == "PALETTE COLOR") {
    for (uint16_t i = 0; i < 3; ++i) {
      const gdcm::Tag descriptor(0x0028, static_cast<uint16_t>(0x1101 + i));
      const gdcm::Tag lut(0x0028, static_cast<uint16_t>(0x1201 + i));
      const gdcm::Tag segmented(0x0028, static_cast<uint16_t>(0x1221 + i));
      const std::string d = element_string(ds, descriptor);
      if (d.size() != 6)
        refuse("a PALETTE COLOR image without its LUT descriptor " + std::string(i == 0 ? "red"
                                                                                 : i == 1
                                                                                     ? "green"
                                                                                     : "blue"));
      uint16_t v[3];
      std::memcpy(v, d.data(), 6);
      if (ds.FindDataElement(lut)) {
        const size_t want = (v[0] ? v[0] : 65536u) * static_cast<size_t>(v[2]) / 8;
        const gdcm::ByteValue* bv = ds.GetDataElement(lut).GetByteValue();
        if (bv && bv->GetLength() != want) {
          refuse("a PALETTE COLOR lookup table of " + std::to_string(bv->GetLength()) +
                 " bytes where its descriptor says " + std::to_string(want));
        }
      } else if (!ds.FindDataElement(segmented)) {
        refuse("a PALETTE COLOR image without its lookup table data");
      }
    }
  }
}

// RLE pixel data, every frame decoded by Cohort's decoder (decode_rle_frame) before GDCM's image
// reader sees the file: that reader decodes RLE while it reads (for its lossy flag), and its
// decoder crashes on a malformed frame (fuzz_image: a header declaring millions of segments).
// Returns the first frame, which is then the image's pixels (GDCM's places 16-bit colour
// wrongly). Empty when the pixel data is not RLE.
std::vector<uint8_t> decode_rle_frames(const gdcm::File& file, const std::string& name) {
  if (file.GetHeader().GetDataSetTransferSyntax() != gdcm::TransferSyntax::RLELossless) return {};
  const gdcm::DataSet& ds = file.GetDataSet();
  auto refuse = [&](const std::string& what) {
    COHORT_THROW_AS(DecodeError, name << ": RLE pixel data: " << what);
  };
  const int alloc = us_value(ds, 0x0028, 0x0100).value_or(0);
  if (alloc != 8 && alloc != 16 && alloc != 32) {
    refuse(std::to_string(alloc) + " bits allocated; RLE is read at 8, 16 or 32 bits");
  }
  const gdcm::Tag pixel_tag(0x7fe0, 0x0010);
  const gdcm::SequenceOfFragments* frags =
      ds.FindDataElement(pixel_tag) ? ds.GetDataElement(pixel_tag).GetSequenceOfFragments()
                                    : nullptr;
  if (!frags || frags->GetNumberOfFragments() == 0) refuse("no fragment");
  const size_t pixels = static_cast<size_t>(us_value(ds, 0x0028, 0x0010).value_or(0)) *
                        static_cast<size_t>(us_value(ds, 0x0028, 0x0011).value_or(0));
  const int samples = us_value(ds, 0x0028, 0x0002).value_or(1);
  std::vector<uint8_t> first;
  for (size_t f = 0; f < frags->GetNumberOfFragments(); ++f) {
    const gdcm::ByteValue* bv = frags->GetFragment(f).GetByteValue();
    if (!bv) refuse("fragment " + std::to_string(f) + " has no value");
    auto frame =
        decode_rle_frame({reinterpret_cast<const uint8_t*>(bv->GetPointer()), bv->GetLength()},
                         samples, alloc / 8, pixels, name);
    if (f == 0) first = std::move(frame);
  }
  return first;
}

// The first fragment of encapsulated pixel data (the first frame's), or null.
const gdcm::ByteValue* first_fragment(const gdcm::DataSet& ds) {
  const gdcm::Tag tag(0x7fe0, 0x0010);
  if (!ds.FindDataElement(tag)) return nullptr;
  const gdcm::SequenceOfFragments* frags = ds.GetDataElement(tag).GetSequenceOfFragments();
  return frags && frags->GetNumberOfFragments() > 0 ? frags->GetFragment(0).GetByteValue()
                                                    : nullptr;
}

// Whether a JPEG stream says its three components are YCbCr: a JFIF header, or an Adobe one
// with a colour transform. Without either, libjpeg assumes YCbCr (unless the component ids are
// 'R', 'G', 'B'), which is wrong for RGB streams that carry no marker (pydicom's
// SC_jpeg_no_color_transform.dcm).
bool jpeg_declares_ycbcr(const uint8_t* p, size_t n) {
  size_t i = 2;  // after SOI
  while (i + 4 <= n && p[i] == 0xff) {
    const uint8_t m = p[i + 1];
    if (m == 0xff) {  // fill byte
      ++i;
      continue;
    }
    if (m == 0xda || m == 0xd9) break;  // start of scan, end of image
    const size_t len = static_cast<size_t>(p[i + 2]) << 8 | p[i + 3];
    if (len < 2 || i + 2 + len > n) break;
    const uint8_t* payload = p + i + 4;
    const size_t size = len - 2;
    if (m == 0xe0 && size >= 5 && std::memcmp(payload, "JFIF\0", 5) == 0) return true;
    if (m == 0xee && size >= 12 && std::memcmp(payload, "Adobe", 5) == 0) return payload[11] != 0;
    i += 2 + len;
  }
  return false;
}

StoredPixels decode_with_gdcm(std::span<const uint8_t> bytes, const std::string& name) {
  // The whole data set, read once by a plain reader: checked, RLE decoded, and repaired where
  // GDCM's image reader would assert.
  std::vector<uint8_t> rle;  // the first frame, when the pixel data is RLE
  std::string repaired;
  {
    SpanBuf buf(bytes.data(), bytes.size());
    std::istream in(&buf);
    gdcm::Reader whole;
    whole.SetStream(in);
    if (!whole.Read()) COHORT_THROW_AS(DecodeError, name << ": not a readable DICOM data set");
    check_pixel_module(whole.GetFile().GetDataSet(), name);
    rle = decode_rle_frames(whole.GetFile(), name);
    repaired = repaired_for_gdcm(whole.GetFile(), name);
  }
  if (!repaired.empty()) {
    bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(repaired.data()),
                                     repaired.size());
  }
  SpanBuf buf(bytes.data(), bytes.size());
  std::istream in(&buf);
  gdcm::ImageReader reader;
  reader.SetStream(in);
  if (!reader.Read()) COHORT_THROW_AS(DecodeError, name << ": not a readable DICOM image");
  const gdcm::Image& img = reader.GetImage();
  const unsigned* dims = img.GetDimensions();
  const gdcm::PixelFormat pf = img.GetPixelFormat();
  const unsigned samples = pf.GetSamplesPerPixel();
  const gdcm::PhotometricInterpretation pi = img.GetPhotometricInterpretation();
  if (samples != 1 && samples != 3) {
    COHORT_THROW_AS(DecodeError,
                    name << ": " << samples << " samples per pixel; grayscale or RGB DICOM only");
  }
  // Colour: RGB, YBR_FULL, or YBR_FULL_422 (native: GDCM expands each pair's shared chroma to
  // YBR_FULL; JPEG: libjpeg hands out RGB), in 8, 16 or 32 bits (scaled to 8), unsigned.
  const bool ybr422 = pi == gdcm::PhotometricInterpretation::YBR_FULL_422;
  if (samples == 3 &&
      ((pf.GetBitsAllocated() != 8 && pf.GetBitsAllocated() != 16 && pf.GetBitsAllocated() != 32) ||
       pf.GetPixelRepresentation() != 0 ||
       (pi != gdcm::PhotometricInterpretation::RGB &&
        pi != gdcm::PhotometricInterpretation::YBR_FULL && !ybr422))) {
    COHORT_THROW_AS(DecodeError, name << ": colour as " << pi << " at " << pf.GetBitsAllocated()
                                      << (pf.GetPixelRepresentation() ? " signed" : "")
                                      << " bits; colour DICOM is read as unsigned 8-, 16- or "
                                         "32-bit RGB, YBR_FULL or YBR_FULL_422");
  }
  const int W = static_cast<int>(dims[0]), H = static_cast<int>(dims[1]);
  const size_t len = img.GetBufferLength();
  // GDCM reads a truncated file without complaint and pads what is missing: the declared
  // lengths of the header and the data set must fit in the bytes we have.
  const gdcm::File& file = reader.GetFile();
  const gdcm::TransferSyntax ts = file.GetHeader().GetDataSetTransferSyntax();
  const bool explicit_vr = ts.IsExplicit();
  // Fragments where they cannot be (a transfer syntax that is not encapsulated, or a VR other
  // than OB/OW, as in pydicom's SC_rgb_jpeg.dcm): GDCM reads such a file, then asserts, aborting
  // the process, when asked the data set's length or its pixels.
  for (const gdcm::DataElement& de : file.GetDataSet().GetDES()) {
    if (!de.GetSequenceOfFragments()) continue;
    if (!ts.IsEncapsulated() || (explicit_vr && !(de.GetVR() & gdcm::VR::OB_OW))) {
      COHORT_THROW_AS(DecodeError, name << ": element " << de.GetTag()
                                        << " holds fragments with VR " << de.GetVR()
                                        << " under transfer syntax " << ts
                                        << "; only encapsulated OB/OW pixel data may");
    }
  }
  // A deflated data set's declared lengths are those of the inflated data, not of the file.
  const bool deflated = ts == gdcm::TransferSyntax::DeflatedExplicitVRLittleEndian;
  const uint64_t declared =
      static_cast<uint64_t>(file.GetHeader().GetFullLength()) +
      static_cast<uint64_t>(explicit_vr ? file.GetDataSet().GetLength<gdcm::ExplicitDataElement>()
                                        : file.GetDataSet().GetLength<gdcm::ImplicitDataElement>());
  if (!deflated && declared > bytes.size()) {
    COHORT_THROW_AS(DecodeError,
                    name << ": truncated: " << bytes.size() << " of " << declared << " bytes");
  }
  // Native pixel data shorter than the image: GDCM's raw codec copies the image's length out of
  // it regardless, reading past its buffer (AddressSanitizer under fuzz_image).
  // 1-bit masks are measured in bits: GDCM's length for them counts a partial byte per row, and
  // its raw codec fills a short mask's buffer all the same (a 683-byte file declaring 2060 x
  // 65296 pixels decoded to 134 M pixels, 10 s under fuzz_image).
  if (!ts.IsEncapsulated() && !deflated) {
    const gdcm::Tag pixel_tag(0x7fe0, 0x0010);
    const gdcm::ByteValue* bv = file.GetDataSet().FindDataElement(pixel_tag)
                                    ? file.GetDataSet().GetDataElement(pixel_tag).GetByteValue()
                                    : nullptr;
    // YBR_FULL_422 stores 2 bytes per pixel where the expanded image has 3; a mask, a bit (of
    // its first frame, the one decoded).
    const size_t stored = pf.GetBitsAllocated() == 1 ? (static_cast<size_t>(W) * H + 7) / 8
                                                     : (ybr422 ? len / 3 * 2 : len);
    if (!bv || bv->GetLength() < stored) {
      COHORT_THROW_AS(DecodeError, name << ": "
                                        << (bv ? static_cast<uint32_t>(bv->GetLength()) : 0u)
                                        << " bytes of pixel data for an image of " << len);
    }
  }
  std::vector<uint8_t> raw(len);
  const size_t frame_px = static_cast<size_t>(W) * H;
  // RLE was decoded above (interleaved, whatever Planar Configuration says).
  const bool is_rle = ts == gdcm::TransferSyntax::RLELossless;
  if (is_rle) {
    raw = std::move(rle);
    const size_t want = frame_px * samples * (pf.GetBitsAllocated() / 8);
    if (raw.size() != want) {
      COHORT_THROW_AS(DecodeError, name << ": an RLE frame of " << raw.size() << " bytes for a "
                                        << W << "x" << H << " image of " << want);
    }
  } else if (!img.GetBuffer(reinterpret_cast<char*>(raw.data()))) {
    COHORT_THROW_AS(DecodeError, name << ": pixel data cannot be decoded (transfer syntax "
                                      << reader.GetFile().GetHeader().GetDataSetTransferSyntax()
                                      << ")");
  }
  const size_t px = frame_px;  // first frame only
  const int alloc = pf.GetBitsAllocated();
  const bool one_or_32 = (samples == 1 && alloc == 1) || alloc == 32;
  const size_t need = alloc == 1 ? (px + 7) / 8 : px * static_cast<size_t>(alloc / 8) * samples;
  if ((alloc != 8 && alloc != 16 && !one_or_32) || len < need) {
    COHORT_THROW_AS(DecodeError, name << ": " << alloc << " bits allocated, " << len
                                      << " bytes of pixel data for " << W << "x" << H);
  }
  StoredFormat f;
  f.width = W;
  f.height = H;
  f.bits_allocated = alloc;
  f.bits_stored = pf.GetBitsStored();
  f.high_bit = pf.GetHighBit();
  if (samples == 3 && alloc > 8) {
    // 16- and 32-bit colour to 8 bits: each sample's stored bits scaled onto 0..255, rounded.
    // (Big-endian 32-bit samples come from GDCM with their 16-bit halves exchanged, as below.)
    const int bits = std::clamp(f.bits_stored > 0 ? f.bits_stored : alloc, 1, alloc);
    const uint64_t top = (uint64_t{1} << bits) - 1;
    const bool halves_exchanged = alloc == 32 && ts == gdcm::TransferSyntax::ExplicitVRBigEndian;
    const size_t n = px * 3;
    for (size_t i = 0; i < n; ++i) {
      uint64_t v;
      if (alloc == 16) {
        uint16_t s;
        std::memcpy(&s, raw.data() + 2 * i, 2);
        v = s;
      } else {
        uint32_t s;
        std::memcpy(&s, raw.data() + 4 * i, 4);
        v = halves_exchanged ? (s << 16 | s >> 16) : s;
      }
      raw[i] = static_cast<uint8_t>(((v & top) * 255u + top / 2) / top);
    }
    raw.resize(n);
    f.bits_allocated = f.bits_stored = 8;
    f.high_bit = 7;
  }
  f.is_signed = pf.GetPixelRepresentation() == 1;
  f.monochrome1 =
      img.GetPhotometricInterpretation() == gdcm::PhotometricInterpretation::MONOCHROME1;
  // The rescale as the native path reads it; GDCM's where the top level has none (an enhanced
  // image's functional groups, which GDCM reads).
  if (!read_rescale(reader.GetFile().GetDataSet(), f)) {
    f.slope = img.GetSlope();
    f.intercept = img.GetIntercept();
  }
  f.samples = static_cast<int>(samples);
  if (alloc == 1) unpack_bits(raw, px, f);
  // GDCM swaps big-endian data to the host's order in 16-bit words, which leaves a 32-bit value's
  // halves exchanged (checked against pydicom's rtdose_expb.dcm).
  if (alloc == 32 && samples == 1 && ts == gdcm::TransferSyntax::ExplicitVRBigEndian) {
    for (size_t i = 0; i < px; ++i) {
      uint32_t u;
      std::memcpy(&u, raw.data() + 4 * i, 4);
      u = (u << 16) | (u >> 16);
      std::memcpy(raw.data() + 4 * i, &u, 4);
    }
  }
  // GDCM's JPEG decoders hand out RGB already (libjpeg converts YCbCr); native and RLE data
  // come as stored. Checked against pydicom on its colour test files.
  const bool jpeg_family = ts.IsEncapsulated() && ts != gdcm::TransferSyntax::RLELossless;
  // Except a JPEG labelled RGB whose stream is YCbCr (GDCM's own JPEG writer makes such files):
  // GDCM then trusts the label and hands out Y, Cb, Cr. The stream decides where it says so
  // (JFIF, Adobe's transform) or where its chroma is subsampled, which no RGB stream is; a
  // stream that says nothing keeps the label.
  bool jpeg_ycbcr = false;
  if (samples == 3 && jpeg_family && pi == gdcm::PhotometricInterpretation::RGB) {
    const gdcm::ByteValue* first = first_fragment(file.GetDataSet());
    tjhandle tj = tjInitDecompress();
    int w = 0, h = 0, sub = 0, cs = -1;
    if (tj && first &&
        tjDecompressHeader3(tj, reinterpret_cast<const unsigned char*>(first->GetPointer()),
                            first->GetLength(), &w, &h, &sub, &cs) == 0) {
      const auto* stream = reinterpret_cast<const uint8_t*>(first->GetPointer());
      jpeg_ycbcr = cs == TJCS_YCbCr && (jpeg_declares_ycbcr(stream, first->GetLength()) ||
                                        (sub != TJSAMP_444 && sub != TJSAMP_GRAY));
    }
    if (tj) tjDestroy(tj);
  }
  if (samples == 3)
    to_interleaved_rgb(
        raw, px, img.GetPlanarConfiguration() == 1 && !is_rle,
        ((pi == gdcm::PhotometricInterpretation::YBR_FULL || ybr422) && !jpeg_family) ||
            jpeg_ycbcr);
  return StoredPixels{f, nullptr, std::move(raw), file_window(reader.GetFile().GetDataSet())};
}

// decode_with_gdcm's result on the helper's wire: the format and window, then the pixels.
struct WireStored {
  int32_t width, height, bits_allocated, bits_stored, high_bit, samples;
  uint8_t is_signed, monochrome1, has_window, exact_window;
  double slope, intercept, center, window_width;
};

HelperResult to_wire(StoredPixels p) {
  const StoredFormat& f = p.format;
  const WireStored w{f.width,
                     f.height,
                     f.bits_allocated,
                     f.bits_stored,
                     f.high_bit,
                     f.samples,
                     f.is_signed,
                     f.monochrome1,
                     p.window.has_value(),
                     p.window && p.window->exact,
                     f.slope,
                     f.intercept,
                     p.window ? p.window->center : 0.0,
                     p.window ? p.window->width : 0.0};
  return {std::string(reinterpret_cast<const char*>(&w), sizeof w), std::move(p.decoded)};
}

StoredPixels from_wire(HelperReply r, const std::string& name) {
  WireStored w;
  COHORT_CHECK(r.head.size() == sizeof w, name << ": the decoding helper replied with a record of "
                                               << r.head.size() << " bytes, not " << sizeof w);
  std::memcpy(&w, r.head.data(), sizeof w);
  StoredPixels p;
  p.format = StoredFormat{w.width,     w.height,         w.bits_allocated,   w.bits_stored,
                          w.high_bit,  w.is_signed != 0, w.monochrome1 != 0, w.slope,
                          w.intercept, w.samples};
  if (w.has_window) p.window = Window{w.center, w.window_width, w.exact_window != 0};
  p.decoded = std::move(r.body);
  return p;
}

// GDCM asserts (aborting the process) and loops on inputs nobody has thought of yet; each one
// found is refused above before GDCM reads it, but the next is only found by a crash. So the
// transfer syntaxes that need GDCM's image reader decode in a helper process per thread
// (COHORT_GDCM_HELPER: its path, or "off" for this process), which dies in GDCM's place.
// The native and RLE fast paths, our own code, stay here.
StoredPixels decode_general(std::span<const uint8_t> bytes, const std::string& name) {
  // Read when the thread first needs GDCM, as its helper starts.
  thread_local const env::Settings settings = env::Settings::read();
  const std::string helper = settings.gdcm_helper.value_or(COHORT_GDCM_HELPER_DEFAULT);
  if (helper == "off") return decode_with_gdcm(bytes, name);
  HelperReply r = ask_helper(helper, name, bytes, settings.decode_timeout_s);
  if (!r.ok) COHORT_THROW_AS(DecodeError, r.head);
  return from_wire(std::move(r), name);
}

}  // namespace dicom_impl

using namespace dicom_impl;

int serve_gdcm_decoding() {
  quiet_gdcm();
  // Fault injection for the tests of what a dying decoder does to its caller:
  // "abort:TEXT" or "hang:TEXT" for a file whose name holds TEXT.
  const std::string fault = env::Settings::read().gdcm_helper_fault;
  const size_t colon = fault.find(':');
  return serve_helper([&](std::span<const uint8_t> bytes, const std::string& name) {
    if (colon != std::string::npos && name.find(fault.substr(colon + 1)) != std::string::npos) {
      const std::string kind = fault.substr(0, colon);
      std::fprintf(stderr, "cohort-gdcm: injected fault (%s) on %s\n", kind.c_str(), name.c_str());
      if (kind == "abort") std::abort();
      if (kind == "hang")
        for (;;) ::pause();
    }
    return to_wire(decode_with_gdcm(bytes, name));
  });
}

}  // namespace cohort::data
