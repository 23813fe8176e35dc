// DICOM windowing on the GPU (issue 37's "DICOM on the device"): the CPU reads the file and its
// header and finds the stored pixels (DicomPixels: native in place, or decoded from a
// compressed transfer syntax as today); the raw 12/16/32-bit values go to the device in one
// copy, with the window's table (up to 16 stored bits, built once per image on the host), and a
// kernel rescales and windows every pixel there. Built with CUDA only (cohort_data_cuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "cohort/core/cuda.h"
#include "cohort/data/dicom.h"
#include "device_buffer.h"

namespace cohort::data {

class DeviceDicomWindow {
 public:
  DeviceDicomWindow() = default;
  DeviceDicomWindow(const DeviceDicomWindow&) = delete;
  DeviceDicomWindow& operator=(const DeviceDicomWindow&) = delete;

  // The windowed image as DicomPixels::window gives it (grayscale, 16-bit) into `out`, device
  // memory of width x height values, queued on `s`. `window` overrides the file's. 8-bit RGB
  // files need no window: they are refused, naming the file's layout (the CPU path takes them).
  void window(const DicomPixels& px, std::optional<Window> window, uint16_t* out,
              const cuda::Stream& s);

 private:
  GrowingBuffer staging_{true}, raw_{false};
};

}  // namespace cohort::data
