// scatter: the root sends every rank its block at once.
#include <cstring>

#include "../engine.h"

namespace cohort::comm::detail {

void scatter(Engine& e, const void* in_v, void* out, size_t count, int root) {
  const int n = e.size(), me = e.rank();
  const size_t bytes = count * e.esize();
  if (me != root) {
    e.exchange({}, {{root, out, bytes}});
    return;
  }
  auto* in = static_cast<const uint8_t*>(in_v);
  std::memmove(out, in + static_cast<size_t>(me) * bytes, bytes);
  std::vector<SendOp> sends;
  for (int i = 0; i < n; ++i) {
    if (i != me) sends.push_back({i, in + static_cast<size_t>(i) * bytes, bytes});
  }
  if (!sends.empty()) e.exchange(sends, {});
}

}  // namespace cohort::comm::detail
