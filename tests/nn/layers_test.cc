// Every layer and loss: forward against a naive reference, backward against central finite
// differences of a random projection of the output.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "cohort/core/rng.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/model.h"
#include "testing/tensors.h"

namespace cohort::nn {
namespace {

using tensor::Order;

using testing::random_tensor;

float at4(const Tensor& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  const auto& st = t.strides();
  return t.data<float>()[a * st[0] + b * st[1] + c * st[2] + d * st[3]];
}

// Logical-order flat copy, whatever the layout.
std::vector<float> values(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// Loss = sum(y * r) for a fixed random r, recorded on the current tape.
Var project(const Var& y, uint64_t seed) {
  Tensor r = random_tensor(y->value.shape(), seed);
  const auto yv = values(y->value);
  const auto rv = values(r);
  double s = 0;
  for (size_t i = 0; i < yv.size(); ++i) s += static_cast<double>(yv[i]) * rv[i];
  Var out = constant(Tensor::full({1}, static_cast<float>(s)));
  if (Tape* t = Tape::current()) {
    t->push(out, [y, out, r]() {
      Tensor g = r.clone(Order::contiguous);
      tensor::scale_(g, out->grad.data<float>()[0]);
      accumulate(*y, y->value.is_channels_last() ? g.channels_last() : g);
    });
  }
  return out;
}

double loss_of(const std::function<Var(const Var&)>& f, const Tensor& x, uint64_t seed) {
  NoGrad ng;
  const Var y = f(constant(x));
  const Var l = project(y, seed);
  return l->value.data<float>()[0];
}

// Compares d(loss)/d(input) and d(loss)/d(every param) with central differences at `samples`
// positions per tensor. An element passes when |analytic - numeric| <= rtol |numeric| + atol:
// relative to the gradient itself (the gradients here are about 0.01 to 1), with an absolute
// floor for the finite difference's own error (an f32 loss over 2 eps: about 1e-4). Returns the
// worst element's error over its allowance (<= 1 passes) and describes it in `worst`.
// `numeric_f`, when given, is differentiated numerically in f's place: a backward that drops a
// term of f is then caught (see Losses.GradientCheckCatchesADroppedTerm).
struct GradCheck {
  int samples = 12;
  double eps = 1e-2, rtol = 2e-2, atol = 1e-3;
  std::function<Var(const Var&)> numeric_f;
};

double grad_error(const std::function<Var(const Var&)>& f, Tensor x, std::vector<Param*> params,
                  const GradCheck& o, std::string* worst) {
  const auto& fn = o.numeric_f ? o.numeric_f : f;
  double worst_ratio = 0;
  for (Param* p : params) p->grad.zero_();
  Var xv = constant(x);
  xv->requires_grad = true;
  {
    Tape tape;
    Tape::Recording rec(tape);
    Var l = project(f(xv), 99);
    tape.backward(l);
  }
  if (!xv->grad.defined()) {
    *worst = "no gradient reached the input";
    return 1e9;
  }
  struct Target {
    std::string name;
    Tensor value, grad;
  };
  std::vector<Target> targets{{"input", x, xv->grad}};
  for (Param* p : params)
    targets.push_back({p->name.empty() ? "param" : p->name, p->value, p->grad});
  for (auto& t : targets) {
    Tensor g = t.grad.contiguous();
    // Perturb the logical element i of t.value in place, whatever its layout.
    const Tensor& v = t.value;
    CounterRng rng(static_cast<uint64_t>(v.numel()) * 31 + 7);
    for (int s = 0; s < o.samples; ++s) {
      const int64_t i = static_cast<int64_t>(rng.below(static_cast<uint64_t>(v.numel())));
      int64_t rem = i, off = 0;
      for (int d = v.dim() - 1; d >= 0; --d) {
        off += (rem % v.size(d)) * v.strides()[d];
        rem /= v.size(d);
      }
      float* e = v.data<float>() + off;
      const float orig = *e;
      *e = orig + static_cast<float>(o.eps);
      const double lp = loss_of(fn, x, 99);
      *e = orig - static_cast<float>(o.eps);
      const double lm = loss_of(fn, x, 99);
      *e = orig;
      const double num = (lp - lm) / (2 * o.eps);
      const double ana = g.data<float>()[i];
      const double ratio = std::abs(ana - num) / (o.rtol * std::abs(num) + o.atol);
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        std::ostringstream d;
        d << t.name << " element " << i << " of " << tensor::shape_string(v.shape())
          << ": analytic " << ana << ", numeric " << num << " (allowed " << o.rtol << " relative + "
          << o.atol << ")";
        *worst = d.str();
      }
    }
  }
  return worst_ratio;
}

void grad_check(const std::function<Var(const Var&)>& f, Tensor x, std::vector<Param*> params = {},
                GradCheck o = {}) {
  std::string worst;
  EXPECT_LE(grad_error(f, x, std::move(params), o, &worst), 1.0) << worst;
}

// A model wrapper so a single layer gets flat parameter buffers.
struct Harness {
  explicit Harness(std::unique_ptr<Module> m) : model("test", std::move(m), ModelOptions{}) {}
  Model model;
};

// A layer's boundary checks devices: an input on another device than the layer's weight is an
// error naming both, and these layers, which run on the CPU, refuse device memory (memory wrapped
// as cuda's, never read: the checks come first) rather than read it.
TEST(Layers, DeviceMismatchesAreNamedAtTheBoundary) {
  std::vector<float> mem(2 * 4 * 6 * 6, 1.0f);
  auto on_cuda = [&](const Shape& s) {
    return constant(
        Tensor::wrap(mem.data(), s, DType::f32, tensor::Order::contiguous, tensor::Device::cuda));
  };
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const cohort::Error& e) {
      return e.what();
    }
    return "";
  };
  auto conv = std::make_unique<Conv2d>(Conv2dOptions{4, 8, 3, 1, 1});
  Conv2d* c = conv.get();
  Harness h(std::move(conv));
  std::string e = error_of([&] { c->forward(on_cuda({2, 4, 6, 6})); });
  EXPECT_NE(e.find("Conv2d: the input is on cuda and the weight on cpu"), std::string::npos) << e;
  auto lin = std::make_unique<Linear>(4, 3);
  Linear* l = lin.get();
  Harness hl(std::move(lin));
  e = error_of([&] { l->forward(on_cuda({2, 4})); });
  EXPECT_NE(e.find("Linear: the input is on cuda and the weight on cpu"), std::string::npos) << e;
  e = error_of([&] { relu(on_cuda({2, 4})); });
  EXPECT_NE(e.find("relu runs on the CPU"), std::string::npos) << e;
  e = error_of([&] { add(on_cuda({2, 4}), constant(Tensor::zeros({2, 4}))); });
  EXPECT_NE(e.find("add: the first operand is on cuda and the second operand on cpu"),
            std::string::npos)
      << e;
  e = error_of([&] { cross_entropy(on_cuda({2, 4}), {0, 1}); });
  EXPECT_NE(e.find("cross_entropy runs on the CPU"), std::string::npos) << e;
  EXPECT_EQ(mem[0], 1.0f);
}

TEST(Conv2d, ForwardMatchesNaive) {
  for (int groups : {1, 2}) {
    Conv2dOptions o{4, 6, 3, 2, 1, 2, groups, true};
    auto conv = std::make_unique<Conv2d>(o);
    Conv2d* c = conv.get();
    Harness h(std::move(conv));
    Tensor x = random_tensor({2, 4, 9, 8}, 1);
    Tensor y = c->forward(constant(x))->value;
    ASSERT_EQ(y.shape(), (Shape{2, 6, 4, 3}));
    const Tensor& w = h.model.params()[0]->value;
    const Tensor& b = h.model.params()[1]->value;
    const int cin = 4 / groups, cout = 6 / groups;
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 6; ++k)
        for (int oy = 0; oy < 4; ++oy)
          for (int ox = 0; ox < 3; ++ox) {
            double s = b.data<float>()[k];
            const int g = k / cout;
            for (int ci = 0; ci < cin; ++ci)
              for (int ky = 0; ky < 3; ++ky)
                for (int kx = 0; kx < 3; ++kx) {
                  const int iy = oy * 2 - 1 + ky * 2, ix = ox * 2 - 1 + kx * 2;
                  if (iy < 0 || iy >= 9 || ix < 0 || ix >= 8) continue;
                  s += static_cast<double>(at4(x, n, g * cin + ci, iy, ix)) * at4(w, k, ci, ky, kx);
                }
            ASSERT_NEAR(at4(y, n, k, oy, ox), s, 1e-4) << "groups " << groups;
          }
  }
}

TEST(Conv2d, Gradients) {
  Conv2dOptions o{3, 4, 3, 1, 1, 1, 1, true};
  auto conv = std::make_unique<Conv2d>(o);
  Conv2d* c = conv.get();
  Harness h(std::move(conv));
  grad_check([c](const Var& x) { return c->forward(x); }, random_tensor({2, 3, 5, 5}, 2),
             h.model.params());
  Conv2dOptions s{4, 4, 3, 2, 1, 1, 2, false};
  auto conv2 = std::make_unique<Conv2d>(s);
  Conv2d* c2 = conv2.get();
  Harness h2(std::move(conv2));
  grad_check([c2](const Var& x) { return c2->forward(x); }, random_tensor({2, 4, 7, 6}, 3),
             h2.model.params());
}

TEST(BatchNorm2d, TrainingForwardNormalisesAndTracksRunningStats) {
  auto bn = std::make_unique<BatchNorm2d>(3);
  BatchNorm2d* b = bn.get();
  Harness h(std::move(bn));
  Tensor x = random_tensor({4, 3, 5, 5}, 4);
  Tensor y = b->forward(constant(x))->value;
  for (int c = 0; c < 3; ++c) {
    double m = 0, v = 0, xm = 0, xv = 0;
    const int cnt = 4 * 25;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 5; ++j) {
          m += at4(y, n, c, i, j);
          xm += at4(x, n, c, i, j);
        }
    m /= cnt;
    xm /= cnt;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 5; ++j) {
          v += std::pow(at4(y, n, c, i, j) - m, 2);
          xv += std::pow(at4(x, n, c, i, j) - xm, 2);
        }
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v / cnt, 1.0, 1e-3);
    EXPECT_NEAR(b->running_mean().value.data<float>()[c], 0.1 * xm, 1e-5);
    EXPECT_NEAR(b->running_var().value.data<float>()[c], 0.9 + 0.1 * xv / (cnt - 1), 1e-4);
  }
  // Eval normalises with the running statistics.
  b->train(false);
  Tensor ye = b->forward(constant(x))->value;
  const float rm = b->running_mean().value.data<float>()[1];
  const float rv = b->running_var().value.data<float>()[1];
  EXPECT_NEAR(at4(ye, 2, 1, 3, 4), (at4(x, 2, 1, 3, 4) - rm) / std::sqrt(rv + 1e-5f), 1e-5);
}

TEST(BatchNorm2d, Gradients) {
  for (bool relu : {false, true}) {
    auto bn = std::make_unique<BatchNorm2d>(3, relu);
    BatchNorm2d* b = bn.get();
    Harness h(std::move(bn));
    init::normal(h.model.params()[0]->value, 1.0, 0.3, 5);
    init::normal(h.model.params()[1]->value, 0.0, 0.3, 6);
    grad_check([b](const Var& x) { return b->forward(x); }, random_tensor({3, 3, 4, 4}, 7),
               h.model.params(),
               GradCheck{12, relu ? 1e-3 : 1e-2, 3e-2, relu ? 5e-3 : 1e-3, nullptr});
    // Small steps for ReLU's kink; the f32 loss over 2e-3 then carries about 1e-3 of noise.
  }
}

TEST(Pooling, ForwardMatchesNaiveAndGradients) {
  MaxPool2d mp(PoolOptions{3, 2, 1});
  AvgPool2d ap(PoolOptions{2, 2, 0});
  Tensor x = random_tensor({2, 3, 7, 6}, 8);
  Tensor ym = mp.forward(constant(x))->value;
  Tensor ya = ap.forward(constant(x))->value;
  ASSERT_EQ(ym.shape(), (Shape{2, 3, 4, 3}));
  ASSERT_EQ(ya.shape(), (Shape{2, 3, 3, 3}));
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) {
          float m = -1e30f;
          for (int a = 0; a < 3; ++a)
            for (int b = 0; b < 3; ++b) {
              const int yy = i * 2 - 1 + a, xx = j * 2 - 1 + b;
              if (yy >= 0 && yy < 7 && xx >= 0 && xx < 6) m = std::max(m, at4(x, n, c, yy, xx));
            }
          ASSERT_EQ(at4(ym, n, c, i, j), m);
          if (i < 3) {
            const float avg =
                (at4(x, n, c, 2 * i, 2 * j) + at4(x, n, c, 2 * i + 1, 2 * j) +
                 at4(x, n, c, 2 * i, 2 * j + 1) + at4(x, n, c, 2 * i + 1, 2 * j + 1)) /
                4;
            ASSERT_NEAR(at4(ya, n, c, i, j), avg, 1e-6);
          }
        }
  grad_check([&](const Var& v) { return mp.forward(v); }, x, {});
  grad_check([&](const Var& v) { return ap.forward(v); }, x, {});
}

TEST(AdaptiveAvgPool2d, UnevenWindowsAndGradients) {
  AdaptiveAvgPool2d pool(2, 3);
  Tensor x = random_tensor({2, 3, 5, 7}, 9);
  Tensor y = pool.forward(constant(x))->value;
  ASSERT_EQ(y.shape(), (Shape{2, 3, 2, 3}));
  // Output (1, 2) covers rows [2, 5) and columns [4, 7).
  double s = 0;
  for (int i = 2; i < 5; ++i)
    for (int j = 4; j < 7; ++j) s += at4(x, 1, 2, i, j);
  EXPECT_NEAR(at4(y, 1, 2, 1, 2), s / 9, 1e-5);
  grad_check([&](const Var& v) { return pool.forward(v); }, x, {});
  AdaptiveAvgPool2d global(1, 1);
  grad_check([&](const Var& v) { return global.forward(v); }, x, {});
}

TEST(Linear, ForwardAndGradients) {
  auto lin = std::make_unique<Linear>(5, 3);
  Linear* l = lin.get();
  Harness h(std::move(lin));
  Tensor x = random_tensor({4, 5}, 10);
  Tensor y = l->forward(constant(x))->value;
  const Tensor& w = h.model.params()[0]->value;
  const Tensor& b = h.model.params()[1]->value;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) {
      double s = b.data<float>()[j];
      for (int k = 0; k < 5; ++k) s += x.data<float>()[i * 5 + k] * w.data<float>()[j * 5 + k];
      EXPECT_NEAR(y.data<float>()[i * 3 + j], s, 1e-5);
    }
  grad_check([l](const Var& v) { return l->forward(v); }, x, h.model.params());
}

TEST(Elementwise, ReluAddConcatFlattenGradients) {
  Tensor x = random_tensor({2, 3, 4, 4}, 11, Order::channels_last);
  grad_check([](const Var& v) { return relu(v); }, x, {});
  grad_check([](const Var& v) { return add_relu(v, relu(v)); }, x, {});
  grad_check([](const Var& v) { return add(v, v); }, x, {});
  grad_check([](const Var& v) { return concat_channels({v, relu(v), v}); }, x, {});
  grad_check([](const Var& v) { return flatten(v); }, x, {});
  Tensor y = concat_channels({constant(x), constant(x)})->value;
  ASSERT_EQ(y.shape(), (Shape{2, 6, 4, 4}));
  EXPECT_EQ(at4(y, 1, 4, 2, 3), at4(x, 1, 1, 2, 3));
  // Flatten keeps PyTorch's channel-major order even from a channels-last input.
  Tensor f = flatten(constant(x))->value;
  EXPECT_EQ(f.data<float>()[1 * 48 + 2 * 16 + 3 * 4 + 1], at4(x, 1, 2, 3, 1));
}

TEST(Dropout, ScalesKeptValuesAndIsOffInEval) {
  Dropout d(0.5f, 3);
  Tensor x = Tensor::full({1000}, 1.0f);
  Tensor y = d.forward(constant(x))->value;
  int kept = 0;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(y.data<float>()[i] == 0.0f || y.data<float>()[i] == 2.0f);
    kept += y.data<float>()[i] != 0.0f;
  }
  EXPECT_GT(kept, 420);
  EXPECT_LT(kept, 580);
  grad_check(
      [&](const Var& v) {
        Dropout fixed(0.3f, 4);  // a fresh module: the same mask every call
        return fixed.forward(v);
      },
      random_tensor({4, 10}, 12), {});
  d.train(false);
  EXPECT_EQ(d.forward(constant(x))->value.data<float>()[7], 1.0f);
}

TEST(Losses, CrossEntropyValueAndGradients) {
  Tensor z = Tensor::zeros({2, 3});
  z.data<float>()[1] = std::log(2.0f);  // row 0: softmax [1/4, 2/4, 1/4]
  Var l = cross_entropy(constant(z), {1, 0});
  EXPECT_NEAR(l->value.data<float>()[0], 0.5 * (std::log(2.0) + std::log(3.0)), 1e-6);
  Var ls = cross_entropy(constant(z), {1, 0}, 0.1f);
  const double row0 = 0.9 * std::log(2.0) + 0.1 / 3 * (2 * std::log(4.0) + std::log(2.0));
  const double row1 = std::log(3.0);
  EXPECT_NEAR(ls->value.data<float>()[0], 0.5 * (row0 + row1), 1e-6);
  auto ce = [](const Var& v) { return cross_entropy(v, {2, 0, 1, 1}, 0.1f); };
  grad_check(ce, random_tensor({4, 3}, 13));
  EXPECT_THROW(cross_entropy(constant(z), {3, 0}), Error);
}

TEST(Losses, BceWithLogitsValueAndGradients) {
  Tensor z = Tensor::zeros({1, 2});
  Tensor t = Tensor::zeros({1, 2});
  t.data<float>()[0] = 1;
  EXPECT_NEAR(bce_with_logits(constant(z), t)->value.data<float>()[0], std::log(2.0), 1e-6);
  Tensor targets = Tensor::zeros({3, 4});
  for (int i = 0; i < 12; i += 3) targets.data<float>()[i] = 1;
  grad_check([&](const Var& v) { return bce_with_logits(v, targets); }, random_tensor({3, 4}, 14));
}

// The check can fail: a backward that drops label smoothing's term (the analytic gradient of the
// unsmoothed loss against the smoothed loss's finite differences) is caught, though that term
// moves each gradient by only 0.1/3 of a sample's share (about 0.008 here).
TEST(Losses, GradientCheckCatchesADroppedTerm) {
  GradCheck o;
  o.numeric_f = [](const Var& v) { return cross_entropy(v, {2, 0, 1, 1}, 0.1f); };
  std::string worst;
  const double e = grad_error(
      [](const Var& v) {
        return cross_entropy(v, {2, 0, 1, 1}, 0.0f);
      },
      random_tensor({4, 3}, 13), {}, o, &worst);
  EXPECT_GT(e, 1.0) << "a dropped smoothing term passed: " << worst;
}

// bf16 convolutions (AVX512-BF16 / AMX) agree with f32 to bf16's precision, forward and
// backward; skipped where oneDNN cannot run them on this CPU.
TEST(MixedPrecision, Bf16ConvolutionAndLinearTrackF32) {
  if (!compute_type_supported(DType::bf16)) GTEST_SKIP() << "no bf16 convolutions on this CPU";
  auto m = make_model("smallcnn", ModelOptions{1, 3, 16, 2});
  Tensor x = random_tensor({4, 1, 16, 16}, 21, Order::channels_last);
  auto run = [&](DType t) {
    set_compute_type(t);
    m->zero_grad();
    Tape tape;
    Tape::Recording rec(tape);
    Var logits = m->forward(constant(x));
    std::vector<float> out = values(logits->value);
    tape.backward(cross_entropy(logits, {0, 1, 2, 1}));
    set_compute_type(DType::f32);
    return std::make_pair(out, values(m->flat_grads()));
  };
  auto [y32, g32] = run(DType::f32);
  auto [y16, g16] = run(DType::bf16);
  double ymax = 0, yerr = 0, dot = 0, n32 = 0, n16 = 0;
  for (size_t i = 0; i < y32.size(); ++i) {
    ymax = std::max(ymax, std::abs(double{y32[i]}));
    yerr = std::max(yerr, std::abs(double{y32[i]} - y16[i]));
  }
  bool differs = false;
  for (size_t i = 0; i < g32.size(); ++i) {
    dot += double{g32[i]} * g16[i];
    n32 += double{g32[i]} * g32[i];
    n16 += double{g16[i]} * g16[i];
    differs |= g32[i] != g16[i];
  }
  EXPECT_LT(yerr, 0.03 * ymax) << yerr << " of " << ymax;
  // The gradient points the same way (bf16 keeps 8 bits of mantissa per product).
  const double cosine = dot / std::sqrt(n32 * n16);
  EXPECT_GT(cosine, 0.995);
  EXPECT_NEAR(std::sqrt(n16 / n32), 1.0, 0.03);
  EXPECT_TRUE(differs);  // it really ran in bf16
}

TEST(Tape, GradReadyHooksFireOncePerParameterInReverseOrder) {
  auto m = make_model("smallcnn", ModelOptions{1, 2, 16, 1});
  std::vector<int> order;
  Tape tape;
  tape.on_grad_ready([&](Param& p) { order.push_back(p.index); });
  Tensor x = random_tensor({2, 1, 16, 16}, 15, Order::channels_last);
  {
    Tape::Recording rec(tape);
    Var l = cross_entropy(m->forward(constant(x)), {0, 1});
    tape.backward(l);
  }
  ASSERT_EQ(order.size(), m->params().size());
  // The classifier is final first, the first convolution last.
  EXPECT_GE(order.front(), m->find_param("fc.weight")->index);
  EXPECT_EQ(order.back(), m->find_param("features.0.weight")->index);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], static_cast<int>(i));
}

TEST(Tape, GradientsAccumulateAcrossBackwardCalls) {
  auto m = make_model("smallcnn", ModelOptions{1, 2, 16, 1});
  Tensor x = random_tensor({2, 1, 16, 16}, 16);
  auto run = [&]() {
    Tape tape;
    Tape::Recording rec(tape);
    tape.backward(cross_entropy(m->forward(constant(x)), {0, 1}));
  };
  m->zero_grad();
  run();
  std::vector<float> once = values(m->find_param("fc.weight")->grad);
  run();
  std::vector<float> twice = values(m->find_param("fc.weight")->grad);
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5);
}

}  // namespace
}  // namespace cohort::nn
