// reduce_scatter: ring, shifted by one block so that each rank ends owning its own block.
#include <cstring>

#include "../engine.h"
#include "cohort/comm/reduce.h"
#include "cohort/core/error.h"

namespace cohort::comm::detail {

void reduce_scatter(Engine& e, const void* in_v, void* out, size_t count, Algo algo) {
  if (algo != Algo::automatic && algo != Algo::ring) {
    COHORT_THROW("reduce_scatter has no algorithm '" << algo_name(algo) << "'");
  }
  auto* in = static_cast<const uint8_t*>(in_v);
  const int n = e.size();
  const size_t bytes = count * e.esize();
  const Group& g = e.natural();  // block i belongs to rank i
  if (n == 1) {
    if (in != out) std::memmove(out, in, bytes);
  } else {
    auto* tmp = static_cast<uint8_t*>(e.scratch(bytes * static_cast<size_t>(n), 1));
    ring_reduce_scatter(e, g, in, tmp, count * static_cast<size_t>(n), 1);
    std::memcpy(out, tmp + static_cast<size_t>(g.me) * bytes, bytes);
  }
  if (e.desc().op == RedOp::avg) divide(out, count, e.desc().dtype, n);
}

}  // namespace cohort::comm::detail
