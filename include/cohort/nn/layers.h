// Layers of convolutional networks. Forward runs on oneDNN (convolution, batch norm, pooling,
// matmul) or on plain loops the compiler vectorises (activations, sums, losses); each layer
// caches its oneDNN primitives per input shape. 4-d activations are channels-last.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/clock.h"
#include "cohort/nn/module.h"

namespace cohort::nn {

struct Conv2dOptions {
  int in = 0, out = 0, kernel = 3;
  int stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = false;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(Conv2dOptions o);
  ~Conv2d() override;
  Var forward(const Var& x) override;
  void reset_parameters(uint64_t seed) override;  // kaiming normal, fan_out, ReLU gain
  const Conv2dOptions& options() const { return o_; }
  // torchvision's DenseNet initialises with fan_in.
  bool fan_out = true;
  Param& weight() { return *w_; }

 private:
  struct Plan;
  Conv2dOptions o_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  std::map<std::pair<Shape, int>, std::unique_ptr<Plan>> plans_;  // by input shape and type
};

// relu = true fuses the ReLU that follows (torchvision's bn1 + relu), saving a pass.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int channels, bool relu = false, float eps = 1e-5f, float momentum = 0.1f);
  ~BatchNorm2d() override;
  Var forward(const Var& x) override;
  void reset_parameters(uint64_t seed) override;  // weight 1, bias 0
  Buffer& running_mean() { return *mean_; }
  Buffer& running_var() { return *var_; }
  int channels() const { return c_; }

  // Sums a vector of doubles across ranks in place (an allreduce), or nothing. When set, batch
  // statistics in training are the whole global batch's (SyncBatchNorm): one reduction of
  // (sum, sum of squares, count) forward and one of (sum dy, sum dy * xhat) backward.
  using CrossRankSum = std::function<void(double*, size_t)>;
  void set_cross_rank_sum(CrossRankSum f) { cross_rank_sum_ = std::move(f); }
  bool synced() const { return static_cast<bool>(cross_rank_sum_); }

  // Deferred statistics (torchgpipe's deferred_batch_norm): in training, each forward normalises
  // with its own batch's statistics as usual, but the running statistics only collect sums;
  // commit_statistics() then updates them once, with the mean and unbiased variance of every
  // sample since the last commit, which is what one forward over the whole mini-batch does.
  void defer_statistics(bool on);
  void commit_statistics();

 private:
  std::vector<double> deferred_;  // per channel sum, then sum of squares; then the count
  struct Plan;
  Var forward_synced(const Var& x_in, const Tensor& x);
  CrossRankSum cross_rank_sum_;
  int c_;
  bool relu_;
  float eps_, momentum_;
  Param* w_;
  Param* b_;
  Buffer* mean_;
  Buffer* var_;
  Buffer* tracked_;
  std::map<std::pair<Shape, bool>, std::unique_ptr<Plan>> plans_;
};

class ReLU : public Module {
 public:
  Var forward(const Var& x) override;
};

struct PoolOptions {
  int kernel = 2, stride = 2, padding = 0;
};

enum class PoolKind { max, avg };

// Max pooling, or average pooling with count_include_pad = true (torch.nn.AvgPool2d's default).
class Pool2d : public Module {
 public:
  Pool2d(PoolKind kind, PoolOptions o);
  ~Pool2d() override;
  Var forward(const Var& x) override;

 private:
  struct Plan;
  PoolKind kind_;
  PoolOptions o_;
  std::map<Shape, std::unique_ptr<Plan>> plans_;
};

class MaxPool2d : public Pool2d {
 public:
  explicit MaxPool2d(PoolOptions o) : Pool2d(PoolKind::max, o) {}
};

class AvgPool2d : public Pool2d {
 public:
  explicit AvgPool2d(PoolOptions o) : Pool2d(PoolKind::avg, o) {}
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int out_h, int out_w) : oh_(out_h), ow_(out_w) {}
  Var forward(const Var& x) override;

 private:
  int oh_, ow_;
};

// [N, C, H, W] -> [N, C*H*W] in PyTorch's (channel-major) order.
class Flatten : public Module {
 public:
  Var forward(const Var& x) override;
};

class Linear : public Module {
 public:
  Linear(int in, int out, bool bias = true);
  Var forward(const Var& x) override;
  // torch.nn.Linear's default: uniform(+-1/sqrt(in)) for weight and bias.
  void reset_parameters(uint64_t seed) override;
  bool zero_bias = false;  // torchvision's DenseNet zeroes the classifier bias
  Param& weight() { return *w_; }

 private:
  int in_, out_;
  Param* w_;
  Param* b_ = nullptr;
};

class Dropout : public Module {
 public:
  explicit Dropout(float p, uint64_t seed = 0) : p_(p), seed_(seed) {}
  Var forward(const Var& x) override;

 private:
  float p_;
  uint64_t seed_;
  uint64_t calls_ = 0;
};

// Convolutions and Linear layers compute in this type: f32 (default) or bf16 (AVX512-BF16 and
// AMX through oneDNN); their inputs are converted on the way in, while outputs, gradients,
// weights and everything else stay f32. Throws when oneDNN cannot run the type on this CPU.
void set_compute_type(DType t);
DType compute_type();
bool compute_type_supported(DType t);

// Functions without parameters.
Var relu(const Var& x);
Var add(const Var& a, const Var& b);
Var add_relu(const Var& a, const Var& b);         // relu(a + b): a residual block's tail
Var concat_channels(const std::vector<Var>& xs);  // along dimension 1 (DenseNet)
Var flatten(const Var& x);
// Mean cross-entropy over the batch of logits [N, K]; label smoothing as torch's.
Var cross_entropy(const Var& logits, const std::vector<int>& labels, float smoothing = 0.0f);
// Mean binary cross-entropy with logits over [N, K] against 0/1 targets of the same shape.
Var bce_with_logits(const Var& logits, const Tensor& targets);

// Deferred BatchNorm statistics for every BatchNorm2d under root (see BatchNorm2d).
void defer_batch_norm_statistics(Module& root, bool on);
void commit_batch_norm_statistics(Module& root);
// While one lives, BatchNorm2d in training leaves its running statistics alone on this thread (a
// forward that is run again, to recompute activations or to measure, must not count twice).
class FrozenBatchNormStatistics {
 public:
  FrozenBatchNormStatistics();
  ~FrozenBatchNormStatistics();

 private:
  bool prev_;
};

// Multiply-adds of the Conv2d and Linear forwards run in this process (a pipeline's stages
// are balanced on the difference across one forward).
uint64_t forward_macs();

// Where forward and backward time goes, per kind of op ("conv.fwd", "bn.bwd", ...).
namespace profile {
void enable(bool on);
bool enabled();
void reset();
struct Entry {
  std::string op;
  double seconds = 0;
  uint64_t calls = 0;
};
std::vector<Entry> entries();  // largest first
class Scope {
 public:
  explicit Scope(const char* op);
  ~Scope();

 private:
  const char* op_;         // a string literal: the table is keyed by its address
  bool on_;                // profiling was on when the scope opened
  timeline::Scope outer_;  // the tape timeline's scope outside this one
  Clock::time_point t0_;
};
}  // namespace profile

}  // namespace cohort::nn
