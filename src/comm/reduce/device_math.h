// The collectives' elementwise reduction, one element at a time, for the host and the GPU
// (COHORT_HD): what the device path's reduction kernels run (device_reduce.cu), checked on the
// host against comm::reduce and comm::divide (reduce_device_math_test), which they must equal
// bit for bit: f16 and bf16 computed in f32 and rounded once, min and max as the CPU kernels
// order them, avg as a sum finished by a division.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cohort/comm/types.h"
#include "cohort/core/half.h"
#include "cohort/core/host_device.h"

namespace cohort::comm::device {

template <class T>
COHORT_HD T combine(T a, T b, RedOp op) {
  switch (op) {
    case RedOp::prod:
      return static_cast<T>(a * b);
    case RedOp::min:
      return b < a ? b : a;
    case RedOp::max:
      return a < b ? b : a;
    case RedOp::sum:
    case RedOp::avg:
    default:
      return static_cast<T>(a + b);
  }
}

// dst[i] = a[i] op b[i] for element i of buffers of type t (dst may alias a or b).
COHORT_HD void reduce_at(void* dst, const void* a, const void* b, size_t i, DataType t, RedOp op) {
  switch (t) {
    case DataType::f32:
      static_cast<float*>(dst)[i] =
          combine(static_cast<const float*>(a)[i], static_cast<const float*>(b)[i], op);
      return;
    case DataType::f64:
      static_cast<double*>(dst)[i] =
          combine(static_cast<const double*>(a)[i], static_cast<const double*>(b)[i], op);
      return;
    case DataType::f16:
      static_cast<uint16_t*>(dst)[i] =
          f32_to_f16(combine(f16_to_f32(static_cast<const uint16_t*>(a)[i]),
                             f16_to_f32(static_cast<const uint16_t*>(b)[i]), op));
      return;
    case DataType::bf16:
      static_cast<uint16_t*>(dst)[i] =
          f32_to_bf16(combine(bf16_to_f32(static_cast<const uint16_t*>(a)[i]),
                              bf16_to_f32(static_cast<const uint16_t*>(b)[i]), op));
      return;
    case DataType::i32:
      static_cast<int32_t*>(dst)[i] =
          combine(static_cast<const int32_t*>(a)[i], static_cast<const int32_t*>(b)[i], op);
      return;
    case DataType::i64:
      static_cast<int64_t*>(dst)[i] =
          combine(static_cast<const int64_t*>(a)[i], static_cast<const int64_t*>(b)[i], op);
      return;
    case DataType::u8:
      static_cast<uint8_t*>(dst)[i] =
          combine(static_cast<const uint8_t*>(a)[i], static_cast<const uint8_t*>(b)[i], op);
      return;
  }
}

// x[i] /= divisor, avg's last step, as comm::divide does it per type (f32 and f64 multiply by
// the reciprocal; integers divide as int64).
COHORT_HD void divide_at(void* x, size_t i, DataType t, int divisor) {
  switch (t) {
    case DataType::f32:
      static_cast<float*>(x)[i] *= 1.0f / static_cast<float>(divisor);
      return;
    case DataType::f64:
      static_cast<double*>(x)[i] *= 1.0 / divisor;
      return;
    case DataType::f16: {
      auto* p = static_cast<uint16_t*>(x);
      p[i] = f32_to_f16(f16_to_f32(p[i]) / divisor);
      return;
    }
    case DataType::bf16: {
      auto* p = static_cast<uint16_t*>(x);
      p[i] = f32_to_bf16(bf16_to_f32(p[i]) / divisor);
      return;
    }
    case DataType::i32: {
      auto* p = static_cast<int32_t*>(x);
      p[i] = static_cast<int32_t>(static_cast<int64_t>(p[i]) / divisor);
      return;
    }
    case DataType::i64: {
      auto* p = static_cast<int64_t*>(x);
      p[i] = static_cast<int64_t>(p[i] / divisor);
      return;
    }
    case DataType::u8: {
      auto* p = static_cast<uint8_t*>(x);
      p[i] = static_cast<uint8_t>(static_cast<int64_t>(p[i]) / divisor);
      return;
    }
  }
}

}  // namespace cohort::comm::device
