// The device path's reduction kernels (see device_reduce.h).
#include <cuda_runtime.h>

#include "cohort/core/cuda_launch.h"
#include "cohort/core/error.h"
#include "device_math.h"
#include "device_reduce.h"

namespace cohort::comm::device {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < (size_t{1} << 20) ? b : (size_t{1} << 20));
}

__global__ void reduce_kernel(void* dst, const void* a, const void* b, size_t n, DataType t,
                              RedOp op) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    reduce_at(dst, a, b, i, t, op);
}

__global__ void divide_kernel(void* x, size_t n, DataType t, int divisor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    divide_at(x, i, t, divisor);
}

}  // namespace

void launch_reduce(void* dst, const void* a, const void* b, size_t count, DataType t, RedOp op,
                   void* stream) {
  if (count == 0) return;
  reduce_kernel<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, a, b, count, t, op);
  cuda::check_launch("reduce");
}

void launch_divide(void* x, size_t count, DataType t, int divisor, void* stream) {
  if (count == 0 || divisor == 1) return;
  divide_kernel<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, count, t,
                                                                                       divisor);
  cuda::check_launch("divide");
}

}  // namespace cohort::comm::device
