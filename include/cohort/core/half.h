// IEEE half (f16) and bfloat16 conversions from and to f32, rounding to nearest even; NaN stays
// NaN. The one definition for the whole project: the collectives' reductions, the tensors and the
// data pipeline's bf16 output all use these.
#pragma once

#include <string.h>

#include <cstdint>

#include "cohort/core/host_device.h"

namespace cohort {

// Every conversion is defined here, for the host and the GPU (COHORT_HD_STATIC), to be inlined
// into hot loops. `static` on purpose: files compiled for other instruction sets (-mavx2) get a
// copy of their own instead of one the linker might share with generic code.
COHORT_HD_STATIC float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

COHORT_HD_STATIC uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) {                                             // rounds to >= 65520
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    uint32_t exp = absx >> 23;
    uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // so that the result is man >> (shift - 13 + ...)
    // value = man * 2^(exp-150); half subnormal unit = 2^-24 -> result = man >> (126 - exp)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = absx + 0xc8000fffu + ((absx >> 13) & 1u);  // rebias (-112<<23) and round
  return static_cast<uint16_t>(sign | (r >> 13));
}

// bfloat16 is f32's upper half, so these are a shift and a rounding add.
COHORT_HD_STATIC float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

COHORT_HD_STATIC uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace cohort
