// Optimisers over the model's flat buffers: one vectorised loop per step for SGD and AdamW
// (the same arithmetic as torch.optim's), per-parameter trust ratios for LARS. State lives in
// flat buffers shaped like the parameters', so checkpoints and ZeRO shards slice it alike.
#pragma once

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

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate lr from the gradients in the flat buffer.
  virtual void step(float lr) = 0;
  // Named state buffers (momentum, Adam moments) for checkpoints.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

 protected:
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> make_optimizer(Model& m, const OptimOptions& o);

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

// Scales the flat gradients so that their global L2 norm is at most max_norm (torch's
// clip_grad_norm_); returns the norm before clipping.
double clip_grad_norm(Model& m, double max_norm);

// Goyal et al.'s linear scaling rule: lr for a global batch, given the lr for `reference`.
float linear_scaled_lr(float lr, int64_t global_batch, int64_t reference = 256);

}  // namespace cohort::nn
