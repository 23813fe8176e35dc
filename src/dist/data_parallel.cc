// The modes by name, the agreement check before anything is built, the memory report and the
// up-front fit check.
#include "cohort/dist/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/hash.h"
#include "cohort/dist/ddp.h"
#include "sharded.h"

namespace cohort::dist {

namespace {

constexpr Shard kShards[] = {Shard::none, Shard::zero1, Shard::zero2, Shard::zero3, Shard::hybrid};

// What every rank must agree on, as numbers: mode, options, and the model's units.
std::vector<int64_t> fingerprint(const nn::Model& m, const DdpOptions& o) {
  uint64_t h = fnv1a64(m.name());
  for (const nn::Unit& u : m.units()) {
    h = fnv1a64(u.name, h);
    h ^= static_cast<uint64_t>(u.last - u.first) * 0x9e3779b97f4a7c15ull;
  }
  return {static_cast<int64_t>(o.shard),
          static_cast<int64_t>(o.compression),
          o.reshard_after_forward ? 1 : 0,
          o.accumulate_locally ? 1 : 0,
          static_cast<int64_t>(m.units().size()),
          m.num_parameters(),
          static_cast<int64_t>(h & 0x7fffffffffffffffull)};
}

std::string describe_fingerprint(const std::vector<int64_t>& f) {
  std::ostringstream os;
  os << "--shard " << shard_name(static_cast<Shard>(f[0])) << ", --reduce-dtype "
     << compression_name(static_cast<Compression>(f[1])) << ", reshard-after-forward "
     << (f[2] ? "true" : "false") << ", accumulate-locally " << (f[3] ? "true" : "false") << ", "
     << f[4] << " units, " << f[5] << " parameters (units digest " << std::hex << f[6] << ")";
  return os.str();
}

size_t mib(size_t bytes) {
  return (bytes + (1 << 19)) >> 20;
}

}  // namespace

const char* shard_name(Shard s) {
  switch (s) {
    case Shard::none:
      return "none";
    case Shard::zero1:
      return "zero1";
    case Shard::zero2:
      return "zero2";
    case Shard::zero3:
      return "zero3";
    case Shard::hybrid:
      return "hybrid";
  }
  return "invalid";
}

Shard parse_shard(const std::string& s) {
  for (Shard m : kShards)
    if (s == shard_name(m)) return m;
  COHORT_THROW("shard mode '" << s << "' (known: none, zero1, zero2, zero3, hybrid)");
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::none:
      return "f32";
    case Compression::bf16:
      return "bf16";
    case Compression::f16:
      return "f16";
  }
  return "invalid";
}

Compression parse_compression(const std::string& s) {
  for (Compression c : {Compression::none, Compression::bf16, Compression::f16}) {
    if (s == compression_name(c)) return c;
  }
  COHORT_THROW("reduce dtype '" << s << "' (known: f32, bf16, f16)");
}

ModelState zero_model_state(Shard mode, double psi, double k, double n) {
  ModelState s{4 * psi, 4 * psi, k * psi};
  if (mode == Shard::none) return s;
  s.optimizer /= n;
  if (mode == Shard::zero1) return s;
  s.gradients /= n;
  if (mode == Shard::zero2) return s;
  s.parameters /= n;  // zero3, hybrid
  return s;
}

double MemoryReport::formula() const {
  return zero_model_state(mode, static_cast<double>(psi), state_bytes, ranks).total();
}

void add_optimizer_state(MemoryReport& r, const nn::Optimizer& opt) {
  // state() hands out the tensors for loading too; counting them changes nothing.
  for (auto& [name, t] : const_cast<nn::Optimizer&>(opt).state()) r.optimizer += t->bytes();
  r.state_bytes = static_cast<int>(opt.state_bytes_per_element());
}

MemoryReport DataParallel::memory(const nn::Optimizer& opt) const {
  MemoryReport r = held();
  add_optimizer_state(r, opt);
  r.activations = step_memory_.peak();
  r.allocator_cache = step_memory_.cache();
  return r;
}

std::unique_ptr<DataParallel> make_data_parallel(nn::Model& m,
                                                 std::shared_ptr<comm::Communicator> c,
                                                 const DdpOptions& o) {
  // Ranks that disagree would build different engines and wait on each other forever: compare
  // first, and name both sides.
  const std::vector<int64_t> mine = fingerprint(m, o);
  const size_t k = mine.size();
  std::vector<int64_t> all(k * static_cast<size_t>(c->size()));
  c->allgather(mine.data(), all.data(), k, comm::DataType::i64).wait();
  auto of = [&](int r) {
    return std::vector<int64_t>(all.begin() + static_cast<std::ptrdiff_t>(r * k),
                                all.begin() + static_cast<std::ptrdiff_t>((r + 1) * k));
  };
  const std::vector<int64_t> first = of(0);
  for (int r = 1; r < c->size(); ++r) {
    const std::vector<int64_t> theirs = of(r);
    COHORT_CHECK(theirs == first, "ranks disagree on data parallelism: rank 0 runs "
                                      << describe_fingerprint(first) << "; rank " << r << " runs "
                                      << describe_fingerprint(theirs));
  }
  if (o.shard == Shard::none) {
    auto d = std::make_unique<Ddp>(m, c, o);
    d->broadcast_from_rank0();
    return d;
  }
  return std::make_unique<Sharded>(m, std::move(c), o);
}

std::string memory_table(const std::vector<MemoryReport>& ranks) {
  if (ranks.empty()) return "";
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof(line), "%-24s", "memory per rank (MiB)");
  os << line;
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::snprintf(line, sizeof(line), " %9s", ("rank " + std::to_string(r)).c_str());
    os << line;
  }
  os << "\n";
  auto row = [&](const char* name, auto get) {
    std::snprintf(line, sizeof(line), "%-24s", name);
    os << line;
    for (const MemoryReport& m : ranks) {
      std::snprintf(line, sizeof(line), " %9zu", mib(get(m)));
      os << line;
    }
    os << "\n";
  };
  row("parameters", [](const MemoryReport& m) { return m.parameters; });
  row("gradients", [](const MemoryReport& m) { return m.gradients; });
  row("optimizer state", [](const MemoryReport& m) { return m.optimizer; });
  row("= model state", [](const MemoryReport& m) { return m.model_state(); });
  row("  ZeRO formula", [](const MemoryReport& m) { return static_cast<size_t>(m.formula()); });
  row("gathered units (peak)", [](const MemoryReport& m) { return m.gathered; });
  row("grads in flight (peak)", [](const MemoryReport& m) { return m.gradients_in_flight; });
  row("activations (peak)", [](const MemoryReport& m) { return m.activations; });
  row("comm buffers (peak)", [](const MemoryReport& m) { return m.comm_buffers; });
  row("allocator cache (peak)", [](const MemoryReport& m) { return m.allocator_cache; });
  row("= total", [](const MemoryReport& m) { return m.total(); });
  row("peak RSS (kernel)", [](const MemoryReport& m) { return m.peak_rss; });
  return os.str();
}

void check_fits(const nn::Model& m, int world, int local_world, Shard mode, int state_bytes,
                const DdpOptions& o, size_t max_bytes) {
  if (max_bytes == 0) return;
  const double psi = static_cast<double>(m.num_parameters());
  size_t largest = 0;
  for (const nn::Unit& u : m.units()) largest = std::max(largest, u.end - u.begin);
  auto estimate = [&](Shard s, std::ostringstream* os) {
    const int n = world == 1 ? 1 : s == Shard::hybrid ? std::max(1, local_world) : world;
    const ModelState state = zero_model_state(world == 1 ? Shard::none : s, psi, state_bytes, n);
    double gathered = 0, comm = 0;
    if (world > 1 && s != Shard::none) {
      // zero3's pool: the unit in use, its gradients and the prefetched units.
      if (s == Shard::zero3 || s == Shard::hybrid) {
        gathered = 4.0 * static_cast<double>(largest) * (2 + o.max_prefetch);
      }
      comm = 4.0 * static_cast<double>(largest);
    } else if (world > 1) {
      comm = o.bucket_mb * (1 << 20);
    }
    const double total = state.total() + gathered + comm;
    if (os) {
      *os << shard_name(s) << ": parameters " << mib(static_cast<size_t>(state.parameters))
          << " MiB, gradients " << mib(static_cast<size_t>(state.gradients))
          << " MiB, optimizer state " << mib(static_cast<size_t>(state.optimizer))
          << " MiB, gathered units " << mib(static_cast<size_t>(gathered)) << " MiB, communication "
          << mib(static_cast<size_t>(comm)) << " MiB = " << mib(static_cast<size_t>(total))
          << " MiB before activations";
    }
    return total;
  };
  if (estimate(mode, nullptr) <= static_cast<double>(max_bytes)) return;
  std::ostringstream os;
  os << m.name() << " does not fit --max-memory " << mib(max_bytes) << " MiB per rank with --shard "
     << shard_name(mode) << " on " << world << " rank(s): ";
  estimate(mode, &os);
  std::string fit;
  for (Shard s : kShards) {
    if (s == mode || (world == 1 && s != Shard::none)) continue;
    if (s == Shard::hybrid && (local_world <= 1 || local_world == world)) continue;
    if (estimate(s, nullptr) <= static_cast<double>(max_bytes)) {
      std::ostringstream e;
      estimate(s, &e);
      fit += "\n  " + e.str();
    }
  }
  os << (fit.empty() ? "; no mode fits on this many ranks" : "; modes that would fit:" + fit);
  COHORT_THROW(os.str());
}

}  // namespace cohort::dist
