// The checks a DICOM file passes before GDCM reads it (the structure walk), and the attributes
// read from its data set: rescale, window, unsigned shorts (see stored.h).
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

#include "cohort/data/image.h"

namespace cohort::data {
namespace dicom_impl {

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

}  // namespace dicom_impl
}  // namespace cohort::data
