#include "cohort/comm/cost_model.h"

#include <algorithm>
#include <cmath>

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
  }
  return "invalid";
}

Algo parse_algo(const std::string& s) {
  for (Algo a : {Algo::automatic, Algo::ring, Algo::recursive_doubling, Algo::rabenseifner,
                 Algo::hierarchical, Algo::tree, Algo::direct}) {
    if (s == algo_name(a)) return a;
  }
  if (s == "recursive_doubling") return Algo::recursive_doubling;
  if (s == "hierarchical") return Algo::hierarchical;
  COHORT_THROW("unknown algorithm '" << s
                                     << "' (auto, ring, rd, rabenseifner, hier, tree, direct)");
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

namespace {

struct Costs {
  double a, b, g;  // us per message, us per byte, us per reduced byte
};

Costs link_costs(const LinkModel& l, double reduce_gbps) {
  return {l.latency_us, 1.0 / (l.gbytes_per_s * 1e3), 1.0 / (reduce_gbps * 1e3)};
}

double log2i(int n) {
  return std::ceil(std::log2(std::max(1, n)));
}

double ring_allreduce(int n, double N, Costs c) {
  if (n == 1) return 0;
  return 2 * (n - 1) * c.a + 2.0 * (n - 1) / n * N * c.b + 1.0 * (n - 1) / n * N * c.g;
}
double rd_allreduce(int n, double N, Costs c) {
  if (n == 1) return 0;
  int p = pow2_floor(n);
  double extra = p == n ? 0 : 2 * (c.a + N * c.b) + N * c.g;
  return log2i(p) * (c.a + N * c.b + N * c.g) + extra;
}
double rab_allreduce(int n, double N, Costs c) {
  if (n == 1) return 0;
  int p = pow2_floor(n);
  double extra = p == n ? 0 : 2 * (c.a + N * c.b) + N * c.g;
  return 2 * log2i(p) * c.a + 2.0 * (p - 1) / p * N * c.b + 1.0 * (p - 1) / p * N * c.g + extra;
}

}  // namespace

std::vector<AlgoEstimate> estimate(Collective coll, const Topology& t, size_t bytes) {
  const int n = t.world;
  const double N = static_cast<double>(bytes);
  const bool multi_host = t.num_hosts > 1;
  const Costs flat =
      link_costs(multi_host || t.net_everywhere ? t.net : t.shm, t.reduce_gbytes_per_s);
  std::vector<AlgoEstimate> out;
  switch (coll) {
    case Collective::allreduce: {
      out.push_back({Algo::ring, ring_allreduce(n, N, flat)});
      out.push_back({Algo::recursive_doubling, rd_allreduce(n, N, flat)});
      out.push_back({Algo::rabenseifner, rab_allreduce(n, N, flat)});
      if (multi_host && t.uniform_hosts() && t.ranks_on_host(0) > 1) {
        // Reduce-scatter inside each host, allreduce of 1/L of the data across hosts by every
        // local rank at once (they share the host's link), allgather inside the host.
        const int L = t.ranks_on_host(0), H = t.num_hosts;
        const Costs local = link_costs(t.net_everywhere ? t.net : t.shm, t.reduce_gbytes_per_s);
        const double inside = 2 * (L - 1) * local.a + 2.0 * (L - 1) / L * N * local.b +
                              1.0 * (L - 1) / L * N * local.g;
        Costs shared = flat;
        shared.b = flat.b * L;  // L concurrent flows through one host link
        const double ring_across = ring_allreduce(H, N / L, shared);
        double us = inside + std::min(ring_across, rd_allreduce(H, N / L, shared));
        if (bytes >= kHierPipelineMinBytes) {
          // Pipelined (ring across): the slower phase sets the pace, the faster one costs only
          // its share of a chunk (filling and draining), and every chunk pays a step latency.
          const double chunks = std::clamp(N / kHierChunkBytes, 1.0, double{kHierMaxChunks});
          us = std::max(inside, ring_across) + std::min(inside, ring_across) / chunks +
               (chunks - 1) * std::max(local.a, flat.a);
        }
        out.push_back({Algo::hierarchical, us});
      }
      break;
    }
    case Collective::reduce_scatter:
      out.push_back({Algo::ring, (n - 1) * flat.a + 1.0 * (n - 1) / n * N * (flat.b + flat.g)});
      break;
    case Collective::allgather:
      out.push_back({Algo::ring, (n - 1) * flat.a + 1.0 * (n - 1) / n * N * flat.b});
      if (pow2_floor(n) == n) {
        out.push_back(
            {Algo::recursive_doubling, log2i(n) * flat.a + 1.0 * (n - 1) / n * N * flat.b});
      }
      break;
    case Collective::broadcast:
      out.push_back({Algo::tree, log2i(n) * (flat.a + N * flat.b)});
      if (n > 2) {
        out.push_back({Algo::ring, (log2i(n) + n - 1) * flat.a + 2.0 * (n - 1) / n * N * flat.b});
      }
      break;
    case Collective::reduce:
      out.push_back({Algo::tree, log2i(n) * (flat.a + N * (flat.b + flat.g))});
      if (n > 2) {
        out.push_back(
            {Algo::ring, 2 * (n - 1) * flat.a + 1.0 * (n - 1) / n * N * (2 * flat.b + flat.g)});
      }
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
