#include "cohort/core/alpha_beta.h"

#include <algorithm>
#include <cmath>

#include "cohort/core/bits.h"

namespace cohort::alpha_beta {

namespace {

double log2i(int n) {
  return std::ceil(std::log2(std::max(1, n)));
}

// Ranks beyond the largest power of two fold in and out: two extra messages of the buffer.
double fold(int n, double bytes, Costs c) {
  return pow2_floor(n) == n ? 0 : 2 * (c.a + bytes * c.b) + bytes * c.g;
}

}  // namespace

Costs costs(double latency_us, double gbytes_per_s, double reduce_gbytes_per_s) {
  return {latency_us, 1.0 / (gbytes_per_s * 1e3), 1.0 / (reduce_gbytes_per_s * 1e3)};
}

double ring_allreduce(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return 2 * (n - 1) * c.a + 2.0 * (n - 1) / n * N * c.b + 1.0 * (n - 1) / n * N * c.g;
}

double rd_allreduce(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return log2i(pow2_floor(n)) * (c.a + N * c.b + N * c.g) + fold(n, N, c);
}

double rabenseifner_allreduce(int n, double N, Costs c) {
  if (n <= 1) return 0;
  const int p = pow2_floor(n);
  return 2 * log2i(p) * c.a + 2.0 * (p - 1) / p * N * c.b + 1.0 * (p - 1) / p * N * c.g +
         fold(n, N, c);
}

double ring_reduce_scatter(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return (n - 1) * c.a + 1.0 * (n - 1) / n * N * (c.b + c.g);
}

double ring_allgather(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return (n - 1) * c.a + 1.0 * (n - 1) / n * N * c.b;
}

double rd_allgather(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return log2i(n) * c.a + 1.0 * (n - 1) / n * N * c.b;
}

double tree_broadcast(int n, double N, Costs c) {
  return log2i(n) * (c.a + N * c.b);
}

double ring_broadcast(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return (log2i(n) + n - 1) * c.a + 2.0 * (n - 1) / n * N * c.b;
}

double tree_reduce(int n, double N, Costs c) {
  return log2i(n) * (c.a + N * (c.b + c.g));
}

double ring_reduce(int n, double N, Costs c) {
  if (n <= 1) return 0;
  return 2 * (n - 1) * c.a + 1.0 * (n - 1) / n * N * (2 * c.b + c.g);
}

double hierarchical_allreduce(int L, int H, double N, Costs inside, Costs across, Pipelining p) {
  const double in = ring_allreduce(L, N, inside);
  const double ring_across = ring_allreduce(H, N / L, across);
  if (N < static_cast<double>(p.min_bytes)) {
    return in + std::min(ring_across, rd_allreduce(H, N / L, across));
  }
  const double chunks =
      std::clamp(N / static_cast<double>(p.chunk_bytes), 1.0, static_cast<double>(p.max_chunks));
  return std::max(in, ring_across) + std::min(in, ring_across) / chunks +
         (chunks - 1) * std::max(inside.a, across.a);
}

}  // namespace cohort::alpha_beta
