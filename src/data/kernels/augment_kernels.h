// The pipeline's operators on the GPU, batched (a thread per output element): resampling of each
// sample's crop with its flips, rotation, the channel means for contrast, and the normalisation
// into the batch's type and layout. The maths is augment_math.h's. Built with CUDA only
// (cohort_data_cuda); pointers are device memory, `stream` a cudaStream_t as void*.
#pragma once

#include <cstdint>

#include "augment_math.h"

namespace cohort::data::kernels {

struct DeviceSample {
  const void* src = nullptr;  // interleaved height x width x channels, 8- or 16-bit
  int width = 0, height = 0, channels = 1, bits = 8;
  TapView tx, ty;  // the crop's taps (device arrays)
  bool hflip = false, vflip = false;
  bool rotate = false;
  double rot_cos = 1, rot_sin = 0;
  bool jitter = false;  // brightness and contrast
  float brightness = 0, contrast = 1;
  // The normalisation per batch channel, for this sample's value range (8 or 16 bits), as the
  // CPU pipeline computes it: v * a + b (u8: v * a).
  static constexpr int kMaxChannels = 4;
  float a[kMaxChannels] = {}, b[kMaxChannels] = {};
};

enum class BatchType : uint8_t { f32, bf16, u8 };

// planes: count x C x S x S floats. Channels beyond a sample's own repeat its first.
void launch_resample(const DeviceSample* samples, int count, int S, int C, float* planes,
                     void* stream);
// out = planes turned, for the samples that rotate (the others are copied).
void launch_rotate(const DeviceSample* samples, int count, int S, int C, const float* planes,
                   float* out, void* stream);
// means[n * C + c]: the mean of each plane, for the samples that jitter.
void launch_plane_means(const DeviceSample* samples, int count, int S, int C, const float* planes,
                        float* means, void* stream);
// The batch: brightness and contrast where drawn, then each sample's v * a[c] + b[c] (f32,
// bf16) or v * a[c] to 0..255 (u8), in NCHW or NHWC.
void launch_finish(const DeviceSample* samples, int count, int S, int C, const float* planes,
                   const float* means, BatchType type, bool nhwc, void* out, void* stream);

}  // namespace cohort::data::kernels
