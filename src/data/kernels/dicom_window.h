// DICOM windowing on the GPU: stored values to 16-bit output values, a thread per pixel, with
// window_math.h's maths (the CPU decoder's). Built with CUDA only (cohort_data_cuda); pointers
// are device memory, `stream` a cudaStream_t as void*.
#pragma once

#include <cstddef>
#include <cstdint>

#include "window_math.h"

namespace cohort::data::kernels {

// `lut`: the table of every stored value's output (up to 16 stored bits), or null to window
// each pixel from its value (32-bit).
void launch_dicom_window(const uint8_t* raw, int width, int height, size_t row_bytes,
                         const WindowParams& p, const uint16_t* lut, uint16_t* out, void* stream);

}  // namespace cohort::data::kernels
