#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"
#include "cohort/nn/safetensors.h"
#include "testing/temp_dir.h"
#include "testing/tensors.h"

namespace cohort::nn {
namespace {

using testing::TempDir;

namespace fs = std::filesystem;
using tensor::Order;

// Model inputs in channels-last, the layout the models keep.
Tensor random(const Shape& s, uint64_t seed) {
  return testing::random_tensor(s, seed, Order::channels_last);
}

TEST(Models, ParameterCountsMatchTorchvision) {
  const std::pair<const char*, int64_t> expected[] = {
      {"resnet18", 11689512},  {"resnet34", 21797672},  {"resnet50", 25557032},
      {"resnet101", 44549160}, {"resnet152", 60192808}, {"densenet121", 7978856}};
  for (auto& [name, count] : expected) {
    auto m = make_model(name, ModelOptions{});
    EXPECT_EQ(m->num_parameters(), count) << name;
  }
  // Grayscale input and two classes change only the stem and the classifier.
  auto gray = make_model("resnet50", ModelOptions{1, 2, 224, 0});
  EXPECT_EQ(gray->num_parameters(), 25557032 - 2 * 64 * 49 - 998 * 2049);
  EXPECT_EQ(make_model("smallcnn", ModelOptions{1, 2, 64, 0})->num_parameters(),
            16 * 9 + 32 + 32 * 16 * 9 + 64 + 64 * 32 * 9 + 128 + 64 * 2 + 2);
}

TEST(Models, TorchvisionNamesAndShapes) {
  auto r = make_model("resnet50", ModelOptions{});
  ASSERT_NE(r->find_param("layer1.0.downsample.0.weight"), nullptr);
  EXPECT_EQ(r->find_param("layer4.2.conv3.weight")->shape, (Shape{2048, 512, 1, 1}));
  EXPECT_EQ(r->find_param("fc.weight")->shape, (Shape{1000, 2048}));
  ASSERT_NE(r->find_buffer("layer3.5.bn2.num_batches_tracked"), nullptr);
  auto d = make_model("densenet121", ModelOptions{});
  EXPECT_EQ(d->find_param("features.denseblock3.denselayer24.conv2.weight")->shape,
            (Shape{32, 128, 3, 3}));
  EXPECT_EQ(d->find_param("features.transition2.conv.weight")->shape, (Shape{256, 512, 1, 1}));
  EXPECT_EQ(d->find_param("classifier.weight")->shape, (Shape{1000, 1024}));
  ASSERT_NE(d->find_buffer("features.norm5.running_var"), nullptr);
}

TEST(Models, ForwardShapesAndTorchvisionInitialisation) {
  for (const char* name : {"resnet18", "resnet50", "densenet121"}) {
    auto m = make_model(name, ModelOptions{1, 5, 64, 3});
    NoGrad ng;
    m->train(false);
    Var y = m->forward(constant(random({2, 1, 64, 64}, 1)));
    EXPECT_EQ(y->value.shape(), (Shape{2, 5})) << name;
    EXPECT_TRUE(tensor::all_finite(y->value)) << name;
  }
  // Kaiming normal, fan_out: std = sqrt(2 / (64 * 9)) for layer1's 3x3 convolutions.
  auto r = make_model("resnet18", ModelOptions{});
  const Tensor& w = r->find_param("layer1.0.conv1.weight")->value;
  const double var = tensor::sum_squares(w) / static_cast<double>(w.numel());
  EXPECT_NEAR(std::sqrt(var), std::sqrt(2.0 / 576), 0.002);
  EXPECT_EQ(r->find_param("bn1.weight")->value.data<float>()[5], 1.0f);
  // The same seed gives the same weights; another seed, others.
  auto a = make_model("resnet18", ModelOptions{3, 10, 224, 7});
  auto b = make_model("resnet18", ModelOptions{3, 10, 224, 7});
  auto c = make_model("resnet18", ModelOptions{3, 10, 224, 8});
  EXPECT_EQ(0,
            std::memcmp(a->flat_values().raw(), b->flat_values().raw(), a->flat_values().bytes()));
  EXPECT_NE(0,
            std::memcmp(a->flat_values().raw(), c->flat_values().raw(), a->flat_values().bytes()));
}

TEST(Models, FlatBuffersBackEveryParameter) {
  auto m = make_model("resnet18", ModelOptions{});
  const char* base = static_cast<const char*>(m->flat_values().raw());
  const char* gbase = static_cast<const char*>(m->flat_grads().raw());
  for (Param* p : m->params()) {
    EXPECT_EQ(static_cast<const char*>(p->value.raw()), base + p->offset * 4) << p->name;
    EXPECT_EQ(static_cast<const char*>(p->grad.raw()), gbase + p->offset * 4) << p->name;
    EXPECT_EQ(p->offset % 16, 0u);
  }
}

TEST(Training, TinyBatchOverfitsToNearZeroLoss) {
  auto m = make_model("smallcnn", ModelOptions{1, 3, 16, 5});
  OptimOptions oo;
  oo.kind = "adamw";
  oo.weight_decay = 0;
  auto opt = make_optimizer(*m, oo);
  Tensor x = random({6, 1, 16, 16}, 2);
  const std::vector<int> labels{0, 1, 2, 2, 1, 0};
  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    m->zero_grad();
    Tape tape;
    Tape::Recording rec(tape);
    Var l = cross_entropy(m->forward(constant(x)), labels);
    if (step == 0) first = l->value.data<float>()[0];
    last = l->value.data<float>()[0];
    tape.backward(l);
    opt->step(1e-2f);
  }
  EXPECT_GT(first, 0.8f);
  EXPECT_LT(last, 0.02f);
}

TEST(Optim, SgdMatchesTorchArithmetic) {
  auto m = make_model("smallcnn", ModelOptions{1, 2, 8, 0});
  Param* p = m->find_param("fc.bias");
  p->value.data<float>()[0] = 1.0f;
  OptimOptions o;
  o.momentum = 0.9f;
  o.weight_decay = 0.1f;
  o.nesterov = true;
  auto opt = make_optimizer(*m, o);
  m->zero_grad();
  p->grad.data<float>()[0] = 0.5f;
  opt->step(0.1f);  // d = 0.5 + 0.1 = 0.6; buf = 0.6; step = 0.6 + 0.9 * 0.6
  EXPECT_NEAR(p->value.data<float>()[0], 1.0f - 0.1f * (0.6f + 0.54f), 1e-6);
  opt->step(0.1f);  // d = 0.5 + 0.1 * w1; buf = 0.9 * 0.6 + d
  const float w1 = 1.0f - 0.1f * 1.14f, d = 0.5f + 0.1f * w1, buf = 0.54f + d;
  EXPECT_NEAR(p->value.data<float>()[0], w1 - 0.1f * (d + 0.9f * buf), 1e-6);
}

TEST(Optim, AdamWFirstStepIsLrTimesSign) {
  auto m = make_model("smallcnn", ModelOptions{1, 2, 8, 0});
  Param* p = m->find_param("fc.bias");
  p->value.data<float>()[0] = 1.0f;
  p->value.data<float>()[1] = 1.0f;
  OptimOptions o;
  o.kind = "adamw";
  o.weight_decay = 0.01f;
  auto opt = make_optimizer(*m, o);
  m->zero_grad();
  p->grad.data<float>()[0] = 3.0f;
  p->grad.data<float>()[1] = -0.25f;
  opt->step(0.01f);
  EXPECT_NEAR(p->value.data<float>()[0], 1.0f * (1 - 1e-4f) - 0.01f, 1e-6);
  EXPECT_NEAR(p->value.data<float>()[1], 1.0f * (1 - 1e-4f) + 0.01f, 1e-6);
}

TEST(Optim, LarsScalesByTrustRatioAndSchedules) {
  auto m = make_model("smallcnn", ModelOptions{1, 2, 8, 0});
  OptimOptions o;
  o.kind = "lars";
  o.momentum = 0;
  o.weight_decay = 0;
  o.trust = 0.01f;
  auto opt = make_optimizer(*m, o);
  Param* w = m->find_param("fc.weight");
  std::vector<float> before(w->value.data<float>(), w->value.data<float>() + w->value.numel());
  m->zero_grad();
  tensor::add_(w->grad, w->value, 5.0f);  // g = 5 w: trust = 0.01 |w| / |g| = 0.002
  opt->step(1.0f);
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_NEAR(w->value.data<float>()[i], before[i] * (1 - 0.002f * 5), 1e-6);

  LrSchedule s;
  s.lr = 0.4f;
  s.warmup_steps = 4;
  s.total_steps = 104;
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(3), 0.4f);
  EXPECT_NEAR(s.at(54), 0.2f, 1e-6);
  EXPECT_NEAR(s.at(104), 0.0f, 1e-6);
  s.kind = "step";
  s.step_every = 10;
  EXPECT_NEAR(s.at(25), 0.4f * 0.01f, 1e-7);
  EXPECT_FLOAT_EQ(linear_scaled_lr(0.1f, 1024), 0.4f);
}

TEST(Optim, ClipGradNormScalesToTheLimit) {
  auto m = make_model("smallcnn", ModelOptions{1, 2, 8, 0});
  m->zero_grad();
  m->find_param("fc.bias")->grad.data<float>()[0] = 3.0f;
  m->find_param("features.0.weight")->grad.data<float>()[4] = 4.0f;
  EXPECT_NEAR(clip_grad_norm(*m, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(std::sqrt(tensor::sum_squares(m->flat_grads())), 1.0, 1e-5);
  EXPECT_NEAR(m->find_param("fc.bias")->grad.data<float>()[0], 0.6f, 1e-5);
  EXPECT_NEAR(clip_grad_norm(*m, 10.0), 1.0, 1e-5);  // under the limit: unchanged
  EXPECT_NEAR(m->find_param("fc.bias")->grad.data<float>()[0], 0.6f, 1e-5);
}

TEST(SafeTensors, RoundTripIsExact) {
  TempDir dir;
  auto a = make_model("resnet18", ModelOptions{1, 4, 64, 1});
  a->find_buffer("bn1.running_mean")->value.data<float>()[3] = 0.25f;
  save_weights(*a, dir.file("w.safetensors"));
  auto b = make_model("resnet18", ModelOptions{1, 4, 64, 2});
  load_weights(*b, dir.file("w.safetensors"));
  EXPECT_EQ(0,
            std::memcmp(a->flat_values().raw(), b->flat_values().raw(), a->flat_values().bytes()));
  EXPECT_EQ(b->find_buffer("bn1.running_mean")->value.data<float>()[3], 0.25f);
  auto st = load_safetensors(dir.file("w.safetensors"));
  EXPECT_EQ(st.metadata.at("model"), "resnet18");
  EXPECT_EQ(st.tensors.at("conv1.weight").shape(), (Shape{64, 1, 7, 7}));
  EXPECT_EQ(st.tensors.at("bn1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_FALSE(fs::exists(dir.file("w.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST(SafeTensors, BadFilesGiveClearErrors) {
  TempDir dir;
  auto m = make_model("smallcnn", ModelOptions{1, 2, 16, 0});
  const std::string good = dir.file("good.safetensors");
  save_weights(*m, good);
  auto expect_error = [&](const std::string& path, const std::string& needle) {
    try {
      load_weights(*m, path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  // Truncated in the data section.
  const auto size = fs::file_size(good);
  fs::copy_file(good, dir.file("cut.safetensors"));
  fs::resize_file(dir.file("cut.safetensors"), size - 100);
  expect_error(dir.file("cut.safetensors"), "truncated");
  // Truncated inside the header.
  fs::copy_file(good, dir.file("head.safetensors"));
  fs::resize_file(dir.file("head.safetensors"), 20);
  expect_error(dir.file("head.safetensors"), "header");
  // Not JSON.
  {
    std::ofstream o(dir.file("junk.safetensors"), std::ios::binary);
    const uint64_t n = 4;
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << "{{{{";
  }
  expect_error(dir.file("junk.safetensors"), "malformed");
  // A shape whose element count overflows 64 bits (2^40 x 2^40 x 2^8 floats).
  {
    const std::string h =
        R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776,256],"data_offsets":[0,0]}})";
    std::ofstream o(dir.file("huge.safetensors"), std::ios::binary);
    const uint64_t n = h.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << h << "0123";
  }
  expect_error(dir.file("huge.safetensors"), "more elements than the 4 bytes");
  // Another model's weights.
  auto other = make_model("smallcnn", ModelOptions{3, 2, 16, 0});
  save_weights(*other, dir.file("other.safetensors"));
  expect_error(dir.file("other.safetensors"), "features.0.weight has shape");
  expect_error(dir.file("missing.safetensors"), "cannot open");
}

TEST(Models, BadInputGivesClearErrors) {
  try {
    make_model("resnet19", ModelOptions{});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'resnet19'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resnet18"), std::string::npos);
  }
  auto m = make_model("resnet18", ModelOptions{1, 2, 64, 0});
  NoGrad ng;
  try {
    m->forward(constant(random({1, 3, 64, 64}, 1)));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects 1 input channels, got 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_optimizer(*m, OptimOptions{"adam"}), Error);
}

// Weights written here load into torchvision and give the same outputs (Debian's python3-torch,
// which scripts/test installs; without it the test fails, it never skips).
TEST(Interop, TorchvisionLoadsOurWeightsAndAgrees) {
  ASSERT_EQ(std::system("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1"), 0)
      << "python3-torch / python3-torchvision missing: scripts/test installs them";
  TempDir dir;
  for (const char* name : {"resnet18", "densenet121"}) {
    auto m = make_model(name, ModelOptions{1, 3, 64, 4});
    // Non-trivial running statistics, so eval mode really uses them.
    {
      Tape tape;
      Tape::Recording rec(tape);
      m->forward(constant(random({4, 1, 64, 64}, 5)));
    }
    m->train(false);
    Tensor x = random({2, 1, 64, 64}, 6);
    NoGrad ng;
    Tensor y = m->forward(constant(x))->value.contiguous();
    save_weights(*m, dir.file("w.safetensors"));
    save_safetensors(dir.file("io.safetensors"), {{"x", x.contiguous()}, {"y", y}});
    const std::string cmd = std::string("/usr/bin/python3 ") + COHORT_SOURCE_DIR +
                            "/bench/torch_interop.py " + name + " " + dir.file("w.safetensors") +
                            " " + dir.file("io.safetensors");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

// And the reverse: torchvision's own weights (its state_dict as safetensors) load here and give
// torchvision's outputs.
TEST(Interop, TorchvisionWeightsLoadHereAndAgree) {
  ASSERT_EQ(std::system("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1"), 0)
      << "python3-torch / python3-torchvision missing: scripts/test installs them";
  TempDir dir;
  for (const char* name : {"resnet50", "densenet121"}) {
    Tensor x = random({2, 1, 64, 64}, 8);
    save_safetensors(dir.file("io.safetensors"), {{"x", x.contiguous()}});
    const std::string cmd = std::string("/usr/bin/python3 ") + COHORT_SOURCE_DIR +
                            "/bench/torch_interop.py " + name + " --export " +
                            dir.file("tv.safetensors") + " " + dir.file("io.safetensors");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto m = make_model(name, ModelOptions{1, 3, 64, 0});
    load_weights(*m, dir.file("tv.safetensors"));
    m->train(false);
    NoGrad ng;
    Tensor y = m->forward(constant(x))->value.contiguous();
    const SafeTensors io = load_safetensors(dir.file("io.safetensors"));
    const Tensor& ref = io.tensors.at("y");
    ASSERT_EQ(ref.shape(), y.shape());
    double err = 0, scale = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      err = std::max(err, std::abs(double{y.data<float>()[i]} - ref.data<float>()[i]));
      scale = std::max(scale, std::abs(double{ref.data<float>()[i]}));
    }
    EXPECT_LT(err, 1e-3 * std::max(1.0, scale)) << name;
  }
}

}  // namespace
}  // namespace cohort::nn
