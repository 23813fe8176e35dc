// The device path's reduction arithmetic (src/comm/reduce/device_math.h) against the CPU
// kernels (comm::reduce, comm::divide, AVX2 where the CPU has it): every type and operation,
// bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cohort/comm/types.h"
#include "cohort/core/half.h"
#include "reduce/device_math.h"
#include "reduce/reduce.h"

namespace {

using cohort::comm::DataType;
using cohort::comm::RedOp;

// n elements of type t with values that exercise the operation without NaN or signed zeros
// meeting (where the CPU's vector min and max may order them otherwise).
std::vector<uint8_t> values(DataType t, size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n * cohort::comm::dtype_size(t));
  uint32_t s = seed;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const double x = (static_cast<double>(s >> 8) / (1 << 24) - 0.5) * 200.0 + 0.125;
    switch (t) {
      case DataType::f32: {
        const float f = static_cast<float>(x);
        std::memcpy(&v[i * 4], &f, 4);
        break;
      }
      case DataType::f64:
        std::memcpy(&v[i * 8], &x, 8);
        break;
      case DataType::f16: {
        const uint16_t h = cohort::f32_to_f16(static_cast<float>(x));
        std::memcpy(&v[i * 2], &h, 2);
        break;
      }
      case DataType::bf16: {
        const uint16_t h = cohort::f32_to_bf16(static_cast<float>(x));
        std::memcpy(&v[i * 2], &h, 2);
        break;
      }
      case DataType::i32: {
        const int32_t k = static_cast<int32_t>(x * 1000);
        std::memcpy(&v[i * 4], &k, 4);
        break;
      }
      case DataType::i64: {
        const int64_t k = static_cast<int64_t>(x * 1e6);
        std::memcpy(&v[i * 8], &k, 8);
        break;
      }
      case DataType::u8:
        v[i] = static_cast<uint8_t>(s >> 24);
        break;
    }
  }
  return v;
}

TEST(ReduceDeviceMath, EveryTypeAndOperationEqualsTheCpuKernels) {
  const size_t n = 1031;  // not a multiple of any vector width
  for (DataType t : cohort::comm::kAllDataTypes) {
    for (RedOp op : {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max, RedOp::avg}) {
      const auto a = values(t, n, 1), b = values(t, n, 2);
      std::vector<uint8_t> cpu(a.size()), dev(a.size());
      cohort::comm::reduce(cpu.data(), a.data(), b.data(), n, t, op);
      for (size_t i = 0; i < n; ++i)
        cohort::comm::device::reduce_at(dev.data(), a.data(), b.data(), i, t, op);
      if (op == RedOp::avg) {
        cohort::comm::divide(cpu.data(), n, t, 3);
        for (size_t i = 0; i < n; ++i) cohort::comm::device::divide_at(dev.data(), i, t, 3);
      }
      EXPECT_EQ(cpu, dev) << cohort::comm::dtype_name(t) << " op " << static_cast<int>(op)
                          << " (CPU kernels: " << cohort::comm::reduce_isa() << ")";
    }
  }
}

}  // namespace
