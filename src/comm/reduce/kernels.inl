// Included by reduce_scalar.cc and reduce_avx2.cc: one source, compiled once per ISA, so
// the two kernel sets cannot drift apart. The including file defines COHORT_KERNEL_NS.
#include <cstdint>
#include <cstring>

#include "cohort/comm/types.h"

namespace cohort::comm::COHORT_KERNEL_NS {

inline float h2f(uint16_t h) {
  return f16_to_f32(h);
}
inline float bf2f(uint16_t h) {
  return bf16_to_f32(h);
}
inline uint16_t f2bf(float f) {
  return f32_to_bf16(f);
}

template <typename T>
struct Sum {
  static T apply(T a, T b) { return static_cast<T>(a + b); }
};
template <typename T>
struct Prod {
  static T apply(T a, T b) { return static_cast<T>(a * b); }
};
template <typename T>
struct Min {
  static T apply(T a, T b) { return b < a ? b : a; }
};
template <typename T>
struct Max {
  static T apply(T a, T b) { return a < b ? b : a; }
};

template <typename T, template <typename> class Op>
void loop(T* __restrict__ d, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Op<T>::apply(a[i], b[i]);
}

template <template <typename> class Op>
void loop_bf16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f2bf(Op<float>::apply(bf2f(a[i]), bf2f(b[i])));
}

template <template <typename> class Op>
void loop_f16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n);

template <template <typename> class Op>
void dispatch_type(void* d, const void* a, const void* b, size_t n, DataType t) {
  switch (t) {
    case DataType::f32:
      return loop<float, Op>(static_cast<float*>(d), static_cast<const float*>(a),
                             static_cast<const float*>(b), n);
    case DataType::f64:
      return loop<double, Op>(static_cast<double*>(d), static_cast<const double*>(a),
                              static_cast<const double*>(b), n);
    case DataType::i32:
      return loop<int32_t, Op>(static_cast<int32_t*>(d), static_cast<const int32_t*>(a),
                               static_cast<const int32_t*>(b), n);
    case DataType::i64:
      return loop<int64_t, Op>(static_cast<int64_t*>(d), static_cast<const int64_t*>(a),
                               static_cast<const int64_t*>(b), n);
    case DataType::u8:
      return loop<uint8_t, Op>(static_cast<uint8_t*>(d), static_cast<const uint8_t*>(a),
                               static_cast<const uint8_t*>(b), n);
    case DataType::bf16:
      return loop_bf16<Op>(static_cast<uint16_t*>(d), static_cast<const uint16_t*>(a),
                           static_cast<const uint16_t*>(b), n);
    case DataType::f16:
      return loop_f16<Op>(static_cast<uint16_t*>(d), static_cast<const uint16_t*>(a),
                          static_cast<const uint16_t*>(b), n);
  }
}

void reduce(void* d, const void* a, const void* b, size_t n, DataType t, RedOp op) {
  switch (op) {
    case RedOp::sum:
    case RedOp::avg:
      return dispatch_type<Sum>(d, a, b, n, t);
    case RedOp::prod:
      return dispatch_type<Prod>(d, a, b, n, t);
    case RedOp::min:
      return dispatch_type<Min>(d, a, b, n, t);
    case RedOp::max:
      return dispatch_type<Max>(d, a, b, n, t);
  }
}

}  // namespace cohort::comm::COHORT_KERNEL_NS
