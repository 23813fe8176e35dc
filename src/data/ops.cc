#include "cohort/data/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/augment_math.h"
#include "taps.h"

namespace cohort::data {

CropBox random_resized_crop_box(int W, int H, CounterRng& rng, double smin, double smax,
                                double rmin, double rmax) {
  const double area = static_cast<double>(W) * H;
  const double lr0 = std::log(rmin), lr1 = std::log(rmax);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * rng.uniform(smin, smax);
    double aspect = std::exp(rng.uniform(lr0, lr1));
    int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && h > 0 && w <= W && h <= H) {
      int top = static_cast<int>(rng.below(static_cast<uint64_t>(H - h + 1)));
      int left = static_cast<int>(rng.below(static_cast<uint64_t>(W - w + 1)));
      return {static_cast<double>(left), static_cast<double>(top), static_cast<double>(w),
              static_cast<double>(h)};
    }
  }
  double in_ratio = static_cast<double>(W) / H;
  int w = W, h = H;
  if (in_ratio < rmin) {
    h = static_cast<int>(std::lround(w / rmin));
  } else if (in_ratio > rmax) {
    w = static_cast<int>(std::lround(h * rmax));
  }
  return {static_cast<double>((W - w) / 2), static_cast<double>((H - h) / 2),
          static_cast<double>(w), static_cast<double>(h)};
}

CropBox resize_center_crop_box(int W, int H, int resize, int crop) {
  // Scale so the shorter side becomes `resize`, then take the central crop x crop: in source
  // pixels the crop is crop / s wide.
  double s = static_cast<double>(resize) / std::min(W, H);
  double cw = crop / s, ch = crop / s;
  cw = std::min(cw, static_cast<double>(W));
  ch = std::min(ch, static_cast<double>(H));
  return {(W - cw) / 2, (H - ch) / 2, cw, ch};
}

// Triangle-filter taps for resampling [start, start+len) of a line to `out` samples (taps.h).
Taps make_taps(double start, double len, int src_len, int out) {
  Taps t;
  const double scale = len / out;
  const double fscale = std::max(scale, 1.0);
  const double support = fscale;  // bilinear support 1, widened when shrinking
  // Whole vectors of 4 (horizontal_gray); the weights past an output's count are 0.
  t.stride = (static_cast<int>(std::ceil(support)) * 2 + 2 + 3) / 4 * 4;
  t.first.resize(static_cast<size_t>(out));
  t.count.resize(static_cast<size_t>(out));
  t.weight.assign(static_cast<size_t>(out) * t.stride, 0.f);
  const double lo_bound = std::max(0.0, std::floor(start));
  const double hi_bound = std::min(static_cast<double>(src_len), std::ceil(start + len));
  for (int i = 0; i < out; ++i) {
    const double center = start + (i + 0.5) * scale;
    int xmin = static_cast<int>(std::max(std::floor(center - support + 0.5), lo_bound));
    int xmax = static_cast<int>(std::min(std::floor(center + support + 0.5), hi_bound));
    xmax = std::max(xmax, xmin + 1);
    xmax = std::min(xmax, xmin + t.stride);
    double sum = 0;
    float* w = &t.weight[static_cast<size_t>(i) * t.stride];
    for (int x = xmin; x < xmax; ++x) {
      double d = std::fabs((x + 0.5 - center) / fscale);
      double v = d < 1.0 ? 1.0 - d : 0.0;
      w[x - xmin] = static_cast<float>(v);
      sum += v;
    }
    if (sum > 0) {
      for (int k = 0; k < xmax - xmin; ++k) w[k] = static_cast<float>(w[k] / sum);
    } else {
      w[0] = 1.f;  // degenerate: nearest
    }
    t.first[static_cast<size_t>(i)] = std::min(xmin, src_len - 1);
    t.count[static_cast<size_t>(i)] = xmax - xmin;
  }
  return t;
}

namespace {

typedef float v4 __attribute__((vector_size(16)));

// Horizontal tap sums of a line of `ch` interleaved channels whose first value is column `col0`,
// into planes of `plane` floats (any channel count; the common ones have their own below).
void horizontal(const float* __restrict__ line, int col0, const Taps& tx, int out_w, int ch,
                size_t plane, float* __restrict__ out) {
  for (int i = 0; i < out_w; ++i) {
    const float* w = &tx.weight[static_cast<size_t>(i) * tx.stride];
    const int n = tx.count[static_cast<size_t>(i)];
    const float* px = line + static_cast<size_t>(tx.first[static_cast<size_t>(i)] - col0) * ch;
    for (int c = 0; c < ch; ++c) {
      float a = 0;
      for (int k = 0; k < n; ++k) a += w[k] * px[k * ch + c];
      out[c * plane + static_cast<size_t>(i)] = a;
    }
  }
}

// One channel: an output's taps are contiguous, so they are summed four at a time in vectors of
// 4 (weights zero-padded to the stride, a multiple of 4; the line has a stride of zeros after its
// end). The scalar sum this replaced was half of the resampler's time. Vector extensions, not
// intrinsics: the same sums in the same order on every machine.
void horizontal_gray(const float* line, int col0, const Taps& tx, int out_w, float* out) {
  const int groups = tx.stride / 4;
  for (int i = 0; i < out_w; ++i) {
    const float* w = &tx.weight[static_cast<size_t>(i) * tx.stride];
    const float* px = line + (tx.first[static_cast<size_t>(i)] - col0);
    v4 s = {0, 0, 0, 0};
    for (int g = 0; g < groups; ++g) {
      v4 wv, pv;
      std::memcpy(&wv, w + 4 * g, sizeof wv);
      std::memcpy(&pv, px + 4 * g, sizeof pv);
      s += wv * pv;
    }
    out[i] = (s[0] + s[1]) + (s[2] + s[3]);
  }
}

// RGB: one vector per tap holds its three channels (and the next pixel's red, unused), so each
// channel's sum runs tap after tap as the scalar one did: the same values, a third of the work.
void horizontal_rgb(const float* line, int col0, const Taps& tx, int out_w, size_t plane,
                    float* out) {
  for (int i = 0; i < out_w; ++i) {
    const float* w = &tx.weight[static_cast<size_t>(i) * tx.stride];
    const int n = tx.count[static_cast<size_t>(i)];
    const float* px = line + static_cast<size_t>(tx.first[static_cast<size_t>(i)] - col0) * 3;
    v4 s = {0, 0, 0, 0};
    for (int k = 0; k < n; ++k) {
      v4 pv;
      std::memcpy(&pv, px + 3 * k, sizeof pv);
      s += w[k] * pv;
    }
    for (int c = 0; c < 3; ++c) out[c * plane + static_cast<size_t>(i)] = s[c];
  }
}

// Vertical pass first, then horizontal, one output row at a time: the rows the vertical taps
// reach are converted to float once each into a ring of `ty.stride` rows (taps never reach
// back: their first row only grows), summed by the row's weights (a weighted sum of whole rows,
// which vectorises), and that one line is then tapped horizontally. The horizontal taps run on
// out_h lines rather than on every source row: for a 1,500-row crop of a 2048 px scan to 512, a
// third of the work of the horizontal-first order (which took 35% of bench data's time).
void resample(const RowSource& src, const Taps& tx, const Taps& ty, int out_w, int out_h,
              float* out) {
  const int C = src.channels;
  int col0 = tx.first.front(), col1 = 0;
  for (size_t i = 0; i < tx.first.size(); ++i) {
    col0 = std::min(col0, tx.first[i]);
    col1 = std::max(col1, tx.first[i] + tx.count[i]);
  }
  const int cols = col1 - col0;
  const size_t line = static_cast<size_t>(cols) * C;
  const int slots = std::max(ty.stride, 1);
  thread_local std::vector<float> ring, acc;
  ring.resize(static_cast<size_t>(slots) * line);
  acc.resize(line + static_cast<size_t>(tx.stride));  // the line, then zeros after it
  std::fill(acc.begin() + static_cast<std::ptrdiff_t>(line), acc.end(), 0.f);
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  int next = 0;  // rows below it are in the ring, or no longer needed
  for (int j = 0; j < out_h; ++j) {
    const float* w = &ty.weight[static_cast<size_t>(j) * ty.stride];
    const int y0 = ty.first[static_cast<size_t>(j)], n = ty.count[static_cast<size_t>(j)];
    for (int y = std::max(next, y0); y < y0 + n; ++y) {
      src.row(y, col0, cols, &ring[static_cast<size_t>(y % slots) * line]);
    }
    next = std::max(next, y0 + n);
    float* __restrict__ a = acc.data();
    auto at = [&](int k) { return &ring[static_cast<size_t>((y0 + k) % slots) * line]; };
    // Four rows at a time: the line is loaded and stored once per four taps, not once per tap
    // (that traffic was 40% of the resampler's time). The sum runs left to right as it did a
    // row at a time, so the values are the same.
    int k = 0;
    for (; k + 4 <= n; k += 4) {
      const float *r0 = at(k), *r1 = at(k + 1), *r2 = at(k + 2), *r3 = at(k + 3);
      const float w0 = w[k], w1 = w[k + 1], w2 = w[k + 2], w3 = w[k + 3];
      if (k == 0) {
        for (size_t i = 0; i < line; ++i) a[i] = w0 * r0[i] + w1 * r1[i] + w2 * r2[i] + w3 * r3[i];
      } else {
        for (size_t i = 0; i < line; ++i)
          a[i] = a[i] + w0 * r0[i] + w1 * r1[i] + w2 * r2[i] + w3 * r3[i];
      }
    }
    for (; k < n; ++k) {
      const float* rk = at(k);
      const float wk = w[k];
      if (k == 0) {
        for (size_t i = 0; i < line; ++i) a[i] = wk * rk[i];
      } else {
        for (size_t i = 0; i < line; ++i) a[i] += wk * rk[i];
      }
    }
    float* o = out + static_cast<size_t>(j) * out_w;
    if (C == 1) {
      horizontal_gray(a, col0, tx, out_w, o);
    } else if (C == 3) {
      horizontal_rgb(a, col0, tx, out_w, plane, o);
    } else {
      horizontal(a, col0, tx, out_w, C, plane, o);
    }
  }
}

template <typename T>
RowSource rows_of_type(const T* p, int width, int height, int channels) {
  RowSource s{width, height, channels, sizeof(T) == 1 ? 8 : 16, nullptr};
  const size_t stride = static_cast<size_t>(width) * channels;
  s.row = [p, stride, channels](int y, int x0, int n, float* out) {
    const T* r = p + static_cast<size_t>(y) * stride + static_cast<size_t>(x0) * channels;
    const size_t count = static_cast<size_t>(n) * channels;
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(r[i]);
  };
  return s;
}

}  // namespace

void resize_crop(const RowSource& src, CropBox box, int out_w, int out_h, float* out) {
  const Taps tx = make_taps(box.x, box.w, src.width, out_w);
  const Taps ty = make_taps(box.y, box.h, src.height, out_h);
  resample(src, tx, ty, out_w, out_h, out);
}

RowSource rows_of(const uint8_t* pixels, int width, int height, int channels) {
  return rows_of_type(pixels, width, height, channels);
}

RowSource rows_of(const uint16_t* pixels, int width, int height, int channels) {
  return rows_of_type(pixels, width, height, channels);
}

void resize_crop(const Image& src, CropBox box, int out_w, int out_h, float* out) {
  const uint8_t* p = src.data.data();
  resize_crop(src.bits == 8 ? rows_of(p, src.width, src.height, src.channels)
                            : rows_of(reinterpret_cast<const uint16_t*>(p), src.width, src.height,
                                      src.channels),
              box, out_w, out_h, out);
}

void flip_horizontal(float* p, int channels, int h, int w) {
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < h; ++y) {
      float* row = p + (static_cast<size_t>(c) * h + y) * w;
      std::reverse(row, row + w);
    }
  }
}

void flip_vertical(float* p, int channels, int h, int w) {
  for (int c = 0; c < channels; ++c) {
    float* plane = p + static_cast<size_t>(c) * h * w;
    for (int y = 0; y < h / 2; ++y) {
      std::swap_ranges(plane + static_cast<size_t>(y) * w, plane + static_cast<size_t>(y + 1) * w,
                       plane + static_cast<size_t>(h - 1 - y) * w);
    }
  }
}

void rotate(float* p, int channels, int h, int w, double degrees, std::vector<float>& scratch) {
  const double a = degrees * 3.14159265358979323846 / 180.0;
  const double ca = std::cos(a), sa = std::sin(a);
  const size_t n = static_cast<size_t>(h) * w;
  scratch.resize(n);
  for (int c = 0; c < channels; ++c) {
    float* plane = p + static_cast<size_t>(c) * n;
    std::copy(plane, plane + n, scratch.begin());
    const float* src = scratch.data();
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        plane[static_cast<size_t>(y) * w + x] = kernels::rotate_point(src, w, h, x, y, ca, sa);
      }
    }
  }
}

void brightness_contrast(float* p, int channels, int h, int w, float brightness, float contrast) {
  const size_t n = static_cast<size_t>(h) * w;
  for (int c = 0; c < channels; ++c) {
    float* q = p + c * n;
    double mean = 0;
    for (size_t i = 0; i < n; ++i) mean += q[i];
    const float m = static_cast<float>(mean / static_cast<double>(n));
    for (size_t i = 0; i < n; ++i) q[i] = kernels::contrast_point(q[i], m, contrast, brightness);
  }
}

}  // namespace cohort::data
