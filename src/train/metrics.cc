#include "cohort/train/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cohort::train {

double roc_auc(const std::vector<float>& scores, const std::vector<int>& labels) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney U: the sum of the positives' ranks, ties given their average rank.
  double rank_sum = 0;
  size_t pos = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double avg = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2 + 1;
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]]) {
        rank_sum += avg;
        ++pos;
      }
    }
    i = j;
  }
  const size_t neg = n - pos;
  if (pos == 0 || neg == 0) return std::nan("");
  const double p = static_cast<double>(pos);
  return (rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(neg));
}

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

}  // namespace cohort::train
