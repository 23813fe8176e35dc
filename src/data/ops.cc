#include "cohort/data/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

namespace {

struct Taps {
  std::vector<int> first;     // first source index per output
  std::vector<int> count;     // taps per output
  std::vector<float> weight;  // count[i] weights per output, stride = max taps
  int stride = 0;
};

// Triangle-filter taps for resampling [start, start+len) of a line to `out` samples.
Taps make_taps(double start, double len, int src_len, int out) {
  Taps t;
  const double scale = len / out;
  const double fscale = std::max(scale, 1.0);
  const double support = fscale;  // bilinear support 1, widened when shrinking
  t.stride = static_cast<int>(std::ceil(support)) * 2 + 2;
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

// Horizontal pass for C interleaved channels (C known at compile time for the common cases).
template <int C, typename T>
void horizontal(const T* __restrict__ line, const Taps& tx, int out_w, int channels,
                float* __restrict__ m) {
  const int ch = C > 0 ? C : channels;
  for (int i = 0; i < out_w; ++i) {
    const float* w = &tx.weight[static_cast<size_t>(i) * tx.stride];
    const int x0 = tx.first[static_cast<size_t>(i)], n = tx.count[static_cast<size_t>(i)];
    const T* px = line + static_cast<size_t>(x0) * ch;
    if constexpr (C == 3) {
      float a0 = 0, a1 = 0, a2 = 0;
      for (int k = 0; k < n; ++k) {
        a0 += w[k] * static_cast<float>(px[3 * k]);
        a1 += w[k] * static_cast<float>(px[3 * k + 1]);
        a2 += w[k] * static_cast<float>(px[3 * k + 2]);
      }
      m[3 * i] = a0;
      m[3 * i + 1] = a1;
      m[3 * i + 2] = a2;
    } else if constexpr (C == 1) {
      float a0 = 0;
      for (int k = 0; k < n; ++k) a0 += w[k] * static_cast<float>(px[k]);
      m[i] = a0;
    } else {
      for (int c = 0; c < ch; ++c) {
        float acc = 0;
        for (int k = 0; k < n; ++k) acc += w[k] * static_cast<float>(px[k * ch + c]);
        m[i * ch + c] = acc;
      }
    }
  }
}

template <typename T>
void resample(const T* src, int sw, int channels, const Taps& tx, const Taps& ty, int out_w,
              int out_h, float* out) {
  // Horizontal pass over the rows the vertical taps need, then the vertical pass row by row
  // (a weighted sum of whole rows, which vectorises), then de-interleave into planes.
  const int row0 = ty.first.front();
  int row1 = 0;
  for (size_t i = 0; i < ty.first.size(); ++i) row1 = std::max(row1, ty.first[i] + ty.count[i]);
  const int rows = row1 - row0;
  const size_t row_len = static_cast<size_t>(out_w) * channels;
  thread_local std::vector<float> mid, acc;
  mid.resize(static_cast<size_t>(rows) * row_len);
  acc.resize(row_len);
  for (int r = 0; r < rows; ++r) {
    const T* line = src + static_cast<size_t>(row0 + r) * sw * channels;
    float* m = &mid[static_cast<size_t>(r) * row_len];
    if (channels == 3) {
      horizontal<3>(line, tx, out_w, channels, m);
    } else if (channels == 1) {
      horizontal<1>(line, tx, out_w, channels, m);
    } else {
      horizontal<0>(line, tx, out_w, channels, m);
    }
  }
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  for (int j = 0; j < out_h; ++j) {
    const float* w = &ty.weight[static_cast<size_t>(j) * ty.stride];
    const int y0 = ty.first[static_cast<size_t>(j)] - row0, n = ty.count[static_cast<size_t>(j)];
    float* __restrict__ a = acc.data();
    const float* r0 = &mid[static_cast<size_t>(y0) * row_len];
    for (size_t i = 0; i < row_len; ++i) a[i] = w[0] * r0[i];
    for (int k = 1; k < n; ++k) {
      const float* rk = &mid[static_cast<size_t>(y0 + k) * row_len];
      const float wk = w[k];
      for (size_t i = 0; i < row_len; ++i) a[i] += wk * rk[i];
    }
    float* o = out + static_cast<size_t>(j) * out_w;
    if (channels == 1) {
      std::copy(a, a + out_w, o);
    } else {
      for (int i = 0; i < out_w; ++i) {
        for (int c = 0; c < channels; ++c) o[c * plane + i] = a[i * channels + c];
      }
    }
  }
}

}  // namespace

void resize_crop(const Image& src, CropBox box, int out_w, int out_h, float* out) {
  Taps tx = make_taps(box.x, box.w, src.width, out_w);
  Taps ty = make_taps(box.y, box.h, src.height, out_h);
  if (src.bits == 8) {
    resample(src.data.data(), src.width, src.channels, tx, ty, out_w, out_h, out);
  } else {
    resample(reinterpret_cast<const uint16_t*>(src.data.data()), src.width, src.channels, tx, ty,
             out_w, out_h, out);
  }
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
  const double cx = (w - 1) / 2.0, cy = (h - 1) / 2.0;
  const size_t n = static_cast<size_t>(h) * w;
  scratch.resize(n);
  for (int c = 0; c < channels; ++c) {
    float* plane = p + static_cast<size_t>(c) * n;
    std::copy(plane, plane + n, scratch.begin());
    const float* src = scratch.data();
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        // The source point that lands here: the output point turned back by the angle.
        const double dx = x - cx, dy = y - cy;
        const double sx = ca * dx - sa * dy + cx, sy = sa * dx + ca * dy + cy;
        const int x0 = static_cast<int>(std::floor(sx)), y0 = static_cast<int>(std::floor(sy));
        const float fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
        auto at = [&](int xx, int yy) {
          return xx < 0 || yy < 0 || xx >= w || yy >= h ? 0.f
                                                        : src[static_cast<size_t>(yy) * w + xx];
        };
        const float top = at(x0, y0) * (1 - fx) + at(x0 + 1, y0) * fx;
        const float bottom = at(x0, y0 + 1) * (1 - fx) + at(x0 + 1, y0 + 1) * fx;
        plane[static_cast<size_t>(y) * w + x] = top * (1 - fy) + bottom * fy;
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
    for (size_t i = 0; i < n; ++i) q[i] = (q[i] - m) * contrast + m + brightness;
  }
}

}  // namespace cohort::data
