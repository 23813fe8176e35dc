// The arithmetic of JPEG decoding after the entropy decoder, as the GPU runs it (DALI's "mixed"
// decoder: the CPU turns the file into quantised DCT coefficients, the device does the rest):
// dequantisation and the 8x8 inverse DCT, the fancy (triangle-filter) upsampling of subsampled
// chroma, and YCbCr to RGB. Each is a COHORT_HD function, so tests/data/jpeg_math_test.cc runs
// the same code on the host against libjpeg-turbo's own decoding (its accurate integer IDCT).
//
// Each step is the integer arithmetic libjpeg-turbo's accurate decoding does (its IDCT, its
// triangle-filter upsampling, the JFIF equations in 16-bit fixed point), so the device's pixels
// are libjpeg-turbo's.
#pragma once

#include <cstdint>

#include "cohort/core/host_device.h"

namespace cohort::data::kernels {

COHORT_HD uint8_t clamp_sample(int64_t v) {
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// The inverse DCT of Loeffler, Ligtenberg and Moschytz (1989) in 13-bit fixed point, the
// "accurate integer" IDCT of the IJG's libjpeg and of libjpeg-turbo: 12 multiplications per
// 8 points, rotations with the constants below (FIX(x) = round(x * 2^13)), the columns kept with
// 2 extra bits between the passes. Being that transform, and not merely close to the exact one,
// is what makes the device's samples libjpeg-turbo's to the bit (an exact float IDCT rounded 0.9%
// of 4:4:4 samples differently, and 1.772 x Cb turned a chroma step of 1 into 2 in blue).
namespace idct {
constexpr int kConstBits = 13, kPass1Bits = 2;
constexpr int64_t k0_298631336 = 2446, k0_390180644 = 3196, k0_541196100 = 4433,
                  k0_765366865 = 6270, k0_899976223 = 7373, k1_175875602 = 9633,
                  k1_501321110 = 12299, k1_847759065 = 15137, k1_961570560 = 16069,
                  k2_053119869 = 16819, k2_562915447 = 20995, k3_072711026 = 25172;

COHORT_HD int64_t descale(int64_t x, int n) {
  return (x + (int64_t{1} << (n - 1))) >> n;
}

// One 8-point pass: in[0..7] at stride `si`, out[0..7] at stride `so`, each descaled by `shift`.
COHORT_HD void points(const int64_t* in, int si, int64_t* out, int so, int shift) {
  // Even part: in[0], in[2], in[4], in[6].
  int64_t z2 = in[2 * si], z3 = in[6 * si];
  int64_t z1 = (z2 + z3) * k0_541196100;
  const int64_t even2 = z1 - z3 * k1_847759065;
  const int64_t even3 = z1 + z2 * k0_765366865;
  z2 = in[0];
  z3 = in[4 * si];
  const int64_t even0 = (z2 + z3) * (int64_t{1} << kConstBits);
  const int64_t even1 = (z2 - z3) * (int64_t{1} << kConstBits);
  const int64_t t10 = even0 + even3, t13 = even0 - even3;
  const int64_t t11 = even1 + even2, t12 = even1 - even2;
  // Odd part: in[7], in[5], in[3], in[1].
  int64_t o0 = in[7 * si], o1 = in[5 * si], o2 = in[3 * si], o3 = in[1 * si];
  z1 = o0 + o3;
  z2 = o1 + o2;
  z3 = o0 + o2;
  int64_t z4 = o1 + o3;
  const int64_t z5 = (z3 + z4) * k1_175875602;
  o0 *= k0_298631336;
  o1 *= k2_053119869;
  o2 *= k3_072711026;
  o3 *= k1_501321110;
  z1 *= -k0_899976223;
  z2 *= -k2_562915447;
  z3 = z3 * -k1_961570560 + z5;
  z4 = z4 * -k0_390180644 + z5;
  o0 += z1 + z3;
  o1 += z2 + z4;
  o2 += z2 + z3;
  o3 += z1 + z4;
  out[0] = descale(t10 + o3, shift);
  out[7 * so] = descale(t10 - o3, shift);
  out[1 * so] = descale(t11 + o2, shift);
  out[6 * so] = descale(t11 - o2, shift);
  out[2 * so] = descale(t12 + o1, shift);
  out[5 * so] = descale(t12 - o1, shift);
  out[3 * so] = descale(t13 + o0, shift);
  out[4 * so] = descale(t13 - o0, shift);
}
}  // namespace idct

// One 8x8 block: coef and quant in natural (row-major) order, as libjpeg's coefficient arrays
// and quantisation tables hold them. Writes 64 samples, level-shifted by 128 and clamped, at
// out + y * stride + x. Columns first, then rows.
COHORT_HD void idct_block(const int16_t* coef, const uint16_t* quant, uint8_t* out, int stride) {
  int64_t in[64], work[64], row[8];
  for (int i = 0; i < 64; ++i) in[i] = int64_t{coef[i]} * quant[i];
  for (int x = 0; x < 8; ++x)
    idct::points(in + x, 8, work + x, 8, idct::kConstBits - idct::kPass1Bits);
  for (int y = 0; y < 8; ++y) {
    idct::points(work + y * 8, 1, row, 1, idct::kConstBits + idct::kPass1Bits + 3);
    for (int x = 0; x < 8; ++x) out[y * stride + x] = clamp_sample(row[x] + 128);
  }
}

// A component plane after the IDCT: `width` x `height` samples that count (the rest of the
// padded blocks is never read), rows `stride` apart.
struct Plane {
  const uint8_t* p = nullptr;
  int width = 0, height = 0, stride = 0;
  COHORT_HD int at(int x, int y) const {
    x = x < 0 ? 0 : (x >= width ? width - 1 : x);
    y = y < 0 ? 0 : (y >= height ? height - 1 : y);
    return p[y * stride + x];
  }
};

// The chroma sample at full-resolution pixel (x, y) of a plane subsampled by h x v: 1x1, 2x1
// (4:2:2) or 2x2 (4:2:0); other layouts decode on the CPU.
// This is libjpeg's fancy upsampling. Along a subsampled axis each output pixel takes 3/4 of the
// nearer input sample and 1/4 of the next one beyond it (edges repeat); in 2x2 the two axes combine
// into weights of 9, 3, 3 and 1 sixteenths. Rounding adds 1 or 2 (per axis) and 8 or 7 (2x2) by
// the output's parity, so that it does not drift one way.
COHORT_HD int upsample(const Plane& c, int x, int y, int h, int v) {
  if (h == 1 && v == 1) return c.at(x, y);
  const int ix = x / h, iy = y / v;
  const int dx = h == 2 ? ((x & 1) ? 1 : -1) : 0;  // towards the farther input column
  const int dy = v == 2 ? ((y & 1) ? 1 : -1) : 0;
  if (v == 1) return (3 * c.at(ix, iy) + c.at(ix + dx, iy) + ((x & 1) ? 2 : 1)) >> 2;
  // 2x2 (4:2:0); vertical first: the column sums of the nearer and the farther column.
  const int near_col = 3 * c.at(ix, iy) + c.at(ix, iy + dy);
  const int far_col = 3 * c.at(ix + dx, iy) + c.at(ix + dx, iy + dy);
  return (3 * near_col + far_col + ((x & 1) ? 7 : 8)) >> 4;
}

// JFIF's YCbCr to RGB in libjpeg's 16-bit fixed point: R = Y + 1.402 Cr', G = Y - 0.34414 Cb' -
// 0.71414 Cr', B = Y + 1.772 Cb' (Cb' = Cb - 128), each rounded, then clamped.
COHORT_HD void ycc_to_rgb(int y, int cb, int cr, uint8_t* rgb) {
  constexpr int kBits = 16, kHalf = 1 << (kBits - 1);
  constexpr int kCrR = 91881, kCbG = 22554, kCrG = 46802, kCbB = 116130;  // x * 65536, rounded
  const int cbp = cb - 128, crp = cr - 128;
  rgb[0] = clamp_sample(y + ((kCrR * crp + kHalf) >> kBits));
  rgb[1] = clamp_sample(y + ((-kCbG * cbp - kCrG * crp + kHalf) >> kBits));
  rgb[2] = clamp_sample(y + ((kCbB * cbp + kHalf) >> kBits));
}

}  // namespace cohort::data::kernels
