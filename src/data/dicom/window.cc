// Rescale and VOI windowing: a file's stored values to the output's 16-bit values (see
// stored.h).
#include "stored.h"

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

double voi_linear(double x, Window w) {
  return kernels::voi_linear(x, w.center, w.width, w.exact);
}

namespace dicom_impl {

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
  kernels::WindowParams& p = t.p;
  p.shift = std::max(0, high + 1 - stored);
  p.mask = stored >= 32 ? ~0u : (1u << stored) - 1u;
  p.bytes = alloc / 8;
  p.stored = stored;
  p.is_signed = f.is_signed;
  p.monochrome1 = f.monochrome1;
  p.slope = f.slope;
  p.intercept = f.intercept;
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
    return (s >> p.shift) & p.mask;
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
      uint32_t lo = p.mask, hi = 0;
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
  p.center = win.center;
  p.width = win.width;
  p.exact = win.exact;
  if (alloc == 32) return t;  // windowed per pixel
  // The table: every stored value through the same per-pixel maths as the 32-bit path.
  const size_t entries = size_t{1} << stored;
  t.lut.resize(entries);
  for (size_t s = 0; s < entries; ++s)
    t.lut[s] = kernels::window_value(static_cast<uint32_t>(s), p);
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
  const size_t row_bytes = static_cast<size_t>(f.width) * t.p.bytes;
  for (int y = 0; y < f.height; ++y) {
    t.apply(t.lut.data(), raw + static_cast<size_t>(y) * row_bytes, 0, f.width,
            o + static_cast<size_t>(y) * f.width);
  }
  return out;
}

}  // namespace dicom_impl
}  // namespace cohort::data
