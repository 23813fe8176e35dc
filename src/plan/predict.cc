// The prediction of one step: compute per layer (roofline: FLOPs over the accelerator's
// reachable rate, or bytes over its memory bandwidth, whichever is slower; or the profile's
// measured time), communication priced by the alpha-beta formulas that comm uses
// (core/alpha_beta.h) and overlapped with backward event by event, memory by the ZeRO
// accounting, and the input pipeline's rate against what the accelerators consume.
#include <algorithm>
#include <cmath>

#include "cohort/core/alpha_beta.h"
#include "cohort/core/error.h"
#include "cohort/plan/plan.h"

namespace cohort::plan {

namespace ab = alpha_beta;

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::ddp:
      return "ddp";
    case Mode::zero1:
      return "zero1";
    case Mode::zero2:
      return "zero2";
    case Mode::zero3:
      return "zero3";
    case Mode::hybrid:
      return "hybrid";
  }
  return "ddp";
}

Mode parse_mode(const std::string& s) {
  for (Mode m : {Mode::ddp, Mode::zero1, Mode::zero2, Mode::zero3, Mode::hybrid}) {
    if (s == mode_name(m)) return m;
  }
  if (s == "none") return Mode::ddp;
  COHORT_THROW("unknown mode '" << s << "' (ddp, zero1, zero2, zero3, hybrid)");
}

double Memory::total() const {
  return parameters + gradients + optimizer + gathered + activations + buffers;
}

namespace {

constexpr double kMB = 1e6;

int state_bytes(const std::string& optimizer) {
  if (optimizer == "adamw") return 8;
  if (optimizer == "sgd" || optimizer == "lars") return 4;
  COHORT_THROW("unknown optimizer '" << optimizer << "' (sgd, adamw, lars)");
}

// Forward and backward time of one layer for `batch` images, in ms.
struct LayerTime {
  double forward = 0, backward = 0;
};

LayerTime layer_time(const Layer& l, const Accelerator& a, bool bf16, int batch) {
  if (l.measured_ms >= 0) {  // measured forward + backward; backward costs twice forward
    return {l.measured_ms * batch / 3, l.measured_ms * batch * 2 / 3};
  }
  const double flops_per_ms = (bf16 ? a.bf16_tflops : a.f32_tflops) * 1e9 * a.compute_efficiency;
  const double bytes_per_ms = a.memory_gbs * 1e6 * a.memory_efficiency;
  const double elem = bf16 ? 2 : 4;
  const bool compute_bound = l.kind == LayerKind::conv || l.kind == LayerKind::linear;
  const double by_flops = compute_bound ? l.forward_flops * batch / flops_per_ms : 0;
  const double by_bytes = l.moved_elements * elem * batch / bytes_per_ms;
  const double f = std::max(by_flops, by_bytes);
  return {f, 2 * f};
}

// Links as the formulas see them: inside a node (per accelerator), and across nodes as one
// rank's share of its node's NICs when every local rank sends at once; and the CPU time per byte
// a rank moves over each (Link::cpu_ns_per_byte).
struct Links {
  ab::Costs inside, across;
  double inside_cpu = 0, across_cpu = 0;  // ms per byte sent or received
  int local = 1, nodes = 1;
};

Links links_of(const Cluster& c, int nodes) {
  Links k;
  k.local = c.accelerators_per_node;
  k.nodes = nodes;
  k.inside = ab::costs(c.intra.latency_us, c.intra.gbytes_per_s, c.reduce_gbytes_per_s);
  const double node_bw = c.nic.gbytes_per_s * c.nics_per_node;
  k.across = ab::costs(c.nic.latency_us, node_bw / k.local, c.reduce_gbytes_per_s);
  k.inside_cpu = c.intra.cpu_ns_per_byte / 1e6;
  k.across_cpu = c.nic.cpu_ns_per_byte / 1e6;
  return k;
}

// One collective: how long the link is busy, and the CPU time one rank spends moving its bytes.
struct Cost {
  double ms = 0, cpu_ms = 0;
};

// Bytes one rank sends and receives in a ring reduce-scatter or allgather of `bytes` over n
// ranks; an allreduce moves twice as many.
double ring_moved(int n, double bytes) {
  return 2.0 * (n - 1) / n * bytes;
}

// Collectives over all ranks (hierarchical across nodes), `bytes` the whole buffer.
Cost allreduce_cost(const Links& k, double bytes) {
  if (k.nodes == 1) {
    return {ab::ring_allreduce(k.local, bytes, k.inside) / 1e3,
            2 * ring_moved(k.local, bytes) * k.inside_cpu};
  }
  const double flat = ab::ring_allreduce(k.local * k.nodes, bytes, k.across);
  const double hier = ab::hierarchical_allreduce(k.local, k.nodes, bytes, k.inside, k.across);
  if (hier <= flat) {
    return {hier / 1e3, 2 * ring_moved(k.local, bytes) * k.inside_cpu +
                            2 * ring_moved(k.nodes, bytes / k.local) * k.across_cpu};
  }
  // A flat ring ordered by node: one hop in `local` leaves the node.
  const double moved = 2 * ring_moved(k.local * k.nodes, bytes);
  return {flat / 1e3, moved * (k.across_cpu + (k.local - 1) * k.inside_cpu) / k.local};
}
// A reduce-scatter or an allgather (`ring`): a ring inside the node, then one across nodes on
// each node's share.
Cost two_level(const Links& k, double bytes, double (*ring)(int, double, ab::Costs)) {
  return {(ring(k.local, bytes, k.inside) + ring(k.nodes, bytes / k.local, k.across)) / 1e3,
          ring_moved(k.local, bytes) * k.inside_cpu +
              ring_moved(k.nodes, bytes / k.local) * k.across_cpu};
}
Cost reduce_scatter_cost(const Links& k, double bytes) {
  return two_level(k, bytes, ab::ring_reduce_scatter);
}
Cost allgather_cost(const Links& k, double bytes) {
  return two_level(k, bytes, ab::ring_allgather);
}
// Hybrid: reduce-scatter inside the node, allreduce of the node's shard across nodes.
Cost hybrid_reduce_cost(const Links& k, double bytes) {
  return {(ab::ring_reduce_scatter(k.local, bytes, k.inside) +
           ab::ring_allreduce(k.nodes, bytes / k.local, k.across)) /
              1e3,
          ring_moved(k.local, bytes) * k.inside_cpu +
              2 * ring_moved(k.nodes, bytes / k.local) * k.across_cpu};
}
Cost hybrid_gather_cost(const Links& k, double bytes) {
  return {ab::ring_allgather(k.local, bytes, k.inside) / 1e3,
          ring_moved(k.local, bytes) * k.inside_cpu};
}

// One group of gradients that is reduced together: ready when backward has produced it.
struct Group {
  double bytes = 0;  // gradient bytes on the wire
  double ready = 0;  // ms after backward starts
};

// What a phase's communication adds up to: the link's busy time, and the CPU time it takes from
// compute that runs until `until` (a collective's CPU work spread evenly over its time on the
// link; the part after `until` falls while the rank only waits).
struct Usage {
  double until = 0;
  double busy = 0, cpu = 0;
  // The collective `c` on the link from `start`; returns when it ends.
  double add(const Cost& c, double start) {
    busy += c.ms;
    const double end = start + c.ms;
    if (c.ms > 0) cpu += c.cpu_ms * std::clamp((until - start) / c.ms, 0.0, 1.0);
    return end;
  }
};

// Runs reductions on one link in issue order (Cohort runs a communicator's calls one at a
// time); returns when the last ends.
double run_link(const std::vector<Group>& groups, double start, Cost (*cost)(const Links&, double),
                const Links& k, Usage* use) {
  double free = start;
  for (const Group& g : groups) free = use->add(cost(k, g.bytes), std::max(free, g.ready));
  return free;
}

struct Step {
  double forward = 0, backward = 0;
  std::vector<double> unit_forward, unit_backward;  // per unit, forward order
  std::vector<double> unit_params;                  // parameters per unit
  std::vector<Group> buckets;                       // DDP buckets, backward order
};

Step step_of(const ModelProfile& p, const Cluster& c, const Strategy& s) {
  Step st;
  const double grad_bytes = s.reduce_bf16 ? 2 : 4;
  const std::vector<std::string> units = p.units();
  st.unit_forward.assign(units.size(), 0);
  st.unit_backward.assign(units.size(), 0);
  st.unit_params.assign(units.size(), 0);
  size_t u = 0;
  std::vector<LayerTime> times;
  for (const Layer& l : p.layers) {
    while (units[u] != l.unit) ++u;
    LayerTime t = layer_time(l, c.accelerator, s.bf16, s.batch);
    times.push_back(t);
    st.forward += t.forward;
    st.backward += t.backward;
    st.unit_forward[u] += t.forward;
    st.unit_backward[u] += t.backward;
    st.unit_params[u] += static_cast<double>(l.parameters);
  }
  // DDP's buckets fill in backward order; each is ready when its last layer's backward ends.
  double t = 0, filled = 0;
  const double cap = s.bucket_mb * kMB;
  for (size_t i = p.layers.size(); i-- > 0;) {
    t += times[i].backward;
    filled += static_cast<double>(p.layers[i].parameters) * grad_bytes;
    if (filled >= cap) {
      st.buckets.push_back({filled, t});
      filled = 0;
    }
  }
  if (filled > 0) st.buckets.push_back({filled, t});
  return st;
}

// Per-unit groups in backward order, each ready when the unit's backward ends.
std::vector<Group> unit_groups(const Step& st, double bytes_per_param, double scale = 1) {
  std::vector<Group> g;
  double t = 0;
  for (size_t u = st.unit_params.size(); u-- > 0;) {
    t += st.unit_backward[u];
    if (st.unit_params[u] > 0) g.push_back({st.unit_params[u] * bytes_per_param * scale, t});
  }
  return g;
}

Memory memory_of(const ModelProfile& p, const Cluster& c, const Strategy& s, int world,
                 const Step& st) {
  const double P = static_cast<double>(p.parameters());
  const int local = c.accelerators_per_node;
  Memory m;
  double largest_unit = 0;
  for (double u : st.unit_params) largest_unit = std::max(largest_unit, u);
  const double state = state_bytes(s.optimizer);
  double saved = 0;
  for (const Layer& l : p.layers) saved += l.saved_elements;
  m.activations = saved * s.batch * (s.bf16 ? 2 : 4);
  const double shard = s.mode == Mode::hybrid ? local : world;
  switch (s.mode) {
    case Mode::ddp:
      m.parameters = 4 * P;
      m.gradients = 4 * P;
      m.optimizer = state * P;
      m.buffers = 2 * std::min(s.bucket_mb * kMB, 4 * P);  // buckets in flight
      break;
    case Mode::zero1:
      m.parameters = 4 * P;
      m.gradients = 4 * P;
      m.optimizer = state * P / shard;
      m.buffers = 2 * 4 * largest_unit;
      break;
    case Mode::zero2:
      m.parameters = 4 * P;
      m.gradients = s.accum > 1 && s.accum_local ? 4 * P : 4 * P / shard + 2 * 4 * largest_unit;
      m.optimizer = state * P / shard;
      m.buffers = 2 * 4 * largest_unit;
      break;
    case Mode::zero3:
    case Mode::hybrid:
      m.parameters = 4 * P / shard;
      m.gradients = s.accum > 1 && s.accum_local ? 4 * P : 4 * P / shard + 2 * 4 * largest_unit;
      m.optimizer = state * P / shard;
      // Gathered units: the one in use and the one prefetched; all of them between forward and
      // backward when they are not resharded after forward.
      m.gathered = s.reshard_after_forward ? 2 * 4 * largest_unit : 4 * P;
      m.buffers = 2 * 4 * largest_unit;
      break;
  }
  // The accelerator's memory less its runtime's context (about 1 GiB), 5% kept for the allocator.
  m.capacity = std::max(0.0, c.accelerator.memory_gib * kGiB - kGiB) * 0.95;
  return m;
}

}  // namespace

// One accelerator alone: images/s with no communication and no input limit.
double alone_images_per_s(const ModelProfile& p, const Cluster& c, const Strategy& s) {
  const Step st = step_of(p, c, s);
  const double P = static_cast<double>(p.parameters());
  const double update = P * (12 + 2 * state_bytes(s.optimizer)) /
                        (c.accelerator.memory_gbs * 1e6 * c.accelerator.memory_efficiency);
  const double ms = s.accum * (st.forward + st.backward) + update + c.step_overhead_ms;
  return s.batch * s.accum / ms * 1e3;
}

Cluster match_throughput(const ModelProfile& p, Cluster c, const Strategy& s, double images_per_s) {
  COHORT_CHECK(images_per_s > 0,
               "single-accelerator throughput " << images_per_s << " images/s: expected > 0");
  // Only the compute peak moves: the memory-bound layers, the optimizer and the overhead keep
  // the time the cluster's memory figures give them, so the rounds converge on the rest.
  for (int i = 0; i < 40; ++i) {
    const double f = alone_images_per_s(p, c, s) / images_per_s;
    c.accelerator.f32_tflops /= f;
    c.accelerator.bf16_tflops /= f;
    if (std::abs(f - 1) < 1e-9) break;
  }
  const double got = alone_images_per_s(p, c, s);
  COHORT_CHECK(std::isfinite(c.accelerator.f32_tflops) && std::abs(got / images_per_s - 1) < 0.01,
               p.model << " at " << images_per_s << " images/s per accelerator cannot be matched: "
                       << "its memory-bound layers and optimizer alone run it at " << got
                       << " images/s with " << c.accelerator.memory_gbs
                       << " GB/s of memory (or its profile has measured times)");
  return c;
}

Prediction predict(const ModelProfile& p, const Cluster& c, const Strategy& s, int nodes) {
  COHORT_CHECK(nodes >= 1, "nodes " << nodes << ": expected >= 1");
  COHORT_CHECK(s.batch >= 1 && s.accum >= 1,
               "batch " << s.batch << ", accum " << s.accum << ": expected >= 1");
  COHORT_CHECK(s.bucket_mb > 0, "bucket " << s.bucket_mb << " MB: expected > 0");
  COHORT_CHECK(!p.layers.empty(), "profile of " << p.model << " has no layers");
  Prediction r;
  r.nodes = nodes;
  r.world = nodes * c.accelerators_per_node;
  r.global_batch = r.world * s.batch * s.accum;
  const Links k = links_of(c, nodes);
  const Step st = step_of(p, c, s);
  const double P = static_cast<double>(p.parameters());
  const double gb = s.reduce_bf16 ? 2 : 4;
  const bool single = r.world == 1;
  const double shard = s.mode == Mode::hybrid ? c.accelerators_per_node : r.world;
  const double update_shard = s.mode == Mode::ddp ? 1 : shard;
  const double update = P / update_shard * (12 + 2 * state_bytes(s.optimizer)) /
                        (c.accelerator.memory_gbs * 1e6 * c.accelerator.memory_efficiency);
  const double micro = st.forward + st.backward;

  // Each phase that communicates: the link's busy time, the CPU time its transfers take from
  // compute, and what neither compute nor that CPU time hides. A phase whose compute runs for
  // `compute` ms (waits for the link included) and whose link is busy until `link_end` lasts
  // max(compute + cpu, link_end): the transfers' CPU work stretches compute, and a link that
  // ends later than both is exposed.
  struct Phase {
    double busy = 0, cpu = 0, exposed = 0;
  };
  auto phase = [](const Usage& u, double compute, double link_end, double alone) {
    const double end = std::max(compute + u.cpu, link_end);
    return Phase{u.busy, u.cpu, std::max(0.0, end - alone - u.cpu)};
  };
  // The communicating micro-batch's backward, from 0.
  auto backward = [&]() -> Phase {
    Usage u{st.backward};
    switch (s.mode) {
      case Mode::ddp:
        return phase(u, st.backward, run_link(st.buckets, 0, allreduce_cost, k, &u), st.backward);
      case Mode::zero1:
      case Mode::zero2:
        return phase(u, st.backward, run_link(unit_groups(st, gb), 0, reduce_scatter_cost, k, &u),
                     st.backward);
      case Mode::hybrid:
        return phase(u, st.backward, run_link(unit_groups(st, gb), 0, hybrid_reduce_cost, k, &u),
                     st.backward);
      case Mode::zero3: {
        // Backward in reverse unit order on one link, in issue order: a unit is gathered again
        // (when resharded after forward) before its backward, prefetched as the unit after it
        // starts, and reduce-scattered when its backward ends. Waits for gathers stretch the
        // backward itself. Run twice: the first finds when compute ends (`until`).
        const size_t U = st.unit_params.size();
        auto run = [&](Usage* use, double* compute) {
          auto gather = [&](size_t i) {
            return s.reshard_after_forward ? allgather_cost(k, st.unit_params[i] * 4) : Cost{};
          };
          double free = use->add(gather(U - 1), 0), t = 0;
          std::vector<double> ready(U, 0);
          ready[U - 1] = free;
          for (size_t i = U; i-- > 0;) {
            const double start = std::max(t, ready[i]);
            if (i > 0) ready[i - 1] = free = use->add(gather(i - 1), std::max(free, start));
            t = start + st.unit_backward[i];
            if (st.unit_params[i] > 0) {
              free = use->add(reduce_scatter_cost(k, st.unit_params[i] * gb), std::max(free, t));
            }
          }
          *compute = t;
          return std::max(free, t);
        };
        double t = 0;
        Usage first{st.backward};
        run(&first, &t);
        u.until = t;
        const double end = run(&u, &t);
        return phase(u, t, end, st.backward);
      }
    }
    return {};
  };
  // The forward after the update: zero1/2 (and hybrid, inside the node) issue every unit's
  // gather at once and the forward waits for each unit when it first reads it; zero3 gathers
  // each unit before its forward, prefetched one ahead of the compute.
  auto forward = [&]() -> Phase {
    std::vector<double> done(st.unit_params.size());
    std::vector<Cost> costs(done.size());
    Cost (*cost)(const Links&, double) = nullptr;
    switch (s.mode) {
      case Mode::ddp:
        return {};
      case Mode::zero1:
      case Mode::zero2:
        cost = allgather_cost;
        break;
      case Mode::hybrid:
        cost = hybrid_gather_cost;
        break;
      case Mode::zero3: {
        const size_t U = st.unit_params.size();
        auto run = [&](Usage* use, double* compute) {
          double free = use->add(allgather_cost(k, st.unit_params[0] * 4), 0), t = 0;
          double ready = free;
          for (size_t i = 0; i < U; ++i) {
            const double start = std::max(t, ready);
            if (i + 1 < U) {
              ready = free =
                  use->add(allgather_cost(k, st.unit_params[i + 1] * 4), std::max(free, start));
            }
            t = start + st.unit_forward[i];
          }
          *compute = t;
          return std::max(free, t);
        };
        double t = 0;
        Usage first{st.forward}, u;
        run(&first, &t);
        u.until = t;
        const double end = run(&u, &t);
        return phase(u, t, end, st.forward);
      }
    }
    double free = 0, t = 0;
    for (size_t i = 0; i < done.size(); ++i) {
      costs[i] = cost(k, st.unit_params[i] * 4);
      done[i] = free += costs[i].ms;
      t = std::max(t, free) + st.unit_forward[i];
    }
    Usage u{t};
    for (size_t i = 0; i < done.size(); ++i) u.add(costs[i], done[i] - costs[i].ms);
    return phase(u, t, free, st.forward);
  };
  Phase back, fwd;
  if (!single) {
    back = backward();
    fwd = forward();
  }
  // Sharded modes reduce-scatter every micro-batch unless they accumulate locally; zero3
  // gathers for every micro-batch's forward.
  const bool every_micro = s.mode != Mode::ddp && !(s.accum > 1 && s.accum_local);
  const double back_times = every_micro ? s.accum : 1;
  const double fwd_times = s.mode == Mode::zero3 ? s.accum : 1;
  const double busy = back.busy * back_times + fwd.busy * fwd_times;
  const double exposed = back.exposed * back_times + fwd.exposed * fwd_times;
  r.comm_cpu_ms = back.cpu * back_times + fwd.cpu * fwd_times;
  r.compute_ms = s.accum * micro + update + c.step_overhead_ms;
  r.communication_ms = busy;
  r.exposed_comm_ms = exposed;
  if (r.world > 1) {
    r.straggler_ms =
        c.step_jitter * std::sqrt(2 * std::log(static_cast<double>(r.world))) * s.accum * micro;
  }
  double step = r.compute_ms + r.straggler_ms + r.comm_cpu_ms + exposed;

  // The input pipeline: what the node's accelerators consume against what it decodes.
  const int L = c.accelerators_per_node;
  r.images_needed_per_node = L * s.batch * s.accum / step * 1e3;
  r.images_decoded_per_node = s.gpu_decode && c.gpu_decode_per_accel > 0
                                  ? c.gpu_decode_per_accel * L
                                  : std::max(1, c.cpu_cores - L) * c.decode_per_core;
  r.cores_per_accelerator_needed = r.images_needed_per_node / c.decode_per_core / L;
  const double input_ms = L * s.batch * s.accum / r.images_decoded_per_node * 1e3;
  r.data_wait_ms = std::max(0.0, input_ms - step);
  step += r.data_wait_ms;
  r.step_ms = step;
  r.images_per_s = r.global_batch / step * 1e3;
  r.efficiency = r.images_per_s / (r.world * alone_images_per_s(p, c, s));
  if (r.data_wait_ms > std::max(r.exposed_comm_ms, 0.02 * step)) {
    r.bottleneck = "input pipeline";
  } else if (r.exposed_comm_ms + r.comm_cpu_ms > 0.05 * step) {
    r.bottleneck = "network";
  } else {
    r.bottleneck = "compute";
  }
  r.memory = memory_of(p, c, s, r.world, st);
  return r;
}

std::vector<Mode> modes_that_fit(const ModelProfile& p, const Cluster& c, const Strategy& s,
                                 int nodes) {
  std::vector<Mode> out;
  for (Mode m : {Mode::ddp, Mode::zero1, Mode::zero2, Mode::hybrid, Mode::zero3}) {
    Strategy t = s;
    t.mode = m;
    if (predict(p, c, t, nodes).memory.fits()) out.push_back(m);
  }
  return out;
}

}  // namespace cohort::plan
