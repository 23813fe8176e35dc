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
constexpr double kGiB = 1024.0 * 1024 * 1024;

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
// rank's share of its node's NICs when every local rank sends at once.
struct Links {
  ab::Costs inside, across;
  int local = 1, nodes = 1;
};

Links links_of(const Cluster& c, int nodes) {
  Links k;
  k.local = c.accelerators_per_node;
  k.nodes = nodes;
  k.inside = ab::costs(c.intra.latency_us, c.intra.gbytes_per_s, c.reduce_gbytes_per_s);
  const double node_bw = c.nic.gbytes_per_s * c.nics_per_node;
  k.across = ab::costs(c.nic.latency_us, node_bw / k.local, c.reduce_gbytes_per_s);
  return k;
}

// Collective times in ms over all ranks (hierarchical across nodes), `bytes` the whole buffer.
double allreduce_ms(const Links& k, double bytes) {
  if (k.nodes == 1) return ab::ring_allreduce(k.local, bytes, k.inside) / 1e3;
  const double flat = ab::ring_allreduce(k.local * k.nodes, bytes, k.across);
  const double hier = ab::hierarchical_allreduce(k.local, k.nodes, bytes, k.inside, k.across);
  return std::min(flat, hier) / 1e3;
}
double reduce_scatter_ms(const Links& k, double bytes) {
  return (ab::ring_reduce_scatter(k.local, bytes, k.inside) +
          ab::ring_reduce_scatter(k.nodes, bytes / k.local, k.across)) /
         1e3;
}
double allgather_ms(const Links& k, double bytes) {
  return (ab::ring_allgather(k.local, bytes, k.inside) +
          ab::ring_allgather(k.nodes, bytes / k.local, k.across)) /
         1e3;
}
// Hybrid: reduce-scatter inside the node, allreduce of the node's shard across nodes.
double hybrid_reduce_ms(const Links& k, double bytes) {
  return (ab::ring_reduce_scatter(k.local, bytes, k.inside) +
          ab::ring_allreduce(k.nodes, bytes / k.local, k.across)) /
         1e3;
}
double hybrid_gather_ms(const Links& k, double bytes) {
  return ab::ring_allgather(k.local, bytes, k.inside) / 1e3;
}

// One group of gradients that is reduced together: ready when backward has produced it.
struct Group {
  double bytes = 0;  // gradient bytes on the wire
  double ready = 0;  // ms after backward starts
};

// Runs reductions on one link in issue order (Cohort runs a communicator's calls one at a
// time); returns when the last ends, and adds the busy time to `busy`.
double run_link(const std::vector<Group>& groups, double start,
                double (*cost)(const Links&, double), const Links& k, double* busy) {
  double free = start;
  for (const Group& g : groups) {
    const double t = cost(k, g.bytes);
    free = std::max(free, g.ready) + t;
    *busy += t;
  }
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

  // The communicating micro-batch: backward starts at 0; `end` is when its last reduction ends.
  double busy = 0, exposed = 0;
  auto reductions = [&]() {
    double b = 0, end = 0;
    if (single) return 0.0;
    switch (s.mode) {
      case Mode::ddp:
        end = run_link(st.buckets, 0, allreduce_ms, k, &b);
        break;
      case Mode::zero1:
      case Mode::zero2:
        end = run_link(unit_groups(st, gb), 0, reduce_scatter_ms, k, &b);
        break;
      case Mode::zero3: {
        // Backward in reverse unit order on one link, in issue order: a unit is gathered again
        // (when resharded after forward) before its backward, prefetched as the unit after it
        // starts, and reduce-scattered when its backward ends. Waits for gathers stretch the
        // backward itself, and count as exposed.
        const size_t U = st.unit_params.size();
        auto gather = [&](size_t i) {
          return s.reshard_after_forward ? allgather_ms(k, st.unit_params[i] * 4) : 0.0;
        };
        double free = gather(U - 1), t = 0;
        b += free;
        std::vector<double> ready(U, 0);
        ready[U - 1] = free;
        for (size_t i = U; i-- > 0;) {
          const double start = std::max(t, ready[i]);
          if (i > 0) {
            const double g = gather(i - 1);
            free = std::max(free, start) + g;
            b += g;
            ready[i - 1] = free;
          }
          t = start + st.unit_backward[i];
          if (st.unit_params[i] > 0) {
            const double rs = reduce_scatter_ms(k, st.unit_params[i] * gb);
            free = std::max(free, t) + rs;
            b += rs;
          }
        }
        end = std::max(free, t);
        break;
      }
      case Mode::hybrid:
        end = run_link(unit_groups(st, gb), 0, hybrid_reduce_ms, k, &b);
        break;
    }
    busy += b;
    return std::max(0.0, end - st.backward);
  };
  const bool every_micro = s.mode != Mode::ddp && !(s.accum > 1 && s.accum_local);
  exposed = reductions();
  if (every_micro && s.accum > 1) {
    busy *= s.accum;
    exposed *= s.accum;
  }
  // After the update: zero1/2 (and hybrid, inside the node) issue every unit's gather at once
  // and the next forward waits for each unit when it first reads it; zero3 gathers each unit
  // before its forward, prefetched one ahead of the compute.
  auto gathered_forward = [&](double (*cost)(const Links&, double)) {
    double free = 0, t = 0;
    for (size_t i = 0; i < st.unit_params.size(); ++i) {
      free += cost(k, st.unit_params[i] * 4);
      t = std::max(t, free) + st.unit_forward[i];
    }
    exposed += t - st.forward;
    return free;
  };
  if (!single) {
    double after = 0;
    switch (s.mode) {
      case Mode::ddp:
        break;
      case Mode::zero1:
      case Mode::zero2:
        after = gathered_forward(allgather_ms);
        break;
      case Mode::hybrid:
        after = gathered_forward(hybrid_gather_ms);
        break;
      case Mode::zero3: {
        // Forward: unit 0 gathered first, each next one prefetched as the previous starts.
        const size_t U = st.unit_params.size();
        double free = allgather_ms(k, st.unit_params[0] * 4), t = 0;
        after = free;
        double ready = free;
        for (size_t i = 0; i < U; ++i) {
          const double start = std::max(t, ready);
          if (i + 1 < U) {
            const double g = allgather_ms(k, st.unit_params[i + 1] * 4);
            free = std::max(free, start) + g;
            after += g;
            ready = free;
          }
          t = start + st.unit_forward[i];
        }
        exposed += (t - st.forward) * s.accum;  // every micro-batch's forward gathers
        after *= s.accum;
        break;
      }
    }
    busy += after;
  }
  r.compute_ms = s.accum * micro + update + c.step_overhead_ms;
  r.communication_ms = busy;
  r.exposed_comm_ms = exposed;
  if (r.world > 1) {
    r.straggler_ms =
        c.step_jitter * std::sqrt(2 * std::log(static_cast<double>(r.world))) * s.accum * micro;
  }
  double step = r.compute_ms + r.straggler_ms + exposed;

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
  } else if (r.exposed_comm_ms > 0.05 * step) {
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
