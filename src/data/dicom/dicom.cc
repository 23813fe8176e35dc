// DICOM's public face (dicom.h): DicomPixels, probe, decode and the writer; the jobs behind them
// are the other files of this folder (stored.h lists them).
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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <streambuf>

#include "cohort/data/ops.h"
#include "stored.h"

namespace cohort::data {

using namespace dicom_impl;

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
  const size_t row_bytes = static_cast<size_t>(f.width) * table->t.p.bytes;
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
