// The device path's reduction kernels on a GPU (src/comm/reduce/device_reduce.h) against the CPU
// kernels, every type and operation, bit for bit. Label gpu.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cohort/comm/types.h"
#include "cohort/core/cuda.h"
#include "cohort/core/half.h"
#include "reduce/device_reduce.h"
#include "reduce/reduce.h"
#include "testing/gpu.h"

namespace {

using cohort::comm::DataType;
using cohort::comm::RedOp;
namespace cuda = cohort::cuda;

TEST(ReduceGpu, KernelsEqualTheCpuKernels) {
  COHORT_REQUIRE_GPU();
  const cuda::Stream s = cuda::Stream::compute();
  const size_t n = (1 << 20) + 7;
  for (DataType t : cohort::comm::kAllDataTypes) {
    const size_t bytes = n * cohort::comm::dtype_size(t);
    std::vector<uint8_t> a(bytes), b(bytes);
    uint32_t x = 7;
    for (size_t i = 0; i < bytes; ++i) {
      x = x * 1664525u + 1013904223u;
      a[i] = static_cast<uint8_t>(x >> 24);
      b[i] = static_cast<uint8_t>(x >> 16);
    }
    // Floating types: finite values (random bytes make NaNs, which min and max order apart).
    auto finite = [&](std::vector<uint8_t>& v) {
      for (size_t i = 0; i < n; ++i) {
        const float f =
            static_cast<float>(static_cast<int>(v[i * cohort::comm::dtype_size(t)]) - 128) / 7.0f +
            0.5f;
        if (t == DataType::f32) std::memcpy(&v[i * 4], &f, 4);
        if (t == DataType::f64) {
          const double d = f;
          std::memcpy(&v[i * 8], &d, 8);
        }
        if (t == DataType::f16 || t == DataType::bf16) {
          const uint16_t h = t == DataType::f16 ? cohort::f32_to_f16(f) : cohort::f32_to_bf16(f);
          std::memcpy(&v[i * 2], &h, 2);
        }
      }
    };
    finite(a);
    finite(b);
    void* da = cuda::device_malloc(bytes);
    void* db = cuda::device_malloc(bytes);
    for (RedOp op : {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max, RedOp::avg}) {
      std::vector<uint8_t> want(bytes), got(bytes);
      cohort::comm::reduce(want.data(), a.data(), b.data(), n, t, op);
      if (op == RedOp::avg) cohort::comm::divide(want.data(), n, t, 2);
      cuda::copy_to_device(da, a.data(), bytes, s);
      cuda::copy_to_device(db, b.data(), bytes, s);
      cohort::comm::device::launch_reduce(da, da, db, n, t, op, s.handle());
      if (op == RedOp::avg) cohort::comm::device::launch_divide(da, n, t, 2, s.handle());
      cuda::copy_to_host(got.data(), da, bytes, s);
      s.synchronize();
      ASSERT_EQ(got, want) << cohort::comm::dtype_name(t) << " op " << static_cast<int>(op);
    }
    cuda::device_free(da);
    cuda::device_free(db);
  }
}

}  // namespace
