// DICOM's rescale and VOI windowing per pixel, for the host and the GPU (COHORT_HD): the CPU
// decoder (src/data/dicom/window.cc) and the device kernel (dicom_window.cu) both call these, so
// a scan windowed on either device has the same values. Stored values of up to 16 bits go
// through a table (window.cc builds it once per image, from window_value over every stored
// value); 32-bit ones are windowed one by one.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cohort/core/host_device.h"

namespace cohort::data::kernels {

// DICOM PS3.3 C.11.2.1.2's LINEAR VOI function on a modality value, in [0, 1]; LINEAR_EXACT
// (C.11.2.1.3.2) when `exact`, or when the width is below 1, which LINEAR cannot take.
COHORT_HD double voi_linear(double x, double c, double wd, bool exact) {
  if (exact || wd < 1) {
    if (x <= c - wd / 2) return 0.0;
    if (x > c + wd / 2) return 1.0;
    return (x - c) / wd + 0.5;
  }
  if (x <= c - 0.5 - (wd - 1) / 2) return 0.0;
  if (x > c - 0.5 + (wd - 1) / 2) return 1.0;
  if (wd <= 1) return 1.0;
  return (x - (c - 0.5)) / (wd - 1) + 0.5;
}

// Everything a pixel's windowing needs, by value (a kernel argument).
struct WindowParams {
  int bytes = 1;  // per stored value: 1, 2 or 4
  int shift = 0;  // the stored bits' position (High Bit + 1 - Bits Stored)
  uint32_t mask = 0;
  int stored = 32;  // Bits Stored
  bool is_signed = false, monochrome1 = false;
  double slope = 1.0, intercept = 0.0;  // modality rescale (with dose grid scaling)
  double center = 0.0, width = 1.0;
  bool exact = false;
};

// The stored value of pixel x of a row: its bits, shifted and masked (no sign yet).
COHORT_HD uint32_t stored_bits(const uint8_t* row, int x, const WindowParams& p) {
  uint32_t u;
  if (p.bytes == 1) {
    u = row[x];
  } else if (p.bytes == 2) {
    uint16_t v;
    memcpy(&v, row + 2 * x, 2);
    u = v;
  } else {
    memcpy(&u, row + 4 * x, 4);
  }
  return (u >> p.shift) & p.mask;
}

// A stored value (as stored_bits gives it) to the output's 16-bit value: sign, rescale, window,
// MONOCHROME1's inversion, rounded half away from zero.
COHORT_HD uint16_t window_value(uint32_t bits, const WindowParams& p) {
  int64_t s = bits;
  if (p.is_signed && ((bits >> (p.stored - 1)) & 1u)) s -= int64_t{1} << p.stored;
  double y = voi_linear(static_cast<double>(s) * p.slope + p.intercept, p.center, p.width, p.exact);
  if (p.monochrome1) y = 1.0 - y;
  return static_cast<uint16_t>(llround(y * 65535.0));
}

}  // namespace cohort::data::kernels
