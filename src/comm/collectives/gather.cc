// gather: the root receives from every rank at once.
#include <cstring>

#include "collectives.h"

namespace cohort::comm::detail {

void gather(Engine& e, const Call& c) {
  const void* in = c.send;
  void* out_v = c.recv;
  const size_t count = c.count();
  const int root = c.root();
  const int n = e.size(), me = e.rank();
  const size_t bytes = count * c.esize();
  if (me != root) {
    e.exchange(c, {{root, in, bytes}}, {});
    return;
  }
  auto* out = static_cast<uint8_t*>(out_v);
  std::memmove(out + static_cast<size_t>(me) * bytes, in, bytes);
  std::vector<RecvOp> recvs;
  for (int i = 0; i < n; ++i) {
    if (i != me) recvs.push_back({i, out + static_cast<size_t>(i) * bytes, bytes});
  }
  if (!recvs.empty()) e.exchange(c, {}, recvs);
}

}  // namespace cohort::comm::detail
