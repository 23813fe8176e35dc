#include "cohort/data/dicom.h"

#include <gdcmAttribute.h>
#include <gdcmImageReader.h>
#include <gdcmImageWriter.h>
#include <gdcmTrace.h>
#include <gdcmUIDGenerator.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <streambuf>

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
    return true;
  }();
  (void)once;
}

}  // namespace

double voi_linear(double x, Window w) {
  const double c = w.center, wd = std::max(w.width, 1.0);
  if (x <= c - 0.5 - (wd - 1) / 2) return 0.0;
  if (x > c - 0.5 + (wd - 1) / 2) return 1.0;
  if (wd <= 1) return 1.0;
  return (x - (c - 0.5)) / (wd - 1) + 0.5;
}

Image decode_dicom(std::span<const uint8_t> bytes, const std::string& name,
                   std::optional<Window> window) {
  quiet_gdcm();
  SpanBuf buf(bytes.data(), bytes.size());
  std::istream in(&buf);
  gdcm::ImageReader reader;
  reader.SetStream(in);
  if (!reader.Read()) COHORT_THROW_AS(DecodeError, name << ": not a readable DICOM image");
  const gdcm::Image& img = reader.GetImage();
  const unsigned* dims = img.GetDimensions();
  const gdcm::PixelFormat pf = img.GetPixelFormat();
  if (pf.GetSamplesPerPixel() != 1) {
    COHORT_THROW_AS(DecodeError, name << ": " << pf.GetSamplesPerPixel()
                                      << " samples per pixel; only grayscale DICOM is supported");
  }
  const int W = static_cast<int>(dims[0]), H = static_cast<int>(dims[1]);
  const size_t len = img.GetBufferLength();
  // GDCM reads a truncated file without complaint and pads what is missing: the declared
  // lengths of the header and the data set must fit in the bytes we have.
  const gdcm::File& file = reader.GetFile();
  const bool explicit_vr = file.GetHeader().GetDataSetTransferSyntax().IsExplicit();
  const uint64_t declared =
      static_cast<uint64_t>(file.GetHeader().GetFullLength()) +
      static_cast<uint64_t>(explicit_vr ? file.GetDataSet().GetLength<gdcm::ExplicitDataElement>()
                                        : file.GetDataSet().GetLength<gdcm::ImplicitDataElement>());
  if (declared > bytes.size()) {
    COHORT_THROW_AS(DecodeError,
                    name << ": truncated: " << bytes.size() << " of " << declared << " bytes");
  }
  std::vector<char> raw(len);
  if (!img.GetBuffer(raw.data())) {
    COHORT_THROW_AS(DecodeError, name << ": pixel data cannot be decoded (transfer syntax "
                                      << reader.GetFile().GetHeader().GetDataSetTransferSyntax()
                                      << ")");
  }
  const size_t px = static_cast<size_t>(W) * H;  // first frame only
  const int alloc = pf.GetBitsAllocated();
  if ((alloc != 8 && alloc != 16) || len < px * (alloc / 8)) {
    COHORT_THROW_AS(DecodeError, name << ": " << alloc << " bits allocated, " << len
                                      << " bytes of pixel data for " << W << "x" << H);
  }
  const bool is_signed = pf.GetPixelRepresentation() == 1;
  const double slope = img.GetSlope(), intercept = img.GetIntercept();
  std::vector<double> v(px);
  for (size_t i = 0; i < px; ++i) {
    double s;
    if (alloc == 8) {
      s = is_signed ? static_cast<double>(reinterpret_cast<const int8_t*>(raw.data())[i])
                    : static_cast<double>(reinterpret_cast<const uint8_t*>(raw.data())[i]);
    } else {
      uint16_t u;
      std::memcpy(&u, raw.data() + 2 * i, 2);
      s = is_signed ? static_cast<double>(static_cast<int16_t>(u)) : static_cast<double>(u);
    }
    v[i] = s * slope + intercept;
  }
  const gdcm::DataSet& ds = reader.GetFile().GetDataSet();
  if (!window) {
    auto c = first_number(element_string(ds, gdcm::Tag(0x0028, 0x1050)));
    auto w = first_number(element_string(ds, gdcm::Tag(0x0028, 0x1051)));
    if (c && w && *w >= 1) window = Window{*c, *w};
  }
  Window win;
  if (window) {
    win = *window;
  } else {  // no window anywhere: the full range of the modality values
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    win = Window{(*lo + *hi + 1) / 2, std::max(1.0, *hi - *lo + 1)};
  }
  const bool invert =
      img.GetPhotometricInterpretation() == gdcm::PhotometricInterpretation::MONOCHROME1;
  Image out;
  out.width = W;
  out.height = H;
  out.channels = 1;
  out.bits = 16;
  out.data.resize(px * 2);
  for (size_t i = 0; i < px; ++i) {
    double y = voi_linear(v[i], win);
    if (invert) y = 1.0 - y;
    uint16_t u = static_cast<uint16_t>(std::lround(y * 65535.0));
    std::memcpy(&out.data[2 * i], &u, 2);
  }
  return out;
}

std::vector<uint8_t> encode_dicom(const Image& stored, const DicomWriteOptions& opt) {
  quiet_gdcm();
  COHORT_CHECK(stored.channels == 1, "DICOM writer: grayscale only");
  gdcm::SmartPointer<gdcm::Image> im = new gdcm::Image;
  im->SetNumberOfDimensions(2);
  im->SetDimension(0, static_cast<unsigned>(stored.width));
  im->SetDimension(1, static_cast<unsigned>(stored.height));
  const unsigned short alloc = static_cast<unsigned short>(stored.bits);
  gdcm::PixelFormat pf(1, alloc, static_cast<unsigned short>(opt.bits_stored),
                       static_cast<unsigned short>(opt.bits_stored - 1),
                       static_cast<unsigned short>(opt.is_signed ? 1 : 0));
  im->SetPixelFormat(pf);
  im->SetPhotometricInterpretation(opt.monochrome1 ? gdcm::PhotometricInterpretation::MONOCHROME1
                                                   : gdcm::PhotometricInterpretation::MONOCHROME2);
  im->SetTransferSyntax(gdcm::TransferSyntax::ExplicitVRLittleEndian);
  im->SetSlope(opt.slope);
  im->SetIntercept(opt.intercept);
  gdcm::DataElement pixel(gdcm::Tag(0x7fe0, 0x0010));
  pixel.SetByteValue(reinterpret_cast<const char*>(stored.data.data()),
                     static_cast<uint32_t>(stored.data.size()));
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
  const std::string pi = opt.monochrome1 ? "MONOCHROME1 " : "MONOCHROME2 ";
  gdcm::DataElement photometric(gdcm::Tag(0x0028, 0x0004));
  photometric.SetVR(gdcm::VR::CS);
  photometric.SetByteValue(pi.data(), static_cast<uint32_t>(pi.size()));
  ds.Replace(photometric);
  if (opt.window) {
    auto ds_value = [&](uint16_t element, double v) {
      std::ostringstream o;
      o << v;
      std::string text = o.str();
      if (text.size() % 2) text += ' ';  // DICOM values have even length
      gdcm::DataElement de(gdcm::Tag(0x0028, element));
      de.SetVR(gdcm::VR::DS);
      de.SetByteValue(text.data(), static_cast<uint32_t>(text.size()));
      ds.Replace(de);
    };
    ds_value(0x1050, opt.window->center);
    ds_value(0x1051, opt.window->width);
  }
  std::ostringstream os;
  w.SetStream(os);
  if (!w.Write()) COHORT_THROW("DICOM encode failed");
  const std::string s = os.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace cohort::data
