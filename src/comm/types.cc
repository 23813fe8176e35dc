#include "cohort/comm/types.h"

#include <cstring>

#include "cohort/core/error.h"

namespace cohort::comm {

const char* dtype_name(DataType t) {
  static const char* names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  auto i = static_cast<size_t>(t);
  return i < 7 ? names[i] : "invalid";
}

const char* redop_name(RedOp op) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg"};
  auto i = static_cast<size_t>(op);
  return i < 5 ? names[i] : "invalid";
}

DataType parse_dtype(const std::string& s) {
  for (DataType t : kAllDataTypes) {
    if (s == dtype_name(t)) return t;
  }
  if (s == "float") return DataType::f32;
  if (s == "double") return DataType::f64;
  if (s == "half") return DataType::f16;
  if (s == "int32") return DataType::i32;
  if (s == "int64") return DataType::i64;
  if (s == "uint8") return DataType::u8;
  COHORT_THROW("unknown data type '" << s << "' (f32, f64, f16, bf16, i32, i64, u8)");
}

RedOp parse_redop(const std::string& s) {
  for (RedOp op : kAllRedOps) {
    if (s == redop_name(op)) return op;
  }
  COHORT_THROW("unknown reduction '" << s << "' (sum, prod, min, max, avg)");
}

float f16_to_f32(uint16_t h) {
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
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
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

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace cohort::comm
