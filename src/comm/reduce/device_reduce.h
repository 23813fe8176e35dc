// The device path's reduction kernels (built with CUDA, cohort_comm_cuda): a thread per element
// running device_math.h's arithmetic, which equals the CPU kernels bit for bit. The native device
// path (issue 37: ranks that share a GPU or a host's GPUs, buffers exchanged by CUDA IPC) reduces
// with these. Pointers are device memory; `stream` a cudaStream_t as void*.
#pragma once

#include <cstddef>

#include "cohort/comm/types.h"

namespace cohort::comm::device {

// dst = a op b over `count` elements (dst may alias a or b).
void launch_reduce(void* dst, const void* a, const void* b, size_t count, DataType t, RedOp op,
                   void* stream);
// x /= divisor (avg's last step).
void launch_divide(void* x, size_t count, DataType t, int divisor, void* stream);

}  // namespace cohort::comm::device
