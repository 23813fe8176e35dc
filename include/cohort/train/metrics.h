// Figures a training run reports: ROC AUC (rank statistic, ties averaged), and the process's
// peak resident memory.
#pragma once

#include <cstddef>
#include <vector>

namespace cohort::train {

// Area under the ROC curve of scores against 0/1 labels; NaN when one class is absent.
double roc_auc(const std::vector<float>& scores, const std::vector<int>& labels);

// Peak resident set size of this process, in bytes (getrusage).
size_t peak_rss_bytes();

}  // namespace cohort::train
