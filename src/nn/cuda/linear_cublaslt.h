// Linear layers on the GPU through cuBLASLt: y = x W^T + b with the bias added in the matmul's
// epilogue, and backward as two matmuls, dx = dy W and dW = dy^T x, the bias gradient summed in
// the second one's epilogue (BGRADB). Row-major x [N, in], W [out, in] (PyTorch's order, as the
// flat buffers hold it), y [N, out]; f32 (TF32 by a switch), bf16 or f16 with f32 accumulation.
// One CublasLtLinear per layer and batch size: its algorithms are chosen once, by cuBLASLt's
// heuristic, within a workspace taken from the caching device allocator as workspace memory.
// Built with CUDA only (cohort_nn_cuda); tests/nn/linear_gpu_test.cc checks it on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/tensor/tensor.h"

namespace cohort::nn::gpu {

struct LinearSettings {
  tensor::DType type = tensor::DType::f32;
  bool tf32 = false;
  size_t workspace_limit = size_t{32} << 20;
};

class CublasLtLinear {
 public:
  CublasLtLinear(int64_t batch, int in, int out, bool bias, const LinearSettings& s);
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  // Every tensor dense, row-major, on the current CUDA device; queued on its compute stream.
  void forward(const tensor::Tensor& x, const tensor::Tensor& w, const tensor::Tensor* b,
               tensor::Tensor& y) const;
  // dx = dy W (skipped when dx is null); dw = dy^T x and db = the column sums of dy.
  void backward(const tensor::Tensor& x, const tensor::Tensor& w, const tensor::Tensor& dy,
                tensor::Tensor* dx, tensor::Tensor& dw, tensor::Tensor* db) const;

 private:
  struct Plans;
  Plans* p_;
  int64_t n_;
  int in_, out_;
  bool bias_;
  LinearSettings s_;
};

}  // namespace cohort::nn::gpu
