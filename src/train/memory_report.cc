// The memory report at the end of cohort train and cohort bench train: every rank's figures by
// category (dist::MemoryReport), gathered to every rank, printed as a table and written to the
// JSON; the run-time --max-memory check over the same figures.
#include <iterator>

#include "cohort/core/error.h"
#include "cohort/train/metrics.h"
#include "run.h"

namespace cohort::train {

int state_bytes(const std::string& optimizer, float momentum) {
  if (optimizer == "adamw") return 8;
  if (optimizer == "lars") return 4;
  return momentum != 0 ? 4 : 0;
}

std::vector<dist::MemoryReport> gather_memory(const nn::Model& m, dist::DataParallel* dp,
                                              const nn::Optimizer& opt, comm::Communicator* world,
                                              const dist::StepMemory* steps) {
  dist::MemoryReport r;
  if (dp) {
    r = dp->memory(opt);
  } else {  // one process: the whole model state (the allocator's figures need a DataParallel)
    r.psi = m.num_parameters();
    r.parameters = r.gradients =
        static_cast<size_t>(const_cast<nn::Model&>(m).flat_values().numel()) * sizeof(float);
    dist::add_optimizer_state(r, opt);
    if (steps) {
      r.activations = steps->peak();
      r.allocator_cache = steps->cache();
    }
  }
  return gather_reports(r, world);
}

std::vector<dist::MemoryReport> gather_reports(dist::MemoryReport r, comm::Communicator* world) {
  r.peak_rss = peak_rss_bytes();
  if (!world) return {r};
  // The byte counts, in one order for packing and unpacking; then ranks, psi and K.
  using M = dist::MemoryReport;
  static constexpr size_t M::*kBytes[] = {
      &M::parameters,  &M::gradients,    &M::optimizer,       &M::gathered, &M::gradients_in_flight,
      &M::activations, &M::comm_buffers, &M::allocator_cache, &M::peak_rss};
  constexpr size_t n = std::size(kBytes), k = n + 3;
  std::vector<double> mine;
  for (size_t M::*f : kBytes) mine.push_back(static_cast<double>(r.*f));
  mine.insert(mine.end(), {static_cast<double>(r.ranks), static_cast<double>(r.psi),
                           static_cast<double>(r.state_bytes)});
  std::vector<double> all(k * static_cast<size_t>(world->size()));
  world->allgather(mine.data(), all.data(), k, comm::DataType::f64).wait();
  std::vector<M> out;
  for (int i = 0; i < world->size(); ++i) {
    const double* v = all.data() + k * static_cast<size_t>(i);
    M m;
    m.mode = r.mode;
    for (size_t j = 0; j < n; ++j) m.*kBytes[j] = static_cast<size_t>(v[j]);
    m.ranks = static_cast<int>(v[n]);
    m.psi = static_cast<int64_t>(v[n + 1]);
    m.state_bytes = static_cast<int>(v[n + 2]);
    out.push_back(m);
  }
  return out;
}

nlohmann::json memory_json(const std::vector<dist::MemoryReport>& ranks) {
  nlohmann::json a = nlohmann::json::array();
  for (const dist::MemoryReport& m : ranks) {
    a.push_back({{"mode", dist::shard_name(m.mode)},
                 {"shard_ranks", m.ranks},
                 {"parameter_elements", m.psi},
                 {"optimizer_state_bytes_per_element", m.state_bytes},
                 {"parameters", m.parameters},
                 {"gradients", m.gradients},
                 {"optimizer_state", m.optimizer},
                 {"model_state", m.model_state()},
                 {"model_state_formula", m.formula()},
                 {"gathered_peak", m.gathered},
                 {"gradients_in_flight_peak", m.gradients_in_flight},
                 {"activations_peak", m.activations},
                 {"comm_buffers_peak", m.comm_buffers},
                 {"allocator_cache_peak", m.allocator_cache},
                 {"total", m.total()},
                 {"peak_rss", m.peak_rss}});
  }
  return a;
}

void check_memory_cap(const std::vector<dist::MemoryReport>& ranks, uint64_t cap, int64_t step) {
  if (cap == 0) return;
  for (size_t r = 0; r < ranks.size(); ++r) {
    // What the kernel saw counts too: it is what an out-of-memory kill would look at.
    const size_t used = std::max(ranks[r].total(), ranks[r].peak_rss);
    COHORT_CHECK(used <= cap, "rank " << r << " used " << used / (1 << 20) << " MiB at step "
                                      << step << ", over --max-memory " << cap / (1 << 20)
                                      << " MiB; stopping before "
                                      << "the kernel does:\n"
                                      << dist::memory_table(ranks));
  }
}

}  // namespace cohort::train
