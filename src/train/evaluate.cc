// Validation: every rank evaluates its shard of the validation set; logits, targets and sample
// indices are gathered (the sampler gives every rank the same count, padding with repeats, which
// are dropped here by index), so every rank computes the same figures over each sample once:
// loss, accuracy, and ROC AUC (binary, or the mean over findings).
#include <algorithm>
#include <cmath>

#include "cohort/nn/layers.h"
#include "cohort/train/metrics.h"
#include "run.h"

namespace cohort::train {

EvalResult evaluate(nn::Model& m, data::Pipeline& p, bool multilabel, int classes,
                    comm::Communicator* world) {
  m.train(false);
  nn::NoGrad ng;
  std::vector<double> index;           // f64: exact for any data set index
  std::vector<float> logits, targets;  // targets: [n, classes] findings, or [n] class ids
  p.start_epoch(0);
  data::Batch b;
  while (p.next(&b)) {
    Targets t = batch_targets(b, multilabel, classes);
    Tensor z = m.forward(nn::constant(batch_tensor(b)))->value.contiguous();
    logits.insert(logits.end(), z.data<float>(), z.data<float>() + z.numel());
    for (int i = 0; i < b.size; ++i) {
      index.push_back(static_cast<double>(b.indices[i]));
      if (multilabel) {
        const float* row = t.multilabel.data<float>() + i * classes;
        targets.insert(targets.end(), row, row + classes);
      } else {
        targets.push_back(static_cast<float>(t.classes[i]));
      }
    }
  }
  m.train(true);
  if (world && world->size() > 1) {
    const size_t n = world->size();
    auto gather = [&](auto& v, comm::DataType t) {
      std::remove_reference_t<decltype(v)> all(v.size() * n);
      world->allgather(v.data(), all.data(), v.size(), t).wait();
      v.swap(all);
    };
    gather(index, comm::DataType::f64);
    gather(logits, comm::DataType::f32);
    gather(targets, comm::DataType::f32);
  }
  const size_t width = multilabel ? static_cast<size_t>(classes) : 1;
  std::vector<std::vector<float>> scores(multilabel ? classes : 1);
  std::vector<std::vector<int>> labels(scores.size());
  std::vector<char> seen;
  EvalResult r;
  double loss_sum = 0;
  size_t correct = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    const size_t id = static_cast<size_t>(index[i]);
    if (id >= seen.size()) seen.resize(id + 1, 0);
    if (seen[id]) continue;
    seen[id] = 1;
    ++r.samples;
    const float* row = logits.data() + i * classes;
    const float* tr = targets.data() + i * width;
    if (multilabel) {
      for (int k = 0; k < classes; ++k) {
        const double x = row[k];
        loss_sum += (std::max(x, 0.0) - x * tr[k] + std::log1p(std::exp(-std::abs(x)))) / classes;
        scores[k].push_back(row[k]);
        labels[k].push_back(tr[k] > 0);
      }
      continue;
    }
    const int y = static_cast<int>(tr[0]);
    const float mx = *std::max_element(row, row + classes);
    double se = 0;
    for (int k = 0; k < classes; ++k) se += std::exp(static_cast<double>(row[k] - mx));
    loss_sum += mx + std::log(se) - row[y];
    correct += static_cast<int>(std::max_element(row, row + classes) - row) == y;
    if (classes == 2) {
      scores[0].push_back(row[1] - row[0]);  // monotone in softmax p(1)
      labels[0].push_back(y);
    }
  }
  r.loss = r.samples ? loss_sum / static_cast<double>(r.samples) : 0;
  r.accuracy = r.samples && !multilabel ? static_cast<double>(correct) / r.samples : std::nan("");
  r.auc = std::nan("");
  if (multilabel || classes == 2) {
    double sum = 0;
    int n = 0;
    for (size_t k = 0; k < scores.size(); ++k) {
      const double a = roc_auc(scores[k], labels[k]);
      if (multilabel) r.auc_per_finding.push_back(a);
      if (std::isfinite(a)) {
        sum += a;
        ++n;
      }
    }
    if (n) r.auc = sum / n;
  }
  return r;
}

}  // namespace cohort::train
