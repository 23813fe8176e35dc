// Pipeline schedules (see pipeline.h): GPipe and 1F1B as action lists, their in-flight peak
// and bubble, and the cut that balances the stages' costs.
#include "internal.h"

namespace cohort::dist {

using nn::Tensor;
using nn::Var;
using pipeline_impl::stage_pieces;
using tensor::Shape;

const char* schedule_name(Schedule s) {
  return s == Schedule::gpipe ? "gpipe" : "1f1b";
}

Schedule parse_schedule(const std::string& s) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  COHORT_THROW("unknown pipeline schedule '" << s << "' (choices: gpipe, 1f1b)");
}

std::vector<Action> schedule_actions(Schedule s, int stages, int stage, int micro_batches) {
  COHORT_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
               "schedule of stage " << stage << " of " << stages << " with " << micro_batches
                                    << " micro-batches");
  std::vector<Action> a;
  const int m = micro_batches;
  if (s == Schedule::gpipe) {
    for (int i = 0; i < m; ++i) a.push_back({true, i});
    // Backwards in micro-batch order, as 1F1B's: every schedule then adds the micro-batches'
    // gradients in one order, and ends with the same bits.
    for (int i = 0; i < m; ++i) a.push_back({false, i});
    return a;
  }
  // 1F1B: enough forwards to fill the stages after this one, then one forward and one
  // backward in turn, then the backwards left.
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) a.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    a.push_back({true, warmup + i});
    a.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) a.push_back({false, i});
  return a;
}

int peak_in_flight(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    held += a.forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

double bubble_formula(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::vector<int> balance_cuts(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  COHORT_CHECK(stages >= 1 && stages <= n,
               "cannot cut " << n << " pieces into " << stages << " stages (each needs one)");
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[i] + costs[i];
  auto cost = [&](int a, int b) { return prefix[static_cast<size_t>(b)] - prefix[a]; };
  // best[s][i]: the least possible costliest stage when pieces [0, i) form s stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(best[0].size(), 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n; ++i)
      for (int j = s - 1; j < i; ++j) {
        const double v = std::max(best[s - 1][j], cost(j, i));
        if (v < best[s][i]) {
          best[s][i] = v;
          from[s][i] = j;
        }
      }
  std::vector<int> cuts(static_cast<size_t>(stages) - 1);
  for (int s = stages, i = n; s > 1; --s) {
    i = from[s][i];
    cuts[static_cast<size_t>(s) - 2] = i;
  }
  return cuts;
}

}  // namespace cohort::dist
