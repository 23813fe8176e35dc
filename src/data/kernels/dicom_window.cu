// The DICOM windowing kernel (see dicom_window.h).
#include <cuda_runtime.h>

#include "cohort/core/cuda_launch.h"
#include "cohort/core/error.h"
#include "dicom_window.h"

namespace cohort::data::kernels {

namespace {
__global__ void window_kernel(const uint8_t* raw, int width, int height, size_t row_bytes,
                              WindowParams p, const uint16_t* lut, uint16_t* out) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x >= width || y >= height) return;
  const uint32_t bits = stored_bits(raw + y * row_bytes, x, p);
  out[int64_t(y) * width + x] = lut ? lut[bits] : window_value(bits, p);
}
}  // namespace

void launch_dicom_window(const uint8_t* raw, int width, int height, size_t row_bytes,
                         const WindowParams& p, const uint16_t* lut, uint16_t* out, void* stream) {
  if (width <= 0 || height <= 0) return;
  constexpr int kThreads = 256;
  const dim3 grid((width + kThreads - 1) / kThreads, height);
  window_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(raw, width, height,
                                                                          row_bytes, p, lut, out);
  cuda::check_launch("dicom_window");
}

}  // namespace cohort::data::kernels
