#include "reduce/reduce.h"

#include <cpuid.h>

#include <cstdint>

#include "cohort/core/error.h"
#include "cohort/core/settings.h"

namespace cohort::comm {

namespace scalar {
void reduce(void* d, const void* a, const void* b, size_t n, DataType t, RedOp op);
}
namespace avx2 {
void reduce(void* d, const void* a, const void* b, size_t n, DataType t, RedOp op);
}

namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool use_avx2() {
  static const bool yes = !env::Settings::read().no_avx2 && __builtin_cpu_supports("avx2") &&
                          has_f16c() && __builtin_cpu_supports("fma");
  return yes;
}

template <typename T>
void divide_int(T* x, size_t n, int64_t div) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<int64_t>(x[i]) / div);
}
}  // namespace

void reduce(void* d, const void* a, const void* b, size_t n, DataType t, RedOp op) {
  if (n == 0) return;
  if (use_avx2()) {
    avx2::reduce(d, a, b, n, t, op);
  } else {
    scalar::reduce(d, a, b, n, t, op);
  }
}

void divide(void* x, size_t n, DataType t, int divisor) {
  COHORT_CHECK(divisor > 0, "divisor " << divisor);
  if (divisor == 1 || n == 0) return;
  switch (t) {
    case DataType::f32: {
      auto* p = static_cast<float*>(x);
      const float s = 1.0f / static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] *= s;
      return;
    }
    case DataType::f64: {
      auto* p = static_cast<double*>(x);
      const double s = 1.0 / divisor;
      for (size_t i = 0; i < n; ++i) p[i] *= s;
      return;
    }
    case DataType::f16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = f32_to_f16(f16_to_f32(p[i]) / divisor);
      return;
    }
    case DataType::bf16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / divisor);
      return;
    }
    case DataType::i32:
      return divide_int(static_cast<int32_t*>(x), n, divisor);
    case DataType::i64:
      return divide_int(static_cast<int64_t*>(x), n, divisor);
    case DataType::u8:
      return divide_int(static_cast<uint8_t*>(x), n, divisor);
  }
}

const char* reduce_isa() {
  return use_avx2() ? "avx2" : "scalar";
}

}  // namespace cohort::comm
