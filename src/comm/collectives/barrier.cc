// barrier: dissemination, ceil(log2 n) rounds of empty messages.
#include "../engine.h"

namespace cohort::comm::detail {

void barrier(Engine& e) {
  const int n = e.size(), me = e.rank();
  for (int k = 1; k < n; k *= 2) {
    e.exchange({{(me + k) % n, nullptr, 0}}, {{(me - k + n) % n, nullptr, 0}});
  }
}

}  // namespace cohort::comm::detail
