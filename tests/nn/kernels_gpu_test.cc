// nn's CUDA kernels on a GPU against the same maths on the host (src/nn/kernels/math.h, which
// kernel_math_test checks against the CPU engine). Built with COHORT_CUDA and labelled `gpu`:
// scripts/test runs it where a CUDA device is present and says so where none is.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../../src/nn/kernels/kernels.h"

namespace cohort::nn::kernels {
namespace {

#define CUDA_OK(call)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (call);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)

std::vector<float> randoms(size_t n, unsigned seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Device copies of host vectors, freed at the end of the test.
struct Device {
  std::vector<void*> owned;
  ~Device() {
    for (void* p : owned) cudaFree(p);
  }
  template <typename T>
  T* put(const std::vector<T>& v) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)) != cudaSuccess) return nullptr;
    owned.push_back(p);
    cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> get(const T* p, size_t n) {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

double worst(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    w = std::max(w, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  }
  return w;
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    ASSERT_TRUE(e == cudaSuccess && n > 0)
        << "no CUDA device (" << cudaGetErrorString(e)
        << "): this test needs a GPU; scripts/test leaves the `gpu` label out where none is";
  }
};

// One launch over three ranges (one spanning several chunks, one smaller than a chunk, one
// empty), for each optimiser, against the host maths on the same values.
TEST_F(Gpu, OptimisersInOneLaunchMatchTheHostMaths) {
  const std::vector<int64_t> sizes = {3 * kChunk + 5, 100, 0};
  for (const char* kind : {"sgd", "adamw", "lars"}) {
    SCOPED_TRACE(kind);
    Device dev;
    std::vector<std::vector<float>> w, g, s0, s1;
    std::vector<float*> dw, ds0, ds1;
    std::vector<const float*> dg;
    std::vector<int64_t> first = {0};
    for (size_t r = 0; r < sizes.size(); ++r) {
      const size_t n = static_cast<size_t>(sizes[r]);
      w.push_back(randoms(n, 1 + r));
      g.push_back(randoms(n, 10 + r, 0.1f));
      s0.push_back(randoms(n, 20 + r, 0.01f));
      s1.emplace_back(n, 0.001f);
      dw.push_back(dev.put(w[r]));
      dg.push_back(dev.put(g[r]));
      ds0.push_back(dev.put(s0[r]));
      ds1.push_back(dev.put(s1[r]));
      first.push_back(first.back() + chunks_of(sizes[r], kChunk));
    }
    DeviceRanges d;
    d.first_chunk = dev.put(first);
    d.n = dev.put(sizes);
    d.w = dev.put(dw);
    d.g = dev.put(dg);
    d.state0 = dev.put(ds0);
    d.state1 = dev.put(ds1);
    d.ranges = static_cast<int>(sizes.size());
    d.chunks = first.back();
    const SgdStep sgd{0.1f, 0.9f, 1e-4f, true};
    const AdamWStep adam = adamw_step(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
    const std::vector<float> trust = {0.02f, 1.0f, 1.0f}, decay = {5e-4f, 0.0f, 0.0f};
    if (std::string(kind) == "sgd") launch_sgd(d, sgd, nullptr);
    if (std::string(kind) == "adamw") launch_adamw(d, adam, nullptr);
    if (std::string(kind) == "lars") {
      launch_lars(d, dev.put(trust), dev.put(decay), 0.1f, 0.9f, nullptr);
    }
    CUDA_OK(cudaDeviceSynchronize());
    for (size_t r = 0; r < sizes.size(); ++r) {
      const std::vector<float> got_w = dev.get(dw[r], w[r].size());
      const std::vector<float> got_m = dev.get(ds0[r], w[r].size());
      for (size_t i = 0; i < w[r].size(); ++i) {
        if (std::string(kind) == "sgd") sgd_update(w[r][i], g[r][i], s0[r][i], sgd);
        if (std::string(kind) == "adamw") adamw_update(w[r][i], g[r][i], s0[r][i], s1[r][i], adam);
        if (std::string(kind) == "lars") {
          lars_update(w[r][i], g[r][i], s0[r][i], 0.1f, 0.9f, trust[r], decay[r]);
        }
      }
      // The device contracts a * b + c into one rounding (FMA) where the host rounds twice.
      EXPECT_LE(worst(got_w, w[r]), 1e-6) << "range " << r;
      EXPECT_LE(worst(got_m, s0[r]), 1e-6) << "range " << r;
    }
  }
}

TEST_F(Gpu, LossesMatchTheHostMaths) {
  const int rows = 64, k = 14;
  Device dev;
  const std::vector<float> z = randoms(static_cast<size_t>(rows * k), 3, 3.0f);
  std::vector<int32_t> labels(rows);
  for (int i = 0; i < rows; ++i) labels[static_cast<size_t>(i)] = (i * 5) % k;
  float* dprob = dev.put(std::vector<float>(z.size()));
  double* dloss = dev.put(std::vector<double>(rows));
  float* ddz = dev.put(std::vector<float>(z.size()));
  const float* dzv = dev.put(z);
  const int32_t* dl = dev.put(labels);
  launch_softmax_xent(dzv, dl, rows, k, 0.1f, dprob, dloss, nullptr);
  launch_softmax_xent_grad(dprob, dl, rows, k, 0.1f, 1.0f / rows, ddz, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto loss = dev.get(dloss, rows);
  const auto dz = dev.get(ddz, z.size());
  std::vector<float> prob(z.size()), want_dz(z.size());
  for (int i = 0; i < rows; ++i) {
    const double l = softmax_xent_row(z.data() + i * k, k, labels[static_cast<size_t>(i)], 0.1f,
                                      prob.data() + i * k);
    EXPECT_NEAR(loss[static_cast<size_t>(i)], l, 1e-9 * std::max(1.0, std::abs(l))) << i;
  }
  for (size_t e = 0; e < z.size(); ++e) {
    want_dz[e] =
        softmax_xent_grad(prob[e], static_cast<int>(e % k) == labels[e / k], 0.1f, k, 1.0f / rows);
  }
  EXPECT_LE(worst(dz, want_dz), 1e-6);
  // BCE on the same logits, targets 0/1.
  std::vector<float> t(z.size());
  for (size_t e = 0; e < t.size(); ++e) t[e] = static_cast<float>(e % 3 == 0);
  double* dbce = dev.put(std::vector<double>(z.size()));
  float* ddx = dev.put(std::vector<float>(z.size()));
  const float* dt = dev.put(t);
  launch_bce_with_logits(dzv, dt, static_cast<int64_t>(z.size()), dbce, nullptr);
  launch_bce_with_logits_grad(dzv, dt, static_cast<int64_t>(z.size()), 0.5f, ddx, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto bce = dev.get(dbce, z.size());
  const auto dx = dev.get(ddx, z.size());
  std::vector<float> want_dx(z.size());
  for (size_t e = 0; e < z.size(); ++e) {
    EXPECT_NEAR(bce[e], bce_with_logits_value(z[e], t[e]), 1e-9) << e;
    want_dx[e] = bce_with_logits_grad(z[e], t[e], 0.5f);
  }
  EXPECT_LE(worst(dx, want_dx), 1e-6);
}

TEST_F(Gpu, BatchNormApplyAndUnscaleMatchTheHostMaths) {
  const int64_t m = 3000;
  const int c = 24;
  Device dev;
  const auto x = randoms(static_cast<size_t>(m * c), 4), res = randoms(x.size(), 5);
  const auto mean = randoms(c, 6, 0.1f), gamma = randoms(c, 7), beta = randoms(c, 8);
  std::vector<float> invstd(c);
  for (int i = 0; i < c; ++i) invstd[static_cast<size_t>(i)] = bn_invstd(1.0 + 0.1 * i, 1e-5f);
  float* dy = dev.put(std::vector<float>(x.size()));
  launch_bn_apply(dev.put(x), dev.put(res), m, c, dev.put(mean), dev.put(invstd), dev.put(gamma),
                  dev.put(beta), true, dy, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto y = dev.get(dy, x.size());
  std::vector<float> want(x.size());
  for (size_t e = 0; e < x.size(); ++e) {
    const size_t ch = e % static_cast<size_t>(c);
    want[e] = relu(bn_apply(x[e], mean[ch], invstd[ch], gamma[ch], beta[ch]) + res[e]);
  }
  EXPECT_LE(worst(y, want), 1e-6);
  // The loss scaler: a clean pass unscales; one overflow leaves the gradients as they were.
  for (bool overflow : {false, true}) {
    std::vector<float> g = randoms(100000, 9, 100.0f);
    if (overflow) g[777] = INFINITY;
    float* dg = dev.put(g);
    unsigned int* dflag = dev.put(std::vector<unsigned int>{0});
    launch_unscale(dg, static_cast<int64_t>(g.size()), 1.0f / 512, dflag, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(dev.get(dflag, 1)[0] > 0, overflow);
    const auto got = dev.get(dg, g.size());
    for (size_t e = 0; e < g.size(); ++e) {
      const float w = overflow ? g[e] : unscale(g[e], 1.0f / 512);
      if (!(std::isinf(w) && std::isinf(got[e]))) {
        ASSERT_EQ(got[e], w) << e;
      }
    }
  }
}

}  // namespace
}  // namespace cohort::nn::kernels
