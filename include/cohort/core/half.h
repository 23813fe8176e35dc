// IEEE half (f16) and bfloat16 conversions from and to f32, rounding to nearest even; NaN stays
// NaN. The one definition for the whole project: the collectives' reductions, the tensors and the
// data pipeline's bf16 output all use these.
#pragma once

#include <cstdint>
#include <cstring>

namespace cohort {

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// bfloat16 is f32's upper half, so these are a shift and a rounding add: defined here, to be
// inlined into hot loops. `static` on purpose: files compiled for other instruction sets
// (-mavx2) get a copy of their own instead of one the linker might share with generic code.
static inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace cohort
