// The GPU kernels' arithmetic (src/nn/kernels/math.h) run on the host against the CPU engine:
// the optimisers' steps through the multi-tensor walk the kernels use, the losses and their
// gradients, batch norm with the fused residual and ReLU, the loss scaler and gradient clipping.
// The CPU engine is the reference: it is itself checked against PyTorch (tests/python) and by
// finite differences (layers_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../../src/nn/kernels/math.h"
#include "cohort/nn/autograd.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"
#include "cohort/train/loss_scaler.h"
#include "testing/tensors.h"

namespace cohort::nn {
namespace {

namespace k = kernels;
using tensor::Order;
using tensor::Shape;
using tensor::Tensor;
using testing::random_tensor;

std::vector<float> randoms(size_t n, uint64_t seed, double mean = 0.0, double sd = 1.0) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)});
  init::normal(t, mean, sd, seed);
  return std::vector<float>(t.data<float>(), t.data<float>() + n);
}

// The largest |a - b| / max(1, |b|) over two equal-length vectors.
double worst(const float* a, const float* b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; ++i) {
    w = std::max(w, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  }
  return w;
}

// Two ranges of flat buffers (a parameter that decays, one that does not: a norm's), updated by
// the CPU engine's optimiser and, on copies, by the kernels' maths through the walk a
// multi-tensor launch makes: chunks of a small size (so that the ranges' ends fall inside
// chunks), each located by range_of_chunk, each element visited once (counted).
struct Walk {
  std::vector<std::vector<float>> w, g, s0, s1;
  std::vector<int64_t> first_chunk;
  std::vector<int> visits;
  static constexpr int64_t kChunk = 64;

  explicit Walk(const std::vector<size_t>& sizes) {
    first_chunk.push_back(0);
    for (size_t n : sizes) first_chunk.push_back(first_chunk.back() + k::chunks_of(n, kChunk));
  }
  template <typename F>
  void each(F&& f) {  // f(range, index)
    const int ranges = static_cast<int>(w.size());
    for (int64_t b = 0; b < first_chunk.back(); ++b) {
      const int r = k::range_of_chunk(first_chunk.data(), ranges, b);
      const int64_t lo = (b - first_chunk[static_cast<size_t>(r)]) * kChunk;
      const int64_t hi = std::min<int64_t>(lo + kChunk, static_cast<int64_t>(w[r].size()));
      for (int64_t i = lo; i < hi; ++i) f(r, static_cast<size_t>(i));
    }
  }
};

void optimiser_matches(const OptimOptions& o, int steps) {
  SCOPED_TRACE(o.kind + (o.nesterov ? " nesterov" : "") + " momentum " +
               std::to_string(o.momentum));
  const std::vector<size_t> sizes = {1000, 37};
  std::vector<std::vector<float>> w, g;
  for (size_t i = 0; i < sizes.size(); ++i) {
    w.push_back(randoms(sizes[i], 10 + i));
    g.push_back(std::vector<float>(sizes[i]));
  }
  OptimTarget t;
  t.num_params = 2;
  for (size_t i = 0; i < sizes.size(); ++i) {
    t.ranges.push_back({w[i].data(), g[i].data(), sizes[i]});
    t.pieces.push_back({static_cast<int>(i), 0, sizes[i], i, 0, i == 0});
  }
  auto opt = make_optimizer(t, o);
  Walk walk(sizes);
  walk.w = w;
  for (size_t n : sizes) {
    walk.s0.emplace_back(n, 0.0f);
    walk.s1.emplace_back(n, 0.0f);
  }
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < sizes.size(); ++i) {  // in place: the optimiser holds the pointers
      const std::vector<float> fresh = randoms(sizes[i], 100 * step + i, 0.0, 0.1);
      std::copy(fresh.begin(), fresh.end(), g[i].begin());
    }
    const float lr = 0.05f / static_cast<float>(step);
    opt->step(lr);
    walk.g = g;
    walk.visits.assign(1037, 0);
    std::vector<double> ww(2, 0.0), gg(2, 0.0);  // LARS: each parameter's squared norms
    if (o.kind == "lars") {
      walk.each([&](int r, size_t i) {
        ww[r] += double(walk.w[r][i]) * walk.w[r][i];
        gg[r] += double(walk.g[r][i]) * walk.g[r][i];
      });
    }
    const k::AdamWStep adam =
        k::adamw_step(lr, o.beta1, o.beta2, o.eps, o.weight_decay, static_cast<int64_t>(step));
    const k::SgdStep sgd{lr, o.momentum, o.weight_decay, o.nesterov};
    walk.each([&](int r, size_t i) {
      walk.visits[r == 0 ? i : 1000 + i]++;
      float& wi = walk.w[r][i];
      const float gi = walk.g[r][i];
      if (o.kind == "sgd") {
        k::sgd_update(wi, gi, walk.s0[r][i], sgd);
      } else if (o.kind == "adamw") {
        k::adamw_update(wi, gi, walk.s0[r][i], walk.s1[r][i], adam);
      } else {
        const bool decay = r == 0;
        const float trust =
            k::lars_trust(std::sqrt(ww[r]), std::sqrt(gg[r]), o.trust, o.weight_decay, decay);
        k::lars_update(wi, gi, walk.s0[r][i], lr, o.momentum, trust, decay ? o.weight_decay : 0.0f);
      }
    });
    ASSERT_TRUE(std::all_of(walk.visits.begin(), walk.visits.end(), [](int v) { return v == 1; }))
        << "the chunk walk missed or repeated an element";
    for (size_t i = 0; i < sizes.size(); ++i) {
      // The CPU loops are vectorised; the order of operations per element is the same.
      EXPECT_LE(worst(walk.w[i].data(), w[i].data(), sizes[i]), 1e-6) << "range " << i;
    }
  }
  // The optimiser's own state equals the kernels' (momentum, Adam's moments).
  auto state = opt->state();
  for (size_t s = 0; s < state.size(); ++s) {
    const float* cpu = state[s].second->data<float>();
    const auto& mine = s == 0 ? walk.s0 : walk.s1;
    EXPECT_LE(worst(mine[0].data(), cpu, 1000), 1e-6) << state[s].first;
    EXPECT_LE(worst(mine[1].data(), cpu + 1000, 37), 1e-6) << state[s].first;
  }
}

TEST(KernelMath, OptimisersMatchTheCpuEngine) {
  for (bool nesterov : {false, true}) {
    OptimOptions o;
    o.kind = "sgd";
    o.nesterov = nesterov;
    optimiser_matches(o, 4);
  }
  OptimOptions plain;
  plain.kind = "sgd";
  plain.momentum = 0;
  optimiser_matches(plain, 3);
  OptimOptions adam;
  adam.kind = "adamw";
  adam.weight_decay = 0.01f;
  optimiser_matches(adam, 4);
  OptimOptions lars;
  lars.kind = "lars";
  lars.weight_decay = 5e-4f;
  optimiser_matches(lars, 4);
}

TEST(KernelMath, ChunkWalkFindsEveryRange) {
  // Ranges of 0, 1, chunk-1, chunk, chunk+1 elements: empty ranges own no chunk.
  const std::vector<int64_t> sizes = {0, 1, 63, 64, 65, 0, 200};
  std::vector<int64_t> first = {0};
  for (int64_t n : sizes) first.push_back(first.back() + k::chunks_of(n, 64));
  std::vector<int64_t> seen(sizes.size(), 0);
  for (int64_t b = 0; b < first.back(); ++b) {
    const int r = k::range_of_chunk(first.data(), static_cast<int>(sizes.size()), b);
    ASSERT_GT(sizes[static_cast<size_t>(r)], 0) << "chunk " << b << " landed in an empty range";
    const int64_t lo = (b - first[static_cast<size_t>(r)]) * 64;
    seen[static_cast<size_t>(r)] += std::min<int64_t>(64, sizes[static_cast<size_t>(r)] - lo);
  }
  EXPECT_EQ(seen, sizes);
}

TEST(KernelMath, LossesMatchTheCpuEngine) {
  const int rows = 6, classes = 5;
  Tensor z = random_tensor({rows, classes}, 3);
  const std::vector<int> labels = {0, 4, 2, 2, 1, 3};
  for (float smoothing : {0.0f, 0.1f}) {
    Var x = constant(z.clone(Order::contiguous));
    x->requires_grad = true;
    double cpu_loss = 0;
    {
      Tape tape;
      Tape::Recording rec(tape);
      Var l = cross_entropy(x, labels, smoothing);
      cpu_loss = l->value.data<float>()[0];
      tape.backward(l);
    }
    std::vector<float> prob(static_cast<size_t>(rows * classes));
    double total = 0;
    for (int i = 0; i < rows; ++i) {
      total += k::softmax_xent_row(z.data<float>() + i * classes, classes, labels[i], smoothing,
                                   prob.data() + i * classes);
    }
    EXPECT_NEAR(total / rows, cpu_loss, 1e-6 * std::abs(cpu_loss));
    const float* grad = x->grad.data<float>();
    for (int e = 0; e < rows * classes; ++e) {
      const float mine =
          k::softmax_xent_grad(prob[static_cast<size_t>(e)], e % classes == labels[e / classes],
                               smoothing, classes, 1.0f / rows);
      EXPECT_NEAR(mine, grad[e], 1e-7) << "element " << e << " smoothing " << smoothing;
    }
  }
  // Multi-label BCE: logits far from 0 too, where the naive form overflows.
  Tensor logits = random_tensor({4, 7}, 5);
  logits.data<float>()[0] = 60.0f;
  logits.data<float>()[1] = -60.0f;
  Tensor targets = Tensor::empty({4, 7});
  for (int e = 0; e < 28; ++e) targets.data<float>()[e] = static_cast<float>(e % 3 == 0);
  Var x = constant(logits.clone(Order::contiguous));
  x->requires_grad = true;
  double cpu_loss = 0;
  {
    Tape tape;
    Tape::Recording rec(tape);
    Var l = bce_with_logits(x, targets);
    cpu_loss = l->value.data<float>()[0];
    tape.backward(l);
  }
  double total = 0;
  for (int e = 0; e < 28; ++e) {
    total += k::bce_with_logits_value(logits.data<float>()[e], targets.data<float>()[e]);
    EXPECT_NEAR(
        k::bce_with_logits_grad(logits.data<float>()[e], targets.data<float>()[e], 1.0f / 28),
        x->grad.data<float>()[e], 1e-7)
        << "element " << e;
  }
  EXPECT_NEAR(total / 28, cpu_loss, 1e-6 * std::abs(cpu_loss));
}

// Training-mode batch norm with the fused ReLU, forward and backward, against the CPU engine's
// (oneDNN's) BatchNorm2d: the channel statistics combined as the kernels combine them (Welford
// per block, then merged), the normalisation, and the input gradient from the channel sums.
TEST(KernelMath, BatchNormMatchesTheCpuEngine) {
  for (bool fuse_relu : {false, true}) {
    SCOPED_TRACE(fuse_relu ? "with relu" : "without relu");
    const int n = 3, c = 4, h = 5, wd = 6;
    auto bn = std::make_unique<BatchNorm2d>(c, fuse_relu);
    BatchNorm2d* b = bn.get();
    Model model("test", std::move(bn), ModelOptions{});
    init::normal(model.params()[0]->value, 1.0, 0.3, 5);
    init::normal(model.params()[1]->value, 0.0, 0.3, 6);
    const float* gamma = model.params()[0]->value.data<float>();
    const float* beta = model.params()[1]->value.data<float>();
    Tensor x = random_tensor({n, c, h, wd}, 7, Order::channels_last);
    Tensor dy = random_tensor({n, c, h, wd}, 8, Order::channels_last);
    Var xv = constant(x);
    xv->requires_grad = true;
    Tensor y;
    {
      Tape tape;
      Tape::Recording rec(tape);
      Var out = b->forward(xv);
      y = out->value;
      // d(sum(out * dy))/d(out) = dy: the backward receives dy itself.
      Var l = constant(Tensor::full({1}, 0.0f));
      tape.push(l, [out, dy]() { accumulate(*out, dy.clone(Order::channels_last)); });
      tape.backward(l);
    }
    // Channels-last: element e of the buffer is channel e % c.
    const int64_t m = static_cast<int64_t>(n) * h * wd;
    const float* xs = x.data<float>();
    const float* ys = y.contiguous().channels_last().data<float>();
    std::vector<k::Moments> parts(static_cast<size_t>(c) * 3);  // 3 "blocks" per channel
    for (int64_t e = 0; e < m * c; ++e) {
      const size_t ch = static_cast<size_t>(e % c);
      k::moments_add(parts[ch * 3 + static_cast<size_t>((e / c) % 3)], xs[e]);
    }
    std::vector<float> mean(static_cast<size_t>(c)), invstd(static_cast<size_t>(c));
    for (size_t ch = 0; ch < static_cast<size_t>(c); ++ch) {
      const k::Moments all =
          k::moments_merge(k::moments_merge(parts[ch * 3], parts[ch * 3 + 1]), parts[ch * 3 + 2]);
      mean[ch] = static_cast<float>(all.mean);
      invstd[ch] = k::bn_invstd(all.m2 / all.count, 1e-5f);  // biased variance normalises
    }
    std::vector<float> mine(static_cast<size_t>(m * c));
    for (int64_t e = 0; e < m * c; ++e) {
      const size_t ch = static_cast<size_t>(e % c);
      const float v = k::bn_apply(xs[e], mean[ch], invstd[ch], gamma[ch], beta[ch]);
      mine[static_cast<size_t>(e)] = fuse_relu ? k::relu(v) : v;
    }
    EXPECT_LE(worst(mine.data(), ys, mine.size()), 2e-5);
    // Backward: through the ReLU, then the channel sums of dy and dy * xhat.
    const float* dys = dy.data<float>();
    std::vector<float> dpre(static_cast<size_t>(m * c));
    std::vector<double> sum_dy(static_cast<size_t>(c), 0.0),
        sum_dy_xhat(static_cast<size_t>(c), 0.0);
    for (int64_t e = 0; e < m * c; ++e) {
      const size_t ch = static_cast<size_t>(e % c);
      const float d = fuse_relu ? k::relu_grad(dys[e], mine[static_cast<size_t>(e)]) : dys[e];
      dpre[static_cast<size_t>(e)] = d;
      sum_dy[ch] += d;
      sum_dy_xhat[ch] += double(d) * (xs[e] - mean[ch]) * invstd[ch];
    }
    const float* dx = xv->grad.contiguous().channels_last().data<float>();
    std::vector<float> dx_mine(static_cast<size_t>(m * c));
    for (int64_t e = 0; e < m * c; ++e) {
      const size_t ch = static_cast<size_t>(e % c);
      dx_mine[static_cast<size_t>(e)] = k::bn_backward_dx(
          dpre[static_cast<size_t>(e)], (xs[e] - mean[ch]) * invstd[ch], gamma[ch], invstd[ch],
          sum_dy[ch], sum_dy_xhat[ch], static_cast<double>(m));
    }
    EXPECT_LE(worst(dx_mine.data(), dx, dx_mine.size()), 1e-4);
  }
}

TEST(KernelMath, LossScalerAndClippingMatchTheCpuEngine) {
  // The scaler's overflow test: what the CPU engine's LossScaler refuses, grad_overflows flags.
  for (float bad : {70000.0f, -1e30f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> g = randoms(50, 1);
    g[17] = bad;
    OptimTarget t;
    t.ranges.push_back({nullptr, g.data(), g.size()});
    train::LossScaler scaler(true, 1024.0f);
    const bool cpu_applies = scaler.unscale(t);
    const bool mine_overflows =
        std::any_of(g.begin(), g.end(), [](float v) { return k::grad_overflows(v); });
    EXPECT_EQ(cpu_applies, !mine_overflows) << bad;
  }
  std::vector<float> g = randoms(50, 2, 0.0, 100.0), mine = g;
  OptimTarget t;
  t.ranges.push_back({nullptr, g.data(), g.size()});
  train::LossScaler scaler(true, 1024.0f);
  ASSERT_TRUE(scaler.unscale(t));
  for (float& v : mine) v = k::unscale(v, 1.0f / 1024.0f);
  EXPECT_EQ(worst(mine.data(), g.data(), g.size()), 0.0);
  // Clipping: the same factor as clip_grad_norm, above the norm, at it and below.
  for (double max_norm : {1.0, 5.0, 1e3}) {
    std::vector<float> c = randoms(64, 3), d = c;
    OptimTarget ct;
    ct.ranges.push_back({nullptr, c.data(), c.size()});
    const double norm = clip_grad_norm(ct, max_norm);
    const float coef = k::clip_coefficient(norm, max_norm);
    for (float& v : d) v *= coef;
    EXPECT_LE(worst(d.data(), c.data(), c.size()), 1e-7) << max_norm;
  }
  EXPECT_EQ(k::clip_coefficient(2.0, 2.0), 1.0f);  // at the bound nothing is scaled
}

}  // namespace
}  // namespace cohort::nn
