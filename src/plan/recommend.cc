// The recommendation: a search over the modes that fit, bucket sizes, batches and accumulation
// for the smallest global batch that reaches the target efficiency, with a sentence per choice.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/plan/plan.h"

namespace cohort::plan {

namespace {

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

}  // namespace

Recommendation recommend(const ModelProfile& p, const Cluster& c, const Strategy& base, int nodes,
                         double target) {
  COHORT_CHECK(target > 0 && target <= 1, "target efficiency " << target << ": expected (0, 1]");
  Recommendation best;
  bool have = false;
  auto better = [&](const Prediction& a, const Prediction& b) {
    const bool ra = a.efficiency >= target, rb = b.efficiency >= target;
    if (ra != rb) return ra;
    if (!ra) return a.efficiency > b.efficiency + 1e-9;
    if (a.global_batch != b.global_batch) return a.global_batch < b.global_batch;
    if (std::abs(a.memory.total() - b.memory.total()) > 1e6)
      return a.memory.total() < b.memory.total();
    return a.efficiency > b.efficiency;
  };
  for (Mode m : {Mode::ddp, Mode::zero1, Mode::zero2, Mode::hybrid, Mode::zero3}) {
    for (double bucket : {5.0, 10.0, 25.0, 50.0, 100.0}) {
      if (m != Mode::ddp && bucket != base.bucket_mb) continue;  // sharded modes reduce units
      for (int batch : {4, 8, 16, 32, 64, 128, 256}) {
        for (int accum : {1, 2, 4, 8, 16}) {
          Strategy s = base;
          s.mode = m;
          s.bucket_mb = bucket;
          s.batch = batch;
          s.accum = accum;
          const Prediction r = predict(p, c, s, nodes);
          if (!r.memory.fits()) continue;
          if (!have || better(r, best.prediction)) {
            best.strategy = s;
            best.prediction = r;
            have = true;
          }
        }
      }
    }
  }
  if (!have) {
    Strategy s = base;
    s.mode = Mode::zero3;
    s.batch = 1;
    s.accum = 1;
    const Prediction r = predict(p, c, s, nodes);
    best.strategy = s;
    best.prediction = r;
    best.reasons.push_back(
        "Nothing fits: even zero3 at batch 1 needs " + fixed(r.memory.total() / kGiB, 1) +
        " GiB per accelerator of " + fixed(r.memory.capacity / kGiB, 1) +
        " usable; use a smaller image, activation recomputation, or pipeline stages.");
    return best;
  }
  const Strategy& s = best.strategy;
  const Prediction& r = best.prediction;
  best.reached = r.efficiency >= target;
  Strategy ddp = s;
  ddp.mode = Mode::ddp;
  const Prediction as_ddp = predict(p, c, ddp, nodes);
  if (s.mode == Mode::ddp) {
    best.reasons.push_back("Mode ddp: the full model state fits (" +
                           fixed(r.memory.total() / kGiB, 1) + " of " +
                           fixed(r.memory.capacity / kGiB, 1) +
                           " GiB), and replicating it adds no parameter traffic.");
  } else if (!as_ddp.memory.fits()) {
    best.reasons.push_back(std::string("Mode ") + mode_name(s.mode) + ": ddp would need " +
                           fixed(as_ddp.memory.total() / kGiB, 1) + " GiB of " +
                           fixed(r.memory.capacity / kGiB, 1) + "; " + mode_name(s.mode) +
                           " needs " + fixed(r.memory.total() / kGiB, 1) + " GiB.");
  } else {
    best.reasons.push_back(std::string("Mode ") + mode_name(s.mode) + ": it frees memory for a " +
                           "larger batch at the same efficiency (" +
                           fixed(r.memory.total() / kGiB, 1) + " GiB per accelerator).");
  }
  if (s.mode == Mode::ddp) {
    best.reasons.push_back("Buckets of " + fixed(s.bucket_mb, 0) + " MB leave " +
                           fixed(r.exposed_comm_ms, 1) + " ms of " + fixed(r.communication_ms, 1) +
                           " ms of communication exposed: smaller ones pay more latency, larger "
                           "ones start later in backward.");
  }
  best.reasons.push_back("Batch " + std::to_string(s.batch) + " x accumulation " +
                         std::to_string(s.accum) + " x " + std::to_string(r.world) +
                         " accelerators = global batch " + std::to_string(r.global_batch) +
                         (best.reached ? ", the smallest that reaches "
                                       : ", the best "
                                         "found, short of ") +
                         fixed(100 * target, 0) + "% efficiency at " + std::to_string(nodes) +
                         " nodes (" + fixed(100 * r.efficiency, 1) +
                         "%); scale the learning rate linearly from your reference "
                         "batch, with warmup.");
  if (r.data_wait_ms > 0) {
    best.reasons.push_back("The input pipeline limits this step: it needs " +
                           fixed(r.cores_per_accelerator_needed, 1) +
                           " decoding cores per accelerator, or GPU decoding.");
  }
  return best;
}

}  // namespace cohort::plan
