#include "cohort/comm/cost_model.h"

#include <algorithm>
#include <cmath>

#include "cohort/core/alpha_beta.h"
#include "cohort/core/bits.h"
#include "cohort/core/error.h"

namespace cohort::comm {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::allreduce:
      return "allreduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::allgather:
      return "allgather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::reduce:
      return "reduce";
    case Collective::alltoall:
      return "alltoall";
    case Collective::gather:
      return "gather";
    case Collective::scatter:
      return "scatter";
    case Collective::sendrecv:
      return "sendrecv";
    case Collective::barrier:
      return "barrier";
  }
  return "invalid";
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::automatic:
      return "auto";
    case Algo::ring:
      return "ring";
    case Algo::recursive_doubling:
      return "rd";
    case Algo::rabenseifner:
      return "rabenseifner";
    case Algo::hierarchical:
      return "hier";
    case Algo::tree:
      return "tree";
    case Algo::direct:
      return "direct";
    case Algo::shared:
      return "shared";
  }
  return "invalid";
}

Algo parse_algo(const std::string& s) {
  for (Algo a : {Algo::automatic, Algo::ring, Algo::recursive_doubling, Algo::rabenseifner,
                 Algo::hierarchical, Algo::tree, Algo::direct, Algo::shared}) {
    if (s == algo_name(a)) return a;
  }
  if (s == "recursive_doubling") return Algo::recursive_doubling;
  if (s == "hierarchical") return Algo::hierarchical;
  COHORT_THROW("unknown algorithm '"
               << s << "' (auto, ring, rd, rabenseifner, hier, tree, direct, shared)");
}

Topology Topology::uniform(int hosts, int ranks_per_host) {
  Topology t;
  t.world = hosts * ranks_per_host;
  t.num_hosts = hosts;
  for (int r = 0; r < t.world; ++r) t.host_of_rank.push_back(r / ranks_per_host);
  return t;
}

int Topology::ranks_on_host(int h) const {
  return static_cast<int>(std::count(host_of_rank.begin(), host_of_rank.end(), h));
}

bool Topology::uniform_hosts() const {
  for (int h = 1; h < num_hosts; ++h) {
    if (ranks_on_host(h) != ranks_on_host(0)) return false;
  }
  return true;
}

std::vector<AlgoEstimate> estimate(Collective coll, const Topology& t, size_t bytes) {
  namespace ab = alpha_beta;
  const int n = t.world;
  const double N = static_cast<double>(bytes);
  const bool multi_host = t.num_hosts > 1;
  auto link = [&](const LinkModel& l) {
    return ab::costs(l.latency_us, l.gbytes_per_s, t.reduce_gbytes_per_s);
  };
  const ab::Costs flat = link(multi_host || t.net_everywhere ? t.net : t.shm);
  std::vector<AlgoEstimate> out;
  switch (coll) {
    case Collective::allreduce: {
      out.push_back({Algo::ring, ab::ring_allreduce(n, N, flat)});
      out.push_back({Algo::recursive_doubling, ab::rd_allreduce(n, N, flat)});
      out.push_back({Algo::rabenseifner, ab::rabenseifner_allreduce(n, N, flat)});
      if (multi_host && t.uniform_hosts() && t.ranks_on_host(0) > 1) {
        const int L = t.ranks_on_host(0);
        ab::Costs shared = flat;
        shared.b = flat.b * L;  // L concurrent flows through one host link
        out.push_back({Algo::hierarchical,
                       ab::hierarchical_allreduce(
                           L, t.num_hosts, N, link(t.net_everywhere ? t.net : t.shm), shared,
                           {kHierPipelineMinBytes, kHierChunkBytes, kHierMaxChunks})});
      }
      break;
    }
    case Collective::reduce_scatter:
      out.push_back({Algo::ring, ab::ring_reduce_scatter(n, N, flat)});
      break;
    case Collective::allgather:
      out.push_back({Algo::ring, ab::ring_allgather(n, N, flat)});
      if (pow2_floor(n) == n)
        out.push_back({Algo::recursive_doubling, ab::rd_allgather(n, N, flat)});
      break;
    case Collective::broadcast:
      out.push_back({Algo::tree, ab::tree_broadcast(n, N, flat)});
      if (n > 2) out.push_back({Algo::ring, ab::ring_broadcast(n, N, flat)});
      break;
    case Collective::reduce:
      out.push_back({Algo::tree, ab::tree_reduce(n, N, flat)});
      if (n > 2) out.push_back({Algo::ring, ab::ring_reduce(n, N, flat)});
      break;
    default:
      out.push_back({Algo::direct, (n - 1) * (flat.a + N / std::max(1, n) * flat.b)});
      break;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const AlgoEstimate& x, const AlgoEstimate& y) { return x.us < y.us; });
  return out;
}

Algo choose(Collective c, const Topology& t, size_t bytes) {
  return estimate(c, t, bytes).front().algo;
}

}  // namespace cohort::comm
