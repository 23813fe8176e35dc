// The pipeline's operators after decoding, on the GPU, for a batch (DALI's role): each sample's
// crop resampled from its decoded image in device memory (DeviceJpegDecoder's pixels, or
// DeviceDicomWindow's values), flipped, turned, jittered in brightness and contrast and
// normalised into the batch's type and layout, with the CPU operators' arithmetic
// (kernels/augment_math.h). The caller draws each sample's parameters from the same random
// streams as the CPU pipeline, so that a seed gives the same crops on either device. Built with
// CUDA only (cohort_data_cuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cohort/core/cuda.h"
#include "cohort/data/ops.h"
#include "device_buffer.h"
#include "device_stage.h"
#include "kernels/augment_kernels.h"

namespace cohort::data {

struct DeviceImage {
  const void* pixels = nullptr;  // device memory, interleaved height x width x channels
  int width = 0, height = 0, channels = 1, bits = 8;
};

class DeviceAugment {
 public:
  // size: the output's side; channels: the batch's (a gray image fills them all); mean and std
  // per channel (the last repeats), as the CPU pipeline's options.
  DeviceAugment(int size, int channels, std::vector<float> mean, std::vector<float> std,
                kernels::BatchType type, bool nhwc);
  DeviceAugment(const DeviceAugment&) = delete;
  DeviceAugment& operator=(const DeviceAugment&) = delete;

  // Writes the batch to `out` (device memory of count x channels x size x size elements),
  // queued on `s`; returns once the parameters are copied out of the staging buffer.
  void run(const std::vector<DeviceImage>& images, const std::vector<AugmentParams>& params,
           void* out, const cuda::Stream& s);

 private:
  int size_, channels_;
  std::vector<float> mean_, std_;
  kernels::BatchType type_;
  bool nhwc_;
  GrowingBuffer staging_{true}, params_{false}, planes_{false}, turned_{false}, means_{false};
};

}  // namespace cohort::data
