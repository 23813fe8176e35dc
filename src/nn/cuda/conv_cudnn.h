// Convolution on the GPU through cuDNN: forward, backward-data and backward-filter over
// channels-last device tensors, in f32 (TF32 by a switch), bf16 or f16 (tensor cores), with
// f32 accumulation. One CudnnConv per layer and input shape: its algorithms are found once, when
// it is made (cuDNN times each candidate), within a bounded workspace taken from the caching
// device allocator as MemoryUse::workspace, so the memory report counts it. Built with CUDA only
// (cohort_nn_cuda); tests/nn/conv_gpu_test.cc checks it against the CPU engine on a GPU.
#pragma once

#include <cstddef>
#include <string>

#include "cohort/nn/layers.h"
#include "cohort/tensor/tensor.h"

namespace cohort::nn::gpu {

struct ConvSettings {
  tensor::DType type = tensor::DType::f32;  // the input, weight and output type
  bool tf32 = false;                        // f32 convolutions may use TF32 tensor cores
  size_t workspace_limit = size_t{256} << 20;
};

class CudnnConv {
 public:
  // x: the input's logical NCHW shape. The weight is [out, in / groups, k, k] in either order
  // (channels-last is what tensor cores read without a transpose).
  CudnnConv(const Conv2dOptions& o, const tensor::Shape& x, tensor::Order weight_order,
            const ConvSettings& s);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  const tensor::Shape& output_shape() const { return y_shape_; }
  // y = conv(x, w); dx = conv_transpose(dy, w); dw = the filter gradient (overwritten, or
  // accumulated into when accumulate is set). Every tensor on the current CUDA device, queued
  // on its compute stream.
  void forward(const tensor::Tensor& x, const tensor::Tensor& w, tensor::Tensor& y) const;
  void backward_data(const tensor::Tensor& dy, const tensor::Tensor& w, tensor::Tensor& dx) const;
  void backward_filter(const tensor::Tensor& x, const tensor::Tensor& dy, tensor::Tensor& dw,
                       bool accumulate = false) const;
  // "fwd 1 (IMPLICIT_PRECOMP_GEMM), bwd-data 1, bwd-filter 3; workspace 12M"
  std::string describe() const;
  size_t workspace_bytes() const { return workspace_; }

 private:
  struct Descriptors;
  Descriptors* d_;
  tensor::Shape x_shape_, y_shape_, w_shape_;
  ConvSettings s_;
  size_t workspace_ = 0;
};

}  // namespace cohort::nn::gpu
