// barrier: dissemination, ceil(log2 n) rounds of empty messages.
#include "collectives.h"

namespace cohort::comm::detail {

void barrier(Engine& e, const Call& c) {
  const int n = e.size(), me = e.rank();
  for (int k = 1; k < n; k *= 2) {
    e.exchange(c, {{(me + k) % n, nullptr, 0}}, {{(me - k + n) % n, nullptr, 0}});
  }
}

}  // namespace cohort::comm::detail
