// DeviceDicomWindow (see dicom_device.h): one staged copy of the stored values and the table,
// one launch.
#include "dicom_device.h"

#include <cstring>

#include "cohort/core/error.h"
#include "dicom/stored.h"
#include "kernels/dicom_window.h"

namespace cohort::data {

void DeviceDicomWindow::window(const DicomPixels& px, std::optional<Window> window, uint16_t* out,
                               const cuda::Stream& s) {
  const StoredPixels& sp = *px.s_;
  const StoredFormat& f = sp.format;
  COHORT_CHECK(f.samples == 1, "DICOM on the device: " << f.samples
                                                       << "-sample (RGB) pixels need no window; "
                                                          "the CPU path takes them");
  const dicom_impl::Windowing t =
      dicom_impl::windowing(sp.pixels(), f, window ? window : sp.window);
  const size_t row_bytes = static_cast<size_t>(f.width) * t.p.bytes;
  const size_t raw_bytes = row_bytes * static_cast<size_t>(f.height);
  const size_t lut_bytes = t.lut.size() * sizeof(uint16_t);
  auto* host = static_cast<uint8_t*>(staging_.reserve(raw_bytes + lut_bytes));
  auto* raw = static_cast<uint8_t*>(raw_.reserve(raw_bytes + lut_bytes));
  // The previous call's copy out of the staging buffer must be done before it is written again.
  s.synchronize();
  std::memcpy(host, sp.pixels(), raw_bytes);
  if (lut_bytes) std::memcpy(host + raw_bytes, t.lut.data(), lut_bytes);
  cuda::copy_to_device(raw, host, raw_bytes + lut_bytes, s);
  const auto* lut = lut_bytes ? reinterpret_cast<const uint16_t*>(raw + raw_bytes) : nullptr;
  kernels::launch_dicom_window(raw, f.width, f.height, row_bytes, t.p, lut, out, s.handle());
}

}  // namespace cohort::data
