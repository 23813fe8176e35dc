// For .cu files: the check after a kernel launch, which every launcher calls, so that a launch
// that fails (no kernel image for this GPU, too many threads, a sticky earlier fault) throws
// cohort::Error naming the kernel and CUDA's message, where it happened.
#pragma once

#include <cuda_runtime.h>

#include "cohort/core/error.h"

namespace cohort::cuda {

inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    COHORT_THROW("CUDA kernel " << kernel << " failed to launch: " << cudaGetErrorString(e));
  }
}

}  // namespace cohort::cuda
