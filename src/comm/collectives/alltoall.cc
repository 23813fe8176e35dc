// alltoall: every pair exchanges directly, all transfers posted at once.
#include <cstring>

#include "collectives.h"

namespace cohort::comm::detail {

void alltoall(Engine& e, const Call& c) {
  const void* in_v = c.send;
  void* out_v = c.recv;
  const size_t count = c.count();
  auto* in = static_cast<const uint8_t*>(in_v);
  auto* out = static_cast<uint8_t*>(out_v);
  const int n = e.size(), me = e.rank();
  const size_t bytes = count * c.esize();
  const uint8_t* src = in;
  if (in == out) {  // in place: keep a copy of what we send
    auto* tmp = static_cast<uint8_t*>(e.scratch(bytes * static_cast<size_t>(n), 1));
    std::memcpy(tmp, in, bytes * static_cast<size_t>(n));
    src = tmp;
  }
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int s = 1; s < n; ++s) {
    const int to = (me + s) % n, from = (me - s + n) % n;
    sends.push_back({to, src + static_cast<size_t>(to) * bytes, bytes});
    recvs.push_back({from, out + static_cast<size_t>(from) * bytes, bytes});
  }
  std::memmove(out + static_cast<size_t>(me) * bytes, src + static_cast<size_t>(me) * bytes, bytes);
  if (n > 1) e.exchange(c, sends, recvs);
}

}  // namespace cohort::comm::detail
