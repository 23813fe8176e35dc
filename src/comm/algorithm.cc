// The one place a call's algorithm is chosen (see algorithm.h).
#include "algorithm.h"

#include <string>

#include "cohort/core/error.h"

namespace cohort::comm::detail {

namespace {

// What each collective can run, in the order the cost model lists them.
struct Offer {
  Collective coll;
  Algo algos[5];
  int n;
};
constexpr Offer kOffers[] = {
    {Collective::allreduce,
     {Algo::ring, Algo::recursive_doubling, Algo::rabenseifner, Algo::hierarchical, Algo::shared},
     5},
    {Collective::reduce_scatter, {Algo::ring, Algo::shared}, 2},
    {Collective::allgather, {Algo::ring, Algo::recursive_doubling, Algo::shared}, 3},
    {Collective::broadcast, {Algo::tree, Algo::ring}, 2},
    {Collective::reduce, {Algo::tree, Algo::ring}, 2},
    {Collective::alltoall, {Algo::direct}, 1},
    {Collective::gather, {Algo::direct}, 1},
    {Collective::scatter, {Algo::direct}, 1},
    {Collective::sendrecv, {Algo::direct}, 1},
    {Collective::barrier, {Algo::direct}, 1},
};

const Offer& offer(Collective c) {
  for (const Offer& o : kOffers) {
    if (o.coll == c) return o;
  }
  COHORT_THROW("no algorithms for collective " << static_cast<int>(c));
}

std::string offered(Collective c) {
  const Offer& o = offer(c);
  std::string s;
  for (int i = 0; i < o.n; ++i) s += std::string(i ? ", " : "") + algo_name(o.algos[i]);
  return s;
}

// Empty when algorithm a can run collective c on this group; else what it needs.
std::string cannot_run(Collective c, Algo a, const Topology& t, bool shared_memory) {
  if (a == Algo::shared && (t.num_hosts != 1 || t.net_everywhere || !shared_memory)) {
    return "it needs one host's ranks over shared memory, and memory from alloc_shared; this "
           "group has " +
           std::to_string(t.num_hosts) + " host(s)" +
           (t.net_everywhere ? ", linked by the network" : "") +
           (shared_memory ? "" : ", and no shared memory was allocated");
  }
  if (a == Algo::hierarchical && (t.num_hosts < 2 || !t.uniform_hosts())) {
    std::string per_host;
    for (int h = 0; h < t.num_hosts; ++h) {
      per_host += (h ? "/" : "") + std::to_string(t.ranks_on_host(h));
    }
    return "it needs ranks on at least two hosts, the same number on each; this group has " +
           std::to_string(t.num_hosts) + " host(s) with " + per_host + " rank(s)";
  }
  if (c == Collective::allgather && a == Algo::recursive_doubling && (t.world & (t.world - 1))) {
    return "it needs a power-of-two number of ranks; this group has " + std::to_string(t.world);
  }
  return {};
}

}  // namespace

bool has_algorithm(Collective c, Algo a) {
  const Offer& o = offer(c);
  for (int i = 0; i < o.n; ++i) {
    if (o.algos[i] == a) return true;
  }
  return false;
}

AlgoChoice choose_algorithm(Collective c, size_t bytes, Algo forced, Algo policy, const Topology& t,
                            bool shared_memory) {
  if (forced != Algo::automatic) {
    if (!has_algorithm(c, forced)) {
      COHORT_THROW(collective_name(c) << " has no algorithm '" << algo_name(forced)
                                      << "' (it has: " << offered(c) << ")");
    }
    const std::string why = cannot_run(c, forced, t, shared_memory);
    if (!why.empty()) {
      COHORT_THROW(collective_name(c)
                   << " cannot run the forced algorithm '" << algo_name(forced) << "': " << why);
    }
    return {forced, "forced by the call"};
  }
  if (policy != Algo::automatic && has_algorithm(c, policy)) {
    const std::string why = cannot_run(c, policy, t, shared_memory);
    if (!why.empty()) {
      COHORT_THROW(collective_name(c)
                   << " cannot run COHORT_ALGO=" << algo_name(policy) << ": " << why);
    }
    return {policy, "COHORT_ALGO"};
  }
  const Offer& o = offer(c);
  if (o.n == 1) return {o.algos[0], "the only algorithm"};
  if (has_algorithm(c, Algo::shared) && t.world > 1 && bytes >= kSharedMinBytes &&
      cannot_run(c, Algo::shared, t, shared_memory).empty()) {
    return {Algo::shared, "shared memory allocated (ring where a rank's buffers lie outside it)"};
  }
  // The cost model offers only what can run on this group's shape.
  return {choose(c, t, bytes), "cost model"};
}

}  // namespace cohort::comm::detail
