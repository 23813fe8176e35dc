// The latency-bandwidth (alpha-beta-gamma) formulas of the collective algorithms. comm prices
// each call's candidate algorithms with them (cost_model.h), and plan predicts a cluster's step
// time with them, so that both price a collective the same way.
#pragma once

#include <cstddef>

namespace cohort::alpha_beta {

// A link as the formulas see it: microseconds per message (alpha), per byte moved (beta), and
// per byte reduced (gamma, the reduction kernel).
struct Costs {
  double a = 0, b = 0, g = 0;
};
Costs costs(double latency_us, double gbytes_per_s, double reduce_gbytes_per_s);

// n ranks, `bytes` the whole buffer; microseconds.
double ring_allreduce(int n, double bytes, Costs c);
double rd_allreduce(int n, double bytes, Costs c);  // recursive doubling
double rabenseifner_allreduce(int n, double bytes, Costs c);
double ring_reduce_scatter(int n, double bytes, Costs c);
double ring_allgather(int n, double bytes, Costs c);
double rd_allgather(int n, double bytes, Costs c);  // n a power of two
double tree_broadcast(int n, double bytes, Costs c);
double ring_broadcast(int n, double bytes, Costs c);
double tree_reduce(int n, double bytes, Costs c);
double ring_reduce(int n, double bytes, Costs c);

// Hierarchical allreduce over `hosts` hosts of `local` ranks each: reduce-scatter inside each
// host, an allreduce of 1/local of the buffer across hosts by every local rank at once (they
// share the host's link, so `across` is one rank's share of it), allgather inside. From
// `pipeline_min_bytes` on, the phases run as a pipeline of chunks of about `chunk_bytes` (at
// most `max_chunks`): the slower phase sets the pace, the faster one costs its share of a chunk,
// and every chunk pays a step's latency.
struct Pipelining {
  size_t min_bytes = 4u << 20;
  size_t chunk_bytes = 2u << 20;
  int max_chunks = 256;
};
double hierarchical_allreduce(int local, int hosts, double bytes, Costs inside, Costs across,
                              Pipelining p = {});

}  // namespace cohort::alpha_beta
