// Which algorithm a call runs, decided once, when it is issued, and carried with the call (as
// NCCL's enqueue writes its choice into the task). One function knows which algorithms each
// collective has and what each needs of the group; a forced algorithm that cannot run is an
// error saying why, never silently replaced.
#pragma once

#include <cstddef>

#include "cohort/comm/communicator.h"
#include "cohort/comm/cost_model.h"

namespace cohort::comm::detail {

struct AlgoChoice {
  Algo algo;
  const char* reason;  // static text: "cost model", "forced by the call", "COHORT_ALGO", ...
};

// `bytes`: the call's whole payload as the cost model counts it (allgather: all ranks' blocks).
// `forced`: the call's own option (CollOptions::algo); `policy`: COHORT_ALGO, which forces its
// algorithm on the collectives that have it and leaves the others to the cost model. Throws
// Error naming the collective, the algorithm and what it needs, when a forced one cannot run.
// `shared_memory`: the communicator has allocated shared memory (alloc_shared), which every
// rank knows alike, and reaches its host's peers through it.
AlgoChoice choose_algorithm(Collective c, size_t bytes, Algo forced, Algo policy, const Topology& t,
                            bool shared_memory = false);

// From this size on, an allreduce, reduce_scatter or allgather on a one-host group that has
// shared memory runs `shared`: it begins by telling the peers where its buffers lie, a few
// microseconds that a large call repays. (The size is the cost model's: reduce_scatter's block,
// allgather's whole result.)
inline constexpr size_t kSharedMinBytes = 256u << 10;

// Whether collective c has algorithm a at all.
bool has_algorithm(Collective c, Algo a);

}  // namespace cohort::comm::detail
