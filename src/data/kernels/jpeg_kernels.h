// The device half of the mixed JPEG decoder: batched kernels over many images' coefficients
// (read_jpeg_coefficients on the CPU), running jpeg_math.h's arithmetic. Built with CUDA only
// (cohort_data_cuda). Every pointer is device memory; `stream` is a cudaStream_t as void*.
#pragma once

#include <cstdint>

namespace cohort::data::kernels {

struct DeviceJpegComponent {
  const int16_t* coef = nullptr;    // blocks_w * blocks_h blocks of 64, natural order
  const uint16_t* quant = nullptr;  // 64 entries
  uint8_t* plane = nullptr;         // blocks_w * 8 by blocks_h * 8 samples
  int blocks_w = 0, blocks_h = 0;
  int width = 0, height = 0;  // samples that count
  int h = 1, v = 1;           // subsampling (1 or 2)
};

struct DeviceJpegImage {
  DeviceJpegComponent comp[3];
  int components = 0, width = 0, height = 0;
  uint8_t* out = nullptr;  // height x width x (1 or 3), interleaved
};

// Every 8x8 block of every component of `count` images: block_start has one entry per
// (image, component) pair, in that order, plus the total at the end (a prefix sum).
void launch_jpeg_idct(const DeviceJpegImage* images, int count, const int64_t* block_start,
                      int64_t blocks, void* stream);
// Upsampling and colour conversion into each image's `out`; max_w x max_h covers every image.
void launch_jpeg_color(const DeviceJpegImage* images, int count, int max_w, int max_h,
                       void* stream);

}  // namespace cohort::data::kernels
