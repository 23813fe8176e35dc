// The step: a batch as the model's input, forward and loss on a tape, backward (under data
// parallelism the gradients go out as backward finishes them), dp's finish, the optimiser, dp's
// after_step. Reads top to bottom.
#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/nn/layers.h"
#include "run.h"

namespace cohort::train {

using nn::Var;

Tensor batch_tensor(const data::Batch& b) {
  return Tensor::wrap(const_cast<uint8_t*>(b.data), {b.size, b.channels, b.height, b.width},
                      tensor::DType::f32, tensor::Order::channels_last);
}

Targets batch_targets(const data::Batch& b, bool multilabel, int classes) {
  Targets t;
  if (!multilabel) {
    t.classes.assign(b.labels.begin(), b.labels.begin() + b.size);
    return t;
  }
  t.multilabel = Tensor::zeros({b.size, classes});
  for (int i = 0; i < b.size; ++i)
    for (int l : b.label_sets[i]) {
      COHORT_CHECK(l >= 0 && l < classes, "finding " << l << " of sample " << b.indices[i]
                                                     << " outside [0, " << classes << ")");
      t.multilabel.data<float>()[i * classes + l] = 1.0f;
    }
  return t;
}

float forward_backward(nn::Model& m, const Tensor& x, const Targets& t, float label_smoothing,
                       float loss_scale, dist::DataParallel* dp, bool sync, StepTimes* times) {
  auto t0 = Clock::now();
  nn::Tape tape;
  nn::Tape::Recording rec(tape);
  Var logits = m.forward(nn::constant(x));
  Var loss = t.multilabel.defined() ? nn::bce_with_logits(logits, t.multilabel)
                                    : nn::cross_entropy(logits, t.classes, label_smoothing);
  const float value = loss->value.data<float>()[0];
  auto t1 = Clock::now();
  if (dp) {
    dp->backward(tape, loss, loss_scale, sync);  // dp owns the averaging over ranks
  } else {
    tape.backward(loss, loss_scale);
  }
  if (times) {
    times->forward += std::chrono::duration<double>(t1 - t0).count();
    times->backward += seconds_since(t1);
  }
  return value;
}

float pipeline_forward_backward(dist::Pipeline& p, const Tensor& x, const Targets& t,
                                int micro_batches, float label_smoothing, float loss_scale) {
  const int64_t n = x.size(0) / micro_batches;
  auto loss = [&](const Var& logits, int i) {
    if (t.multilabel.defined())
      return nn::bce_with_logits(logits, t.multilabel.narrow0(i * n, (i + 1) * n));
    return nn::cross_entropy(
        logits, std::vector<int>(t.classes.begin() + i * n, t.classes.begin() + (i + 1) * n),
        label_smoothing);
  };
  return p.run(x, loss, loss_scale);
}

float train_step(nn::Model& m, nn::Optimizer& opt, const Tensor& x, const Targets& t, float lr,
                 float label_smoothing, StepTimes* times, dist::DataParallel* dp, bool sync) {
  if (dp) {
    dp->zero_grad();
  } else {
    m.zero_grad();
  }
  const float loss = forward_backward(m, x, t, label_smoothing, 1.0f, dp, sync, times);
  if (dp) {
    const double w = dp->finish();
    if (times) times->comm_wait += w;
  }
  auto t3 = Clock::now();
  {
    nn::profile::Scope prof("optimizer");
    opt.step(lr);
  }
  if (dp) dp->after_step();
  if (times) times->optimizer += seconds_since(t3);
  return loss;
}

}  // namespace cohort::train
