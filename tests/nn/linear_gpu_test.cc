// cuBLASLt Linear (src/nn/cuda/linear_cublaslt.h) on a GPU against sums on the host in double:
// y = x W^T + b with the bias in the epilogue, dx = dy W, dW = dy^T x and db = the column sums
// of dy (the BGRADB epilogue); f32 without TF32 within 1e-4, bf16 within 1e-2 of the largest
// value, inputs rounded to bf16 on both sides. Label gpu: scripts/gpu-check runs it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../../src/nn/cuda/linear_cublaslt.h"
#include "cohort/core/cuda.h"
#include "testing/gpu.h"

namespace {

using cohort::nn::gpu::CublasLtLinear;
using cohort::nn::gpu::LinearSettings;
using cohort::tensor::Device;
using cohort::tensor::DType;
using cohort::tensor::Shape;
using cohort::tensor::Tensor;

class LinearGpu : public ::testing::Test {
 protected:
  void SetUp() override { COHORT_REQUIRE_GPU(); }
};

using cohort::testing::from_gpu;
using cohort::testing::gpu_test_values;

Tensor on_gpu(const std::vector<float>& v, const Shape& s, DType type) {
  return cohort::testing::to_gpu(v, s, cohort::tensor::Order::contiguous, type);
}

void compare(const char* what, const std::vector<float>& got, const std::vector<double>& want,
             double tol) {
  double scale = 1e-12;
  for (double v : want) scale = std::max(scale, std::abs(v));
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * scale) << what << " element " << i;
}

void run(int N, int in, int out, bool with_bias, DType type, double tol) {
  const bool bf16 = type == DType::bf16;
  LinearSettings s;
  s.type = type;
  CublasLtLinear lin(N, in, out, with_bias, s);
  auto xv = gpu_test_values(size_t(N) * in, 1, bf16),
       wv = gpu_test_values(size_t(out) * in, 2, bf16), bv = gpu_test_values(out, 3, bf16),
       dyv = gpu_test_values(size_t(N) * out, 4, bf16);
  Tensor x = on_gpu(xv, {N, in}, type), w = on_gpu(wv, {out, in}, type),
         b = on_gpu(bv, {out}, type), dy = on_gpu(dyv, {N, out}, type);
  Tensor y = Tensor::empty_on(Device::cuda, {N, out}, type);
  Tensor dx = Tensor::empty_on(Device::cuda, {N, in}, type);
  Tensor dw = Tensor::empty_on(Device::cuda, {out, in}, type);
  Tensor db = Tensor::empty_on(Device::cuda, {out}, type);
  lin.forward(x, w, with_bias ? &b : nullptr, y);
  lin.backward(x, w, dy, &dx, dw, with_bias ? &db : nullptr);

  std::vector<double> ry(size_t(N) * out), rdx(size_t(N) * in), rdw(size_t(out) * in), rdb(out);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double acc = with_bias ? bv[o] : 0.0;
      for (int i = 0; i < in; ++i) {
        acc += double(xv[n * in + i]) * wv[o * in + i];
        rdx[n * in + i] += double(dyv[n * out + o]) * wv[o * in + i];
        rdw[o * in + i] += double(dyv[n * out + o]) * xv[n * in + i];
      }
      ry[n * out + o] = acc;
      rdb[o] += dyv[n * out + o];
    }
  compare("forward", from_gpu(y), ry, tol);
  compare("backward-data", from_gpu(dx), rdx, tol);
  compare("backward-filter", from_gpu(dw), rdw, tol);
  if (with_bias) compare("bias gradient", from_gpu(db), rdb, tol);
}

TEST_F(LinearGpu, F32MatchesTheHostSums) {
  run(8, 64, 10, true, DType::f32, 1e-4);
  run(32, 512, 1000, true, DType::f32, 1e-4);  // resnet's classifier
  run(5, 33, 7, false, DType::f32, 1e-4);
}

TEST_F(LinearGpu, Bf16MatchesWithinItsPrecision) {
  run(32, 512, 1000, true, DType::bf16, 1e-2);
  run(16, 1024, 14, true, DType::bf16, 1e-2);  // densenet121's head on 14 findings
}

}  // namespace
