// cuDNN convolution (src/nn/cuda/conv_cudnn.h) on a GPU against a direct sum on the host in
// double: forward, backward-data and backward-filter, with strides, padding, dilation and
// groups, in f32 (no TF32: within 1e-4) and bf16 (inputs rounded to bf16 on both sides, f32
// accumulation: within 1e-2 of the largest value). Label gpu: scripts/gpu-check runs it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../../src/nn/cuda/conv_cudnn.h"
#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "cohort/tensor/device_allocator.h"
#include "testing/gpu.h"

namespace {

using cohort::nn::Conv2dOptions;
using cohort::nn::gpu::ConvSettings;
using cohort::nn::gpu::CudnnConv;
using cohort::tensor::Device;
using cohort::tensor::DType;
using cohort::tensor::Order;
using cohort::tensor::Shape;
using cohort::tensor::Tensor;

class ConvGpu : public ::testing::Test {
 protected:
  void SetUp() override { COHORT_REQUIRE_GPU(); }
};

using cohort::testing::from_gpu;
using cohort::testing::gpu_test_values;
using cohort::testing::to_gpu;

struct Case {
  Conv2dOptions o;
  Shape x;
};

void run(const Case& c, DType type, Order weight_order, double tol) {
  const Conv2dOptions& o = c.o;
  const bool bf16 = type == DType::bf16;
  ConvSettings s;
  s.type = type;
  CudnnConv conv(o, c.x, weight_order, s);
  const Shape y = conv.output_shape();
  const int N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3], K = y[1], P = y[2], Q = y[3];
  const int cin = C / o.groups, cout = K / o.groups, R = o.kernel;
  const Shape ws{K, cin, R, R};
  auto xv = gpu_test_values(N * C * H * W, 1, bf16), wv = gpu_test_values(K * cin * R * R, 2, bf16),
       dyv = gpu_test_values(N * K * P * Q, 3, bf16);
  Tensor x = to_gpu(xv, c.x, Order::channels_last, type);
  Tensor w = to_gpu(wv, ws, weight_order, type);
  Tensor dy = to_gpu(dyv, y, Order::channels_last, type);
  Tensor out = Tensor::empty_on(Device::cuda, y, type, Order::channels_last);
  Tensor dx = Tensor::empty_on(Device::cuda, c.x, type, Order::channels_last);
  Tensor dw = Tensor::empty_on(Device::cuda, ws, type, weight_order);
  conv.forward(x, w, out);
  conv.backward_data(dy, w, dx);
  conv.backward_filter(x, dy, dw);
  const auto got_y = from_gpu(out), got_dx = from_gpu(dx), got_dw = from_gpu(dw);

  std::vector<double> ry(got_y.size()), rdx(got_dx.size()), rdw(got_dw.size());
  auto xi = [&](int n, int ch, int h, int w_) { return ((n * C + ch) * H + h) * W + w_; };
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int p = 0; p < P; ++p)
        for (int q = 0; q < Q; ++q) {
          const int g = k / cout, yi = ((n * K + k) * P + p) * Q + q;
          for (int ci = 0; ci < cin; ++ci)
            for (int r = 0; r < R; ++r)
              for (int t = 0; t < R; ++t) {
                const int ih = p * o.stride - o.padding + r * o.dilation;
                const int iw = q * o.stride - o.padding + t * o.dilation;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int wi = ((k * cin + ci) * R + r) * R + t;
                const int x_at = xi(n, g * cin + ci, ih, iw);
                ry[yi] += double(xv[x_at]) * wv[wi];
                rdx[x_at] += double(dyv[yi]) * wv[wi];
                rdw[wi] += double(dyv[yi]) * xv[x_at];
              }
        }
  auto compare = [&](const char* what, const std::vector<float>& got,
                     const std::vector<double>& want) {
    double scale = 1e-12;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol * scale)
          << what << " element " << i << " of " << got.size() << " (" << conv.describe() << ")";
  };
  compare("forward", got_y, ry);
  compare("backward-data", got_dx, rdx);
  compare("backward-filter", got_dw, rdw);
}

const std::vector<Case> kCases = {
    {{8, 16, 3, 1, 1, 1, 1, false}, {2, 8, 9, 9}},
    {{8, 16, 3, 2, 1, 1, 1, false}, {2, 8, 9, 10}},
    {{8, 8, 3, 1, 2, 2, 2, false}, {2, 8, 11, 9}},
    {{16, 32, 1, 1, 0, 1, 1, false}, {4, 16, 7, 7}},
    {{3, 16, 7, 2, 3, 1, 1, false}, {2, 3, 20, 20}},  // a stem's 7x7 on 3 channels
};

TEST_F(ConvGpu, F32MatchesTheDirectSum) {
  for (const Case& c : kCases) run(c, DType::f32, Order::channels_last, 1e-4);
  run(kCases[0], DType::f32, Order::contiguous, 1e-4);  // a KCRS weight too
}

TEST_F(ConvGpu, Bf16OnTensorCoresMatchesWithinItsPrecision) {
  for (const Case& c : kCases) run(c, DType::bf16, Order::channels_last, 1e-2);
}

TEST_F(ConvGpu, TheWorkspaceIsBoundedAndCounted) {
  ConvSettings s;
  s.workspace_limit = size_t{4} << 20;
  CudnnConv conv(kCases[0].o, kCases[0].x, Order::channels_last, s);
  EXPECT_LE(conv.workspace_bytes(), s.workspace_limit) << conv.describe();
  auto& a = cohort::tensor::DeviceAllocator::cuda();
  EXPECT_GE(a.stats().peak_workspace, s.workspace_limit);  // the search's scratch was counted
  EXPECT_EQ(a.stats().workspace, 0u);                      // and given back
}

// The runtime names a local rank beyond the machine's GPUs.
TEST_F(ConvGpu, ALocalRankBeyondTheGpusIsNamed) {
  const int n = cohort::cuda::device_count();
  try {
    cohort::cuda::use_device(n, "local rank " + std::to_string(n));
    FAIL() << "GPU " << n << " of " << n << " was accepted";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("asks for GPU " + std::to_string(n)), std::string::npos)
        << e.what();
  }
}

}  // namespace
