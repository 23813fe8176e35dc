// reduce_scatter: ring, shifted by one block so that each rank ends owning its own block.
#include <cstring>

#include "cohort/core/error.h"
#include "collectives.h"
#include "reduce/reduce.h"

namespace cohort::comm::detail {

void reduce_scatter(Engine& e, const Call& c) {  // ring, the only algorithm
  auto* in = static_cast<const uint8_t*>(c.send);
  void* out = c.recv;
  const size_t count = c.count();
  const int n = e.size();
  const size_t bytes = count * c.esize();
  const Group& g = e.natural();  // block i belongs to rank i
  if (n == 1) {
    if (in != out) std::memmove(out, in, bytes);
  } else {
    auto* tmp = static_cast<uint8_t*>(e.scratch(bytes * static_cast<size_t>(n), 1));
    ring_reduce_scatter(e, c, g, in, tmp, count * static_cast<size_t>(n), 1);
    std::memcpy(out, tmp + static_cast<size_t>(g.me) * bytes, bytes);
  }
  if (c.desc.op == RedOp::avg) divide(out, count, c.desc.dtype, n);
}

}  // namespace cohort::comm::detail
