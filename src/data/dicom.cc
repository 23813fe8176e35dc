#include "cohort/data/dicom.h"

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

#include "cohort/core/settings.h"
#include "cohort/data/ops.h"
#include "helper_process.h"

// Where GDCM decodes by default: the helper executable's path, or "off" (in this process: the
// fuzz target, whose sanitizers must see GDCM's faults).
#ifndef COHORT_GDCM_HELPER_DEFAULT
#error "COHORT_GDCM_HELPER_DEFAULT must name the GDCM helper (or be \"off\")"
#endif

namespace cohort::data {

namespace {

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

std::optional<double> first_number(const std::string& s) {
  // Window values are a multi-valued decimal string ("40\400"): take the first.
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) return std::nullopt;
  return v;
}

std::string element_string(const gdcm::DataSet& ds, const gdcm::Tag& t) {
  if (!ds.FindDataElement(t)) return "";
  const gdcm::DataElement& de = ds.GetDataElement(t);
  const gdcm::ByteValue* bv = de.GetByteValue();
  if (!bv) return "";
  return std::string(bv->GetPointer(), bv->GetLength());
}

// GDCM prints its warnings to stderr; Cohort reports what matters with the file's name.
void quiet_gdcm() {
  static const bool once = [] {
    gdcm::Trace::WarningOff();
    gdcm::Trace::DebugOff();
    gdcm::Trace::ErrorOff();  // a file GDCM cannot read is refused with a DecodeError naming it
    return true;
  }();
  (void)once;
}

// GDCM asserts, aborting the process, on element headers it cannot read whole, and allocates
// whatever length an element declares before reading it: fuzz_image found both within minutes
// (a meta group length that runs into bytes that are no element; a value representation of two
// zero bytes; 2-3 GB lengths). So before GDCM sees a file, its structure is walked here, every
// step checked against the file's size: the meta group as GDCM reads it; then the data set,
// explicit VR (little or big endian: every element, sequence, item and pixel-data fragment) or
// implicit VR (every length, and the items of undefined-length elements), to the end. A file
// that breaks the structure is refused naming the byte. Deflated data sets, and the inside of a
// UN of undefined length, are left to GDCM.
class StructureWalk {
 public:
  StructureWalk(std::span<const uint8_t> b, const std::string& name) : b_(b), name_(name) {}

  void run() {
    size_t at = b_.size() >= 132 && std::memcmp(b_.data() + 128, "DICM", 4) == 0 ? 132 : 0;
    std::string syntax;
    if (at + 4 <= b_.size() && u16(at) == 0x0002) {
      const size_t meta_at = at;
      at = meta(at, &syntax);
      // GDCM then reads the data set element by element as explicit or implicit, little
      // endian, which no walk here can follow (fuzz_image: it asserted on an element this walk
      // read as big endian). pydicom refuses such a file too (its meta_missing_tsyntax.dcm).
      if (syntax.empty()) {
        bad(meta_at, "file meta information without a Transfer Syntax UID (0002,0010)");
      }
    } else if (at == 132) {
      // A preamble with no meta group after it: GDCM then guesses the encoding (fuzz_image: it
      // chose big endian and allocated a 2.3 GB element), which this walk cannot follow.
      bad(at, "no file meta information after the DICM preamble");
    }
    while (!syntax.empty() && (syntax.back() == '\0' || syntax.back() == ' ')) syntax.pop_back();
    const bool implicit_le = syntax.empty() ? !looks_explicit(at) : syntax == "1.2.840.10008.1.2";
    const bool explicit_le = syntax.empty() ? looks_explicit(at)
                                            : syntax != "1.2.840.10008.1.2" &&
                                                  syntax != "1.2.840.10008.1.2.2" &&
                                                  syntax != "1.2.840.10008.1.2.1.99";
    // No meta group and a first group 0x0008 stored big endian: GDCM reads the file as big
    // endian (fuzz_image: a 2.3 GB element length read that way).
    const bool guessed_big =
        syntax.empty() && at + 2 <= b_.size() && b_[at] == 0x00 && b_[at + 1] == 0x08;
    if (syntax == "1.2.840.10008.1.2.2" || guessed_big) {  // the same walks, swapped
      big_ = true;
      // Declared explicit, walked explicit (as little endian is): a first element without a VR
      // is refused, not walked as implicit, since GDCM then reads the rest otherwise than this
      // walk would (fuzz_image: it took bytes of a value for a 775 MB length, and cleared that
      // much memory before it found the file short).
      if (!guessed_big || looks_explicit(at)) {
        elements(at, b_.size(), 0);
      } else {
        implicit_elements(at, b_.size(), 0);
      }
    } else if (explicit_le) {
      elements(at, b_.size(), 0);
    } else if (implicit_le) {
      implicit_elements(at, b_.size(), 0);
    }
  }

 private:
  static constexpr uint32_t kUndefined = 0xffffffffu;
  std::span<const uint8_t> b_;
  const std::string& name_;
  bool big_ = false;  // the data set's numbers (the meta group is always little endian)

  uint16_t u16(size_t p) const {
    return big_ ? static_cast<uint16_t>((b_[p] << 8) | b_[p + 1])
                : static_cast<uint16_t>(b_[p] | (b_[p + 1] << 8));
  }
  uint32_t u32(size_t p) const {
    return big_ ? static_cast<uint32_t>((u16(p) << 16) | u16(p + 2))
                : static_cast<uint32_t>(u16(p) | (u16(p + 2) << 16));
  }
  [[noreturn]] void bad(size_t at, const std::string& what) const {
    COHORT_THROW_AS(DecodeError, name_ << ": malformed DICOM at byte " << at << " of " << b_.size()
                                       << ": " << what);
  }
  std::string tag(size_t at) const {
    char t[16];
    std::snprintf(t, sizeof t, "(%04x,%04x)", u16(at), u16(at + 2));
    return t;
  }
  static bool valid_vr(const char* v) {
    static const char* const kVrs[] = {"AE", "AS", "AT", "CS", "DA", "DS", "DT", "FL", "FD",
                                       "IS", "LO", "LT", "OB", "OD", "OF", "OL", "OV", "OW",
                                       "PN", "SH", "SL", "SQ", "SS", "ST", "SV", "TM", "UC",
                                       "UI", "UL", "UN", "UR", "US", "UT", "UV"};
    return std::any_of(std::begin(kVrs), std::end(kVrs),
                       [v](const char* k) { return v[0] == k[0] && v[1] == k[1]; });
  }
  static bool long_vr(const char* v) {
    static const char* const kLong[] = {"OB", "OD", "OF", "OL", "OV", "OW", "SQ",
                                        "SV", "UC", "UN", "UR", "UT", "UV"};
    return std::any_of(std::begin(kLong), std::end(kLong),
                       [v](const char* k) { return v[0] == k[0] && v[1] == k[1]; });
  }
  bool looks_explicit(size_t at) const {
    if (at + 6 > b_.size()) return false;
    const char v[2] = {static_cast<char>(b_[at + 4]), static_cast<char>(b_[at + 5])};
    return valid_vr(v);
  }
  // One explicit VR little endian element header at `at`: its VR, value length and header size.
  struct Header {
    char vr[3] = {0, 0, 0};
    uint32_t length = 0;
    size_t size = 0;
  };
  Header header(size_t at, size_t end) const {
    if (at + 8 > end) bad(at, "a truncated element header");
    Header h;
    h.vr[0] = static_cast<char>(b_[at + 4]);
    h.vr[1] = static_cast<char>(b_[at + 5]);
    if (!valid_vr(h.vr)) {
      bad(at, "element " + tag(at) + " has no value representation (bytes " +
                  std::to_string(b_[at + 4]) + ", " + std::to_string(b_[at + 5]) + ")");
    }
    if (long_vr(h.vr)) {
      if (at + 12 > end) bad(at, "a truncated element header");
      h.length = u32(at + 8);
      h.size = 12;
    } else {
      h.length = u16(at + 6);
      h.size = 8;
    }
    return h;
  }
  // The meta group as GDCM reads it (its FileMetaInformation asserts on a tag, length or value
  // it cannot read whole, on a sequence, on an undefined length): every (0002,xxxx) element,
  // past the group's stated length too, explicit VR, or implicit when the first element has no
  // VR (as some old GE files have); then at least the next tag.
  size_t meta(size_t at, std::string* syntax) const {
    size_t end = b_.size();  // by the group's (0002,0000) length, when it states one
    if (at + 6 <= b_.size() && !looks_explicit(at)) {
      while (at + 4 <= b_.size() && u16(at) == 0x0002) {
        if (at + 8 > b_.size()) bad(at, "a truncated element header");
        const uint32_t length = u32(at + 4);
        if (length == kUndefined || at + 8 + length > b_.size()) {
          bad(at,
              "element " + tag(at) + " of " + std::to_string(length) + " bytes runs past the end");
        }
        if (u16(at + 2) == 0x0010) {
          syntax->assign(reinterpret_cast<const char*>(b_.data()) + at + 8, length);
        }
        at += 8 + length;
      }
      if (at + 4 > b_.size()) bad(at, "no data set after the file meta information");
      return at;
    }
    for (bool first = true; at + 4 <= b_.size() && u16(at) == 0x0002; first = false) {
      const Header h = header(at, b_.size());
      if (h.vr[0] == 'S' && h.vr[1] == 'Q') bad(at, "a sequence in the file meta information");
      if (h.length == kUndefined || at + h.size + h.length > b_.size()) {
        bad(at, "element " + tag(at) + " " + h.vr + " of " + std::to_string(h.length) +
                    " bytes runs past the end");
      }
      if (first && u16(at + 2) == 0x0000 && h.length == 4) {
        end = at + h.size + 4 + u32(at + h.size);
        if (end > b_.size()) bad(at, "the meta group's length runs past the end of the file");
      }
      if (u16(at + 2) == 0x0010) {
        syntax->assign(reinterpret_cast<const char*>(b_.data()) + at + h.size, h.length);
      }
      at += h.size + h.length;
    }
    if (end != b_.size() && at < end) {
      bad(at, "the meta group's length says it ends at byte " + std::to_string(end) +
                  ", its elements end here");
    }
    if (at + 4 > b_.size()) bad(at, "no data set after the file meta information");
    return at;
  }
  // A sequence or item delimiter at `at` (its header read whole by the caller): its length must
  // be 0, or GDCM reads it as a fragment of that length and allocates it (fuzz_image: 3.2 GB).
  size_t delimiter(size_t at) const {
    if (at + 8 > b_.size()) bad(at, "a truncated delimiter");
    if (u32(at + 4) != 0) {
      bad(at, "a delimiter " + tag(at) + " of length " + std::to_string(u32(at + 4)) +
                  "; it must be 0");
    }
    return at + 8;
  }
  // Items of a sequence (or fragments of encapsulated pixel data) from `at`: within [at, end)
  // for a defined length, else up to the sequence delimiter. Returns where the sequence ends.
  size_t items(size_t at, size_t end, bool defined, int depth, bool fragments) const {
    while (defined ? at < end : true) {
      if (at + 8 > end) bad(at, "a truncated item");
      if (u16(at) != 0xfffe) bad(at, "expected an item, found " + tag(at));
      const uint16_t e = u16(at + 2);
      const uint32_t length = u32(at + 4);
      if (e == 0xe0dd) {  // sequence delimiter
        if (defined) bad(at, "a sequence delimiter in a sequence of defined length");
        return delimiter(at);
      }
      if (e != 0xe000) bad(at, "expected an item, found " + tag(at));
      at += 8;
      if (length == kUndefined) {
        if (fragments) bad(at - 8, "a pixel-data fragment of undefined length");
        at = elements(at, end, depth + 1, /*item=*/true);
      } else {
        if (at + length > end) {
          bad(at - 8, "an item of " + std::to_string(length) + " bytes runs past the end");
        }
        if (!fragments) elements(at, at + length, depth + 1);
        at += length;
      }
    }
    return at;
  }
  // Implicit VR little endian: no VR to check, but every length is (GDCM allocates what an
  // element declares before reading it: fuzz_image saw 3.6 GB asked for). An element of
  // undefined length holds items (a sequence, or encapsulated pixel data); one of defined length
  // is skipped whole (whether it is a sequence takes a dictionary).
  size_t implicit_elements(size_t at, size_t end, int depth, bool item = false) const {
    if (depth > 16) bad(at, "sequences nested more than 16 deep");
    while (at < end) {
      if (at + 8 > end) bad(at, "a truncated element header");
      if (u16(at) == 0xfffe) {
        if (item && u16(at + 2) == 0xe00d) return delimiter(at);
        bad(at, "an item tag " + tag(at) + " outside a sequence");
      }
      const uint32_t length = u32(at + 4);
      if (length == kUndefined) {
        at = implicit_items(at + 8, end, depth);
      } else {
        if (at + 8 + length > end) {
          bad(at,
              "element " + tag(at) + " of " + std::to_string(length) + " bytes runs past the end");
        }
        at += 8 + length;
      }
    }
    if (item) bad(at, "an item of undefined length without its delimiter");
    return at;
  }
  size_t implicit_items(size_t at, size_t end, int depth) const {
    while (true) {
      if (at + 8 > end) bad(at, "a truncated item");
      if (u16(at) != 0xfffe) bad(at, "expected an item, found " + tag(at));
      const uint16_t e = u16(at + 2);
      const uint32_t length = u32(at + 4);
      if (e == 0xe0dd) return delimiter(at);
      if (e != 0xe000) bad(at, "expected an item, found " + tag(at));
      at += 8;
      if (length == kUndefined) {
        at = implicit_elements(at, end, depth + 1, /*item=*/true);
      } else {
        if (at + length > end) {
          bad(at - 8, "an item of " + std::to_string(length) + " bytes runs past the end");
        }
        at += length;
      }
    }
  }
  // Elements from `at` to `end` (an item of undefined length: to its delimiter). Returns where
  // they end.
  size_t elements(size_t at, size_t end, int depth, bool item = false) const {
    if (depth > 16) bad(at, "sequences nested more than 16 deep");
    while (at < end) {
      if (at + 4 > end) bad(at, "a truncated element header");
      if (u16(at) == 0xfffe) {
        if (item && u16(at + 2) == 0xe00d) return delimiter(at);  // item delimiter
        bad(at, "an item tag " + tag(at) + " outside a sequence");
      }
      const Header h = header(at, end);
      const bool sq = h.vr[0] == 'S' && h.vr[1] == 'Q';
      const bool pixels = u16(at) == 0x7fe0 && u16(at + 2) == 0x0010;
      const size_t value = at + h.size;
      const bool ob_ow = h.vr[0] == 'O' && (h.vr[1] == 'B' || h.vr[1] == 'W');
      if (h.length == kUndefined) {
        if (pixels && depth == 0 && !ob_ow && !sq) {
          // GDCM asserts on encapsulated pixel data of another VR (fuzz_image: OF).
          bad(at,
              "encapsulated pixel data " + tag(at) + " with VR " + h.vr + "; it must be OB or OW");
        }
        if (sq || (pixels && depth == 0)) {
          at = items(value, end, false, depth, pixels);
        } else if (!(h.vr[0] == 'U' && h.vr[1] == 'N')) {
          // Only a sequence, encapsulated pixel data or a UN may have an undefined length;
          // GDCM asserts on any other (fuzz_image).
          bad(at, "element " + tag(at) + " " + h.vr + " of undefined length");
        } else {
          return end;  // (a UN of undefined length: implicit VR inside; GDCM's to read)
        }
      } else {
        if (value + h.length > end) {
          bad(at, "element " + tag(at) + " " + h.vr + " of " + std::to_string(h.length) +
                      " bytes runs past the end");
        }
        if (sq) items(value, value + h.length, true, depth, false);
        at = value + h.length;
      }
    }
    if (item) bad(at, "an item of undefined length without its delimiter");
    return at;
  }
};

void check_structure(std::span<const uint8_t> bytes, const std::string& name) {
  StructureWalk(bytes, name).run();
}

}  // namespace

double voi_linear(double x, Window w) {
  const double c = w.center, wd = w.width;
  if (w.exact || wd < 1) {  // LINEAR_EXACT (C.11.2.1.3.2), which a width below 1 needs
    if (x <= c - wd / 2) return 0.0;
    if (x > c + wd / 2) return 1.0;
    return (x - c) / wd + 0.5;
  }
  if (x <= c - 0.5 - (wd - 1) / 2) return 0.0;
  if (x > c - 0.5 + (wd - 1) / 2) return 1.0;
  if (wd <= 1) return 1.0;
  return (x - (c - 0.5)) / (wd - 1) + 0.5;
}

// How stored pixel values are laid out: what the pixel loop needs, from the data set (fast path)
// or from GDCM's image (decoded transfer syntaxes). Not in the anonymous namespace: StoredPixels,
// which dicom.h declares, holds one.
struct StoredFormat {
  int width = 0, height = 0;
  int bits_allocated = 0, bits_stored = 0, high_bit = -1;
  bool is_signed = false, monochrome1 = false;
  double slope = 1.0, intercept = 0.0;
  int samples = 1;  // 3: RGB, 8-bit, interleaved (converted so when decoded)
};

namespace {

// Stored values to windowed output: stored value -> modality value (rescale, dose scaling) ->
// VOI window -> [0, 65535], MONOCHROME1 inverted. Stored values of up to 16 bits go through one
// table, built once per image (at most 65536 entries); a pixel is then a mask and a lookup.
// (Converting each pixel through a double and lround cost 73.6 ms for a 2048x2048 scan; the
// table: a few ms.) 32-bit values (RT Dose grids, parametric maps) have too many for a table:
// each pixel is windowed from its own modality value, so a window narrower than the image's
// range keeps every distinct value (they were once squeezed onto 16 bits over the whole range
// first, which a narrow window then saw as a few steps).
struct Windowing {
  std::vector<uint16_t> lut;
  int shift = 0;
  uint32_t mask = 0;
  int bytes = 1;  // per stored value: 1, 2 or 4
  // 4 bytes: what the table would hold, computed per pixel.
  int stored = 32;
  bool is_signed = false, monochrome1 = false;
  double slope = 1.0, intercept = 0.0;
  Window window;
  uint16_t direct(uint32_t u) const {
    u = (u >> shift) & mask;
    int64_t s = u;
    if (is_signed && (u >> (stored - 1)) & 1u) s -= int64_t{1} << stored;  // sign extend
    double y = voi_linear(static_cast<double>(s) * slope + intercept, window);
    if (monochrome1) y = 1.0 - y;
    return static_cast<uint16_t>(std::lround(y * 65535.0));
  }
  // Pixels x0..x0+n-1 of stored row `row`, windowed through `table` (`lut`, or the same values
  // in another type: a table of floats spares the resampler a conversion per pixel).
  template <typename Out>
  void apply(const Out* table, const uint8_t* row, int x0, int n, Out* out) const {
    if (bytes == 1) {
      const uint8_t* r = row + x0;
      for (int x = 0; x < n; ++x) out[x] = table[(r[x] >> shift) & mask];
    } else if (bytes == 2) {
      const uint8_t* r = row + 2 * static_cast<size_t>(x0);
      for (int x = 0; x < n; ++x) {
        uint16_t u;
        std::memcpy(&u, r + 2 * x, 2);
        out[x] = table[(u >> shift) & mask];
      }
    } else {
      const uint8_t* r = row + 4 * static_cast<size_t>(x0);
      for (int x = 0; x < n; ++x) {
        uint32_t u;
        std::memcpy(&u, r + 4 * x, 4);
        out[x] = static_cast<Out>(direct(u));
      }
    }
  }
};

// The windowing of grayscale stored values `raw` (format `f`) under `window`, or, with none,
// under the full range of the image's modality values.
Windowing windowing(const uint8_t* raw, const StoredFormat& f, std::optional<Window> window) {
  const size_t px = static_cast<size_t>(f.width) * static_cast<size_t>(f.height);
  const int alloc = f.bits_allocated;
  const int stored = std::clamp(f.bits_stored > 0 ? f.bits_stored : alloc, 1, alloc);
  const int high = f.high_bit >= 0 ? std::min(f.high_bit, alloc - 1) : stored - 1;
  if (window && !(window->width > 0)) {
    COHORT_THROW("DICOM window: width " << window->width << " (center " << window->center
                                        << "); a window's width must be above 0");
  }
  Windowing t;
  t.shift = std::max(0, high + 1 - stored);
  t.mask = stored >= 32 ? ~0u : (1u << stored) - 1u;
  t.bytes = alloc / 8;
  t.stored = stored;
  t.is_signed = f.is_signed;
  t.monochrome1 = f.monochrome1;
  t.slope = f.slope;
  t.intercept = f.intercept;
  auto value_of = [&](uint32_t index) {  // the modality value of a stored value
    int64_t v = index;
    if (f.is_signed && (index >> (stored - 1)) & 1u) v -= int64_t{1} << stored;  // sign extend
    return static_cast<double>(v) * f.slope + f.intercept;
  };
  auto index_at = [&](size_t i) -> uint32_t {
    uint32_t s;
    if (alloc == 8) {
      s = raw[i];
    } else if (alloc == 16) {
      uint16_t u;
      std::memcpy(&u, raw + 2 * i, 2);
      s = u;
    } else {
      std::memcpy(&s, raw + 4 * i, 4);
    }
    return (s >> t.shift) & t.mask;
  };
  Window win;
  if (window) {
    win = *window;
  } else {  // no window anywhere: the full range of the modality values
    double vlo = value_of(index_at(0)), vhi = vlo;
    if (f.is_signed || alloc == 32) {  // order by value, not by stored bits
      for (size_t i = 0; i < px; ++i) {
        const double v = value_of(index_at(i));
        vlo = std::min(vlo, v);
        vhi = std::max(vhi, v);
      }
    } else {
      uint32_t lo = t.mask, hi = 0;
      for (size_t i = 0; i < px; ++i) {
        const uint32_t s = index_at(i);
        lo = std::min(lo, s);
        hi = std::max(hi, s);
      }
      const double a = value_of(lo), b = value_of(hi);
      vlo = std::min(a, b);
      vhi = std::max(a, b);
    }
    // DICOM's LINEAR function maps this window's [c - 0.5 - (w-1)/2, c - 0.5 + (w-1)/2] =
    // [vlo, vhi] onto [0, 1], whatever the range (a dose grid's may be below 1 Gy).
    win = Window{(vlo + vhi + 1) / 2, std::max(1.0, vhi - vlo + 1)};
  }
  t.window = win;
  if (alloc == 32) return t;  // windowed per pixel
  const size_t entries = size_t{1} << stored;
  t.lut.resize(entries);
  for (size_t s = 0; s < entries; ++s) {
    double y = voi_linear(value_of(static_cast<uint32_t>(s)), win);
    if (f.monochrome1) y = 1.0 - y;
    t.lut[s] = static_cast<uint16_t>(std::lround(y * 65535.0));
  }
  return t;
}

// The windowed image (colour: 8-bit RGB as it is, it needs no window).
Image window_pixels(const uint8_t* raw, const StoredFormat& f, std::optional<Window> window) {
  Image out;
  out.width = f.width;
  out.height = f.height;
  out.channels = f.samples;
  out.bits = f.samples == 3 ? 8 : 16;
  out.data.resize(out.row_bytes() * static_cast<size_t>(f.height));
  if (f.samples == 3) {
    std::memcpy(out.data.data(), raw, out.data.size());
    return out;
  }
  const Windowing t = windowing(raw, f, window);
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data.data());
  const size_t row_bytes = static_cast<size_t>(f.width) * t.bytes;
  for (int y = 0; y < f.height; ++y) {
    t.apply(t.lut.data(), raw + static_cast<size_t>(y) * row_bytes, 0, f.width,
            o + static_cast<size_t>(y) * f.width);
  }
  return out;
}

// An unsigned short attribute, when present with a value.
std::optional<int> us_value(const gdcm::DataSet& ds, uint16_t group, uint16_t element) {
  const gdcm::Tag t(group, element);
  if (!ds.FindDataElement(t)) return std::nullopt;
  const gdcm::ByteValue* bv = ds.GetDataElement(t).GetByteValue();
  if (!bv || bv->GetLength() < 2) return std::nullopt;
  uint16_t v;
  std::memcpy(&v, bv->GetPointer(), 2);
  return v;
}

// The window of the file: the first of (possibly several) center and width values, with its
// VOI LUT Function (0028,1056) when that is LINEAR_EXACT. (SIGMOID is read as LINEAR.)
std::optional<Window> file_window(const gdcm::DataSet& ds) {
  auto c = first_number(element_string(ds, gdcm::Tag(0x0028, 0x1050)));
  auto w = first_number(element_string(ds, gdcm::Tag(0x0028, 0x1051)));
  const bool exact = element_string(ds, gdcm::Tag(0x0028, 0x1056)).rfind("LINEAR_EXACT", 0) == 0;
  if (c && w && *w > 0) return Window{*c, *w, exact};
  return std::nullopt;
}

// The modality rescale of the data set's top level into `f`: Rescale Slope and Intercept
// (PS3.3 C.11.1; a missing or zero slope is 1), then Dose Grid Scaling (3004,000E), which turns
// an RT Dose grid's stored values into dose (C.8.8.3). False when the data set has none of them.
// Both decoding paths take the rescale from here: GDCM's image reader applies Rescale Slope for
// some SOP classes only, and Dose Grid Scaling in place of it, so the same pixels in another
// transfer syntax were once other modality values (16-bit RT Dose, read in place, was left in
// stored units, and a window given in Gy saw every pixel above it).
bool read_rescale(const gdcm::DataSet& ds, StoredFormat& f) {
  const auto slope = first_number(element_string(ds, gdcm::Tag(0x0028, 0x1053)));
  const auto intercept = first_number(element_string(ds, gdcm::Tag(0x0028, 0x1052)));
  const auto dose = first_number(element_string(ds, gdcm::Tag(0x3004, 0x000e)));
  f.slope = slope && *slope != 0 ? *slope : 1.0;
  f.intercept = intercept.value_or(0.0);
  if (dose && *dose != 0) {
    f.slope *= *dose;
    f.intercept *= *dose;
  }
  return slope || intercept || (dose && *dose != 0);
}

}  // namespace

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

namespace {

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
                                         bool pixels = true) {
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

}  // namespace

namespace {

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

}  // namespace

namespace {

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

}  // namespace

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

DicomPixels::DicomPixels(std::span<const uint8_t> bytes, const std::string& name)
    : s_(std::make_unique<StoredPixels>()) {
  quiet_gdcm();
  check_structure(bytes, name);
  if (auto n = parse_native(bytes, name)) {
    *s_ = std::move(*n);
  } else {
    *s_ = decode_general(bytes, name);
  }
  // No pixels or no size (fuzz_image: a file whose pixels were never found crashed the
  // windowing on a null pointer).
  if (s_->format.width <= 0 || s_->format.height <= 0 || s_->pixels() == nullptr) {
    COHORT_THROW_AS(DecodeError, name << ": no pixel data for a " << s_->format.width << "x"
                                      << s_->format.height << " image");
  }
}

DicomPixels::~DicomPixels() = default;
DicomPixels::DicomPixels(DicomPixels&&) noexcept = default;

ImageInfo DicomPixels::info() const {
  return ImageInfo{s_->format.width, s_->format.height, s_->format.samples, Format::dicom};
}

Image DicomPixels::window(std::optional<Window> window) const {
  return window_pixels(s_->pixels(), s_->format, window ? window : s_->window);
}

RowSource DicomPixels::rows(std::optional<Window> window) const {
  const StoredFormat& f = s_->format;
  const uint8_t* raw = s_->pixels();
  RowSource src{f.width, f.height, f.samples, f.samples == 3 ? 8 : 16, nullptr};
  if (f.samples == 3) return rows_of(raw, f.width, f.height, 3);  // 8-bit RGB: no window
  struct Table {
    Windowing t;
    std::vector<float> values;  // t.lut as floats
  };
  auto table = std::make_shared<Table>();
  table->t = windowing(raw, f, window ? window : s_->window);
  table->values.assign(table->t.lut.begin(), table->t.lut.end());
  const size_t row_bytes = static_cast<size_t>(f.width) * table->t.bytes;
  src.row = [raw, row_bytes, table](int y, int x0, int n, float* out) {
    table->t.apply(table->values.data(), raw + static_cast<size_t>(y) * row_bytes, x0, n, out);
  };
  return src;
}

ImageInfo probe_dicom(std::span<const uint8_t> bytes, const std::string& name) {
  quiet_gdcm();
  check_structure(bytes, name);
  if (auto n = parse_native(bytes, name, false)) {
    return ImageInfo{n->format.width, n->format.height, 1, Format::dicom};
  }
  return DicomPixels(bytes, name).info();
}

Image decode_dicom(std::span<const uint8_t> bytes, const std::string& name,
                   std::optional<Window> window) {
  return DicomPixels(bytes, name).window(window);
}

std::vector<uint8_t> encode_dicom(const Image& stored, const DicomWriteOptions& opt) {
  quiet_gdcm();
  COHORT_CHECK(
      (stored.channels == 1 && (stored.bits == 8 || stored.bits == 16 || stored.bits == 32)) ||
          (stored.channels == 3 && stored.bits == 8),
      "DICOM writer: 8-, 16- or 32-bit grayscale, or 8-bit RGB; not "
          << stored.channels << " channels of " << stored.bits << " bits");
  const bool rgb = stored.channels == 3;
  gdcm::SmartPointer<gdcm::Image> im = new gdcm::Image;
  im->SetNumberOfDimensions(2);
  im->SetDimension(0, static_cast<unsigned>(stored.width));
  im->SetDimension(1, static_cast<unsigned>(stored.height));
  const unsigned short alloc = static_cast<unsigned short>(stored.bits);
  const unsigned short bits = rgb ? 8 : static_cast<unsigned short>(opt.bits_stored);
  gdcm::PixelFormat pf(rgb ? 3 : 1, alloc, bits, static_cast<unsigned short>(bits - 1),
                       static_cast<unsigned short>(opt.is_signed ? 1 : 0));
  im->SetPixelFormat(pf);
  im->SetPhotometricInterpretation(rgb ? gdcm::PhotometricInterpretation::RGB
                                   : opt.monochrome1
                                       ? gdcm::PhotometricInterpretation::MONOCHROME1
                                       : gdcm::PhotometricInterpretation::MONOCHROME2);
  std::vector<uint8_t> planes;  // planar configuration 1: RRR... GGG... BBB...
  if (rgb && opt.planar) {
    const size_t px = static_cast<size_t>(stored.width) * stored.height;
    planes.resize(px * 3);
    for (size_t i = 0; i < px; ++i) {
      for (size_t c = 0; c < 3; ++c) planes[c * px + i] = stored.data[3 * i + c];
    }
    im->SetPlanarConfiguration(1);
  }
  im->SetTransferSyntax(gdcm::TransferSyntax::ExplicitVRLittleEndian);
  if (!opt.dose_grid_scaling) {
    im->SetSlope(opt.slope);
    im->SetIntercept(opt.intercept);
  }
  gdcm::DataElement pixel(gdcm::Tag(0x7fe0, 0x0010));
  const std::vector<uint8_t>& bytes_out = planes.empty() ? stored.data : planes;
  pixel.SetByteValue(reinterpret_cast<const char*>(bytes_out.data()),
                     static_cast<uint32_t>(bytes_out.size()));
  im->SetDataElement(pixel);
  gdcm::ImageWriter w;
  w.SetImage(*im);
  gdcm::DataSet& ds = w.GetFile().GetDataSet();
  gdcm::UIDGenerator uid;
  gdcm::Attribute<0x0008, 0x0016> sop_class = {"1.2.840.10008.5.1.4.1.1.7"};  // Secondary Capture
  ds.Replace(sop_class.GetAsDataElement());
  gdcm::Attribute<0x0008, 0x0018> sop = {uid.Generate()};
  ds.Replace(sop.GetAsDataElement());
  gdcm::Attribute<0x0008, 0x0060> modality = {"OT"};
  ds.Replace(modality.GetAsDataElement());
  auto ds_value = [](gdcm::DataSet& into, uint16_t group, uint16_t element, double v) {
    std::ostringstream o;
    o.precision(10);  // a DS holds 16 characters
    o << v;
    std::string text = o.str();
    if (text.size() % 2) text += ' ';  // DICOM values have even length
    gdcm::DataElement de(gdcm::Tag(group, element));
    de.SetVR(gdcm::VR::DS);
    de.SetByteValue(text.data(), static_cast<uint32_t>(text.size()));
    into.Replace(de);
  };
  const std::string pi = rgb ? "RGB " : opt.monochrome1 ? "MONOCHROME1 " : "MONOCHROME2 ";
  gdcm::DataElement photometric(gdcm::Tag(0x0028, 0x0004));
  photometric.SetVR(gdcm::VR::CS);
  photometric.SetByteValue(pi.data(), static_cast<uint32_t>(pi.size()));
  ds.Replace(photometric);
  if (opt.window) {
    ds_value(ds, 0x0028, 0x1050, opt.window->center);
    ds_value(ds, 0x0028, 0x1051, opt.window->width);
  }
  std::ostringstream os;
  w.SetStream(os);
  if (!w.Write()) COHORT_THROW("DICOM encode failed");
  std::string s = os.str();
  if (opt.dose_grid_scaling) {
    // An RT Dose grid: the same image made one by a plain writer. (GDCM's image writer, given
    // the RT Dose SOP class, writes a one-value Grid Frame Offset Vector its own image reader
    // then asserts on.)
    SpanBuf buf(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    std::istream in(&buf);
    gdcm::Reader r;
    r.SetStream(in);
    if (!r.Read()) COHORT_THROW("DICOM encode failed: the RT Dose grid does not read back");
    gdcm::File& f = r.GetFile();
    gdcm::DataSet& d = f.GetDataSet();
    const char rt_dose[] = "1.2.840.10008.5.1.4.1.1.481.2";  // with its padding NUL: even length
    for (gdcm::DataSet* set : {&d, static_cast<gdcm::DataSet*>(&f.GetHeader())}) {
      gdcm::DataElement de(gdcm::Tag(set == &d ? 0x0008 : 0x0002, set == &d ? 0x0016 : 0x0002));
      de.SetVR(gdcm::VR::UI);
      de.SetByteValue(rt_dose, sizeof rt_dose);
      set->Replace(de);
    }
    gdcm::Attribute<0x0008, 0x0060> dose_modality = {"RTDOSE"};
    d.Replace(dose_modality.GetAsDataElement());
    gdcm::Attribute<0x3004, 0x0002> units = {"GY"};
    d.Replace(units.GetAsDataElement());
    ds_value(d, 0x3004, 0x000e, *opt.dose_grid_scaling);
    for (uint16_t e : {0x1052, 0x1053, 0x1054}) d.Remove(gdcm::Tag(0x0028, e));
    std::ostringstream out;
    gdcm::Writer dw;
    dw.SetStream(out);
    dw.SetFile(f);
    if (!dw.Write()) COHORT_THROW("DICOM encode failed: the RT Dose grid");
    s = out.str();
  }
  return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace cohort::data
