// scatter: the root sends every rank its block at once.
#include <cstring>

#include "collectives.h"

namespace cohort::comm::detail {

void scatter(Engine& e, const Call& c) {
  const void* in_v = c.send;
  void* out = c.recv;
  const size_t count = c.count();
  const int root = c.root();
  const int n = e.size(), me = e.rank();
  const size_t bytes = count * c.esize();
  if (me != root) {
    e.exchange(c, {}, {{root, out, bytes}});
    return;
  }
  auto* in = static_cast<const uint8_t*>(in_v);
  std::memmove(out, in + static_cast<size_t>(me) * bytes, bytes);
  std::vector<SendOp> sends;
  for (int i = 0; i < n; ++i) {
    if (i != me) sends.push_back({i, in + static_cast<size_t>(i) * bytes, bytes});
  }
  if (!sends.empty()) e.exchange(c, sends, {});
}

}  // namespace cohort::comm::detail
