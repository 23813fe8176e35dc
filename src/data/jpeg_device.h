// The mixed JPEG decoder's batch on the GPU: the coefficients of many images (entropy-decoded on
// the CPU by read_jpeg_coefficients) packed into one page-locked buffer, copied in one transfer,
// then two launches (IDCT; upsampling and colour) for the whole batch. Built with CUDA only
// (cohort_data_cuda); tests/data/jpeg_gpu_test.cc checks it against the host run of the same
// arithmetic and against libjpeg-turbo.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cohort/core/cuda.h"
#include "cohort/data/jpeg_coefficients.h"
#include "device_buffer.h"

namespace cohort::data {

class DeviceJpegDecoder {
 public:
  DeviceJpegDecoder() = default;
  DeviceJpegDecoder(const DeviceJpegDecoder&) = delete;
  DeviceJpegDecoder& operator=(const DeviceJpegDecoder&) = delete;

  struct Decoded {
    const uint8_t* pixels = nullptr;  // device memory: height x width x channels, interleaved
    int width = 0, height = 0, channels = 0;
  };
  // Queues the batch's decoding on `s`; the pixels stay valid until the next call. The host
  // returns once the packed coefficients have been copied out of its staging buffer.
  std::vector<Decoded> decode(const std::vector<JpegCoefficients>& batch, const cuda::Stream& s);

 private:
  GrowingBuffer staging_{true};  // page-locked host memory
  GrowingBuffer coef_{false}, planes_{false}, out_{false};
};

}  // namespace cohort::data
