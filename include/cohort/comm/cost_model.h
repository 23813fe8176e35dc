// The latency-bandwidth (alpha-beta) cost model that picks an algorithm per call, as NCCL's
// tuner does: every candidate's time is estimated from the group's shape and link figures, and
// the cheapest wins. COHORT_ALGO overrides the choice; `cohort topo` prints the table. The
// formulas themselves live in core (cohort/core/alpha_beta.h), shared with `cohort plan`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"

namespace cohort::comm {

enum class Collective : uint8_t {
  allreduce = 1,
  reduce_scatter,
  allgather,
  broadcast,
  reduce,
  alltoall,
  gather,
  scatter,
  sendrecv,
  barrier,
};
const char* collective_name(Collective c);

struct LinkModel {
  double latency_us;    // per message, one way
  double gbytes_per_s;  // per direction
};

struct Topology {
  int world = 1;
  std::vector<int> host_of_rank;  // host index of each rank
  int num_hosts = 1;
  bool net_everywhere = false;  // COHORT_TRANSPORT=tcp
  LinkModel shm{1.0, 5.0};      // measured defaults for this class of machine
  LinkModel net{20.0, 1.2};
  double reduce_gbytes_per_s = 6.0;  // bytes of output per second of the reduction kernel

  static Topology uniform(int hosts, int ranks_per_host);
  int ranks_on_host(int h) const;
  bool uniform_hosts() const;
};

struct AlgoEstimate {
  Algo algo;
  double us;
};

// Hierarchical allreduces from this size run as a pipeline of chunks of about kHierChunkBytes
// (COHORT_HIER_CHUNK overrides the chunk when running; the model assumes the default).
inline constexpr size_t kHierPipelineMinBytes = 4u << 20;
inline constexpr size_t kHierChunkBytes = 2u << 20;
inline constexpr int kHierMaxChunks = 256;

// Every algorithm the engine can run for this collective and size, cheapest first.
std::vector<AlgoEstimate> estimate(Collective c, const Topology& t, size_t bytes);
Algo choose(Collective c, const Topology& t, size_t bytes);

}  // namespace cohort::comm
