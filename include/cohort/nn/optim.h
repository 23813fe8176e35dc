// Optimisers over flat ranges of values and gradients: one vectorised loop per range for SGD and
// AdamW (the same arithmetic as torch.optim's), per-parameter trust ratios for LARS. Unsharded,
// one range covers the model's flat buffers; under ZeRO, a rank's ranges are its chunks of the
// units, and its state covers those alone. The state lies as the ranges do, back to back, so
// checkpoints slice it with the values.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/nn/model.h"

namespace cohort::nn {

struct OptimOptions {
  std::string kind = "sgd";  // sgd | adamw | lars
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 1e-4f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
  float trust = 0.001f;                             // lars: eta
};

// What an optimiser updates: contiguous ranges of values (w) and their gradients (g).
struct FlatRange {
  float* w = nullptr;
  float* g = nullptr;
  size_t n = 0;
};
// Elements [lo, hi) of parameter `param` (flattened) lie at element `at` of range `range`.
struct ParamPiece {
  int param = 0;
  size_t lo = 0, hi = 0;
  size_t range = 0, at = 0;
  bool decay = true;
};
struct OptimTarget {
  std::vector<FlatRange> ranges;
  std::vector<ParamPiece> pieces;  // every parameter element this rank updates
  int num_params = 0;
  // Sums per-rank partial figures (squared norms, counts) over the ranks that hold the other
  // pieces of the parameters; null when this rank holds every parameter whole.
  std::function<void(double*, size_t)> sum_across;

  size_t numel() const;                 // elements over all ranges: the size of each state buffer
  size_t state_at(size_t range) const;  // where a range's state starts
};
// The whole model on one rank (and DDP, where every rank holds everything).
OptimTarget whole_model(Model& m);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate lr from the gradients in the flat buffer.
  virtual void step(float lr) = 0;
  // Named state buffers (momentum, Adam moments), each OptimTarget::numel() long.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
  int64_t steps() const { return steps_; }
  // Bytes of state per updated element (K in the ZeRO paper: 8 for AdamW's two moments).
  virtual size_t state_bytes_per_element() const = 0;
  void set_steps(int64_t s) { steps_ = s; }

 protected:
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimTarget& t, const OptimOptions& o);
std::unique_ptr<Optimizer> make_optimizer(Model& m, const OptimOptions& o);  // whole_model(m)

// Learning rate per step: linear warmup from lr/warmup to lr, then cosine to 0, step decay
// (x gamma every step_every steps) or constant.
struct LrSchedule {
  float lr = 0.1f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  std::string kind = "cosine";  // cosine | step | constant
  int64_t step_every = 0;
  float gamma = 0.1f;
  float at(int64_t step) const;
};

// Scales the gradients so that their global L2 norm (over every rank's pieces) is at most
// max_norm (torch's clip_grad_norm_); returns the norm before clipping.
double clip_grad_norm(const OptimTarget& t, double max_norm);
double clip_grad_norm(Model& m, double max_norm);  // whole_model(m)

// Goyal et al.'s linear scaling rule: lr for a global batch, given the lr for `reference`.
float linear_scaled_lr(float lr, int64_t global_batch, int64_t reference = 256);

}  // namespace cohort::nn
