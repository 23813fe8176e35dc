// `cohort bench comm`: an nccl-tests style sweep over message sizes for one collective,
// with optional checking of every result. Rank 0 prints the table and writes the JSON.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/comm/cost_model.h"
#include "cohort/comm/types.h"
#include "cohort/core/clock.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/settings.h"
#include "verbs.h"

namespace cohort::cli {

namespace {

using comm::DataType;
using comm::RedOp;

void put(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::f64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case DataType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DataType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::i64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::u8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

double get(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::f32:
      return static_cast<const float*>(p)[i];
    case DataType::f64:
      return static_cast<const double*>(p)[i];
    case DataType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::i32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::i64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::u8:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

// Small integers, so that sums and products are exact in every type.
double value(RedOp op, int rank, size_t i) {
  if (op == RedOp::prod) return 1.0 + static_cast<double>((static_cast<size_t>(rank) + i) % 2);
  return 1.0 + static_cast<double>((static_cast<size_t>(rank) * 3 + i) % 5);
}

double expected_reduction(DataType t, RedOp op, int n, size_t i) {
  double acc = value(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(op, r, i);
    switch (op) {
      case RedOp::sum:
      case RedOp::avg:
        acc += v;
        break;
      case RedOp::prod:
        acc *= v;
        break;
      case RedOp::min:
        acc = std::min(acc, v);
        break;
      case RedOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  bool integer = t == DataType::i32 || t == DataType::i64 || t == DataType::u8;
  if (t == DataType::u8) acc = static_cast<double>(static_cast<int64_t>(acc) & 0xff);
  if (op == RedOp::avg) acc = integer ? std::trunc(acc / n) : acc / n;
  return acc;
}

bool close_enough(DataType t, double got, double want) {
  double tol = 0;
  if (t == DataType::f16 || t == DataType::bf16) tol = 1e-2;
  if (t == DataType::f32) tol = 1e-6;
  if (t == DataType::f64) tol = 1e-12;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter" || op == "alltoall") return 1.0 * (n - 1) / n;
  return 1.0;
}

}  // namespace

Run add_bench_comm(CLI::App& app) {
  struct Opts {
    std::string op = "allreduce", dtype = "f32", redop = "sum", min_bytes = "8", max_bytes = "64M";
    double factor = 2;
    int iters = 20, warmup = 5, root = 0;
    bool check = false;
    bool blocking = false;
    bool shared = false;
    std::string json, algo = "auto";
  };
  auto o = std::make_shared<Opts>();
  app.add_option(
         "--op", o->op,
         "allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, gather, scatter")
      ->check(CLI::IsMember({"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                             "alltoall", "gather", "scatter"}));
  app.add_option("--dtype", o->dtype, "f32, f64, f16, bf16, i32, i64, u8");
  app.add_option("--redop", o->redop, "sum, prod, min, max, avg");
  app.add_option("--min-bytes", o->min_bytes, "Smallest size (K, M, G suffixes)");
  app.add_option("--max-bytes", o->max_bytes, "Largest size");
  app.add_option("--factor", o->factor, "Size multiplier between rows")
      ->check(CLI::Range(1.01, 1024.0));
  app.add_option("--iters", o->iters, "Timed iterations per size")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", o->warmup, "Untimed iterations per size")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--root", o->root, "Root rank of broadcast, reduce, gather, scatter");
  app.add_option("--algo", o->algo, "auto, ring, rd, rabenseifner, hier, tree, shared");
  app.add_flag("--shared", o->shared,
               "Buffers from alloc_shared, which the ranks of a host read from each other (as "
               "NCCL's registered buffers); default: ordinary memory");
  app.add_flag("--check", o->check, "Verify every result");
  app.add_flag("--blocking", o->blocking,
               "Wait for each call before issuing the next (as MPI latency benchmarks do); "
               "default: issue all iterations, then wait (as nccl-tests does)");
  app.add_option("--json", o->json, "Write the rows as JSON to this file (rank 0)");

  return [o]() -> int {
    const DataType t = comm::parse_dtype(o->dtype);
    const RedOp op = comm::parse_redop(o->redop);
    const size_t es = comm::dtype_size(t);
    const uint64_t lo = env::parse_bytes(o->min_bytes), hi = env::parse_bytes(o->max_bytes);
    if (lo > hi) COHORT_THROW("--min-bytes " << lo << " is larger than --max-bytes " << hi);
    comm::CollOptions copt;
    copt.algo = comm::parse_algo(o->algo);

    auto c = comm::init();
    const int n = c->size(), me = c->rank();
    if (o->root < 0 || o->root >= n)
      COHORT_THROW("--root " << o->root << " is outside 0.." << n - 1);
    const std::string& kind = o->op;
    const bool by_total = kind == "allgather" || kind == "reduce_scatter" || kind == "alltoall" ||
                          kind == "gather" || kind == "scatter";
    if (me == 0) {
      std::printf("# cohort bench comm: %s %s %s, %d ranks\n# %s\n", kind.c_str(), o->dtype.c_str(),
                  o->redop.c_str(), n, c->describe().c_str());
      std::printf("#%12s %12s %6s %6s %12s %12s %12s %8s %s\n", "size", "count", "type", "redop",
                  "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong", "algo");
      std::fflush(stdout);  // the header shows at once, also when rows take long
    }
    nlohmann::json rows = nlohmann::json::array();
    double busbw_sum = 0;
    int busbw_rows = 0;
    size_t total_wrong = 0;
    std::vector<uint64_t> sizes;
    for (double s = static_cast<double>(std::max<uint64_t>(lo, 0)); s <= static_cast<double>(hi);
         s = std::max(s * o->factor, s + 1)) {
      sizes.push_back(static_cast<uint64_t>(s));
      if (s == 0) s = 1;
    }
    for (uint64_t size : sizes) {
      // count: elements per rank buffer as the API takes it.
      size_t count = size / es;
      if (by_total) count = count / static_cast<size_t>(n);
      const size_t big = by_total ? count * static_cast<size_t>(n) : count;  // largest buffer
      const size_t buffer_bytes = std::max<size_t>(big * es, 1) + 64;
      std::vector<uint8_t> sendb, recvb;
      comm::SharedBuffer shared_send, shared_recv;
      if (o->shared) {
        shared_send = c->alloc_shared(buffer_bytes);
        shared_recv = c->alloc_shared(buffer_bytes);
      } else {
        sendb.resize(buffer_bytes);
        recvb.resize(buffer_bytes);
      }
      void* sb = o->shared ? shared_send.data() : sendb.data();
      void* rb = o->shared ? shared_recv.data() : recvb.data();
      size_t send_count =
          (kind == "reduce_scatter" || kind == "alltoall" || kind == "scatter") ? big : count;
      for (size_t i = 0; i < send_count; ++i) put(t, sb, i, value(op, me, i));
      auto run_once = [&]() -> comm::Work {
        if (kind == "allreduce") return c->allreduce(sb, rb, count, t, op, copt);
        if (kind == "reduce_scatter") return c->reduce_scatter(sb, rb, count, t, op, copt);
        if (kind == "allgather") return c->allgather(sb, rb, count, t, copt);
        if (kind == "broadcast") return c->broadcast(sb, rb, count, t, o->root, copt);
        if (kind == "reduce") return c->reduce(sb, rb, count, t, op, o->root, copt);
        if (kind == "alltoall") return c->alltoall(sb, rb, count, t, copt);
        if (kind == "gather") return c->gather(sb, rb, count, t, o->root, copt);
        return c->scatter(sb, rb, count, t, o->root, copt);
      };
      for (int i = 0; i < o->warmup; ++i) run_once().wait();
      // --check validates what the timed calls left (out of place: each writes the whole
      // result), so the output is cleared first, outside the timing.
      if (o->check) std::memset(rb, 0, big * es);
      c->barrier().wait();
      auto t0 = Clock::now();
      std::vector<comm::Work> works;
      for (int i = 0; i < o->iters; ++i) {
        if (o->blocking && i + 1 < o->iters) {
          run_once().wait();  // wait and let it go, as an MPI loop does
        } else {
          works.push_back(run_once());
        }
      }
      // Collectives complete in issue order: wait for the last one first, so that the caller
      // sleeps once instead of waking (and taking a core) after every call.
      for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
      double us = seconds_since(t0) * 1e6 / o->iters;
      // The algorithm chosen at issue, and why (cost model, forced by --algo, COHORT_ALGO).
      const std::string algo = works.empty() ? "" : works.back().algorithm();
      const std::string reason = works.empty() ? "" : works.back().reason();
      size_t wrong = 0;
      if (o->check) {
        auto want_at = [&](size_t i) -> std::pair<bool, double> {  // (checked here, value)
          if (kind == "allreduce") return {true, expected_reduction(t, op, n, i)};
          if (kind == "reduce") return {me == o->root, expected_reduction(t, op, n, i)};
          if (kind == "reduce_scatter")
            return {true, expected_reduction(t, op, n, static_cast<size_t>(me) * count + i)};
          if (kind == "broadcast") return {true, value(op, o->root, i)};
          if (kind == "scatter")
            return {true, value(op, o->root, static_cast<size_t>(me) * count + i)};
          size_t j = i / std::max<size_t>(count, 1), k = i % std::max<size_t>(count, 1);
          if (kind == "allgather") return {true, value(op, static_cast<int>(j), k)};
          if (kind == "gather") return {me == o->root, value(op, static_cast<int>(j), k)};
          return {true,
                  value(op, static_cast<int>(j), static_cast<size_t>(me) * count + k)};  // alltoall
        };
        size_t recv_count =
            (kind == "allgather" || kind == "alltoall" || kind == "gather") ? big : count;
        for (size_t i = 0; i < recv_count; ++i) {
          auto [here, want] = want_at(i);
          if (here && !close_enough(t, get(t, rb, i), want)) ++wrong;
        }
      }
      // Mean time and total wrong over ranks.
      double stats[2] = {us, static_cast<double>(wrong)};
      c->allreduce(stats, stats, 2, DataType::f64, RedOp::sum).wait();
      us = stats[0] / n;
      wrong = static_cast<size_t>(stats[1]);
      total_wrong += wrong;
      double algbw = static_cast<double>(big * es) / (us * 1e3);
      double busbw = algbw * bus_factor(kind, n);
      if (me == 0) {
        std::printf("%13llu %12zu %6s %6s %12.2f %12.3f %12.3f %8zu %s (%s)\n",
                    static_cast<unsigned long long>(big * es), count, o->dtype.c_str(),
                    o->redop.c_str(), us, algbw, busbw, wrong, algo.c_str(), reason.c_str());
        std::fflush(stdout);
      }
      busbw_sum += busbw;
      ++busbw_rows;
      rows.push_back({{"size", big * es},
                      {"count", count},
                      {"type", o->dtype},
                      {"redop", o->redop},
                      {"time_us", us},
                      {"algbw", algbw},
                      {"busbw", busbw},
                      {"wrong", wrong},
                      {"algo", algo},
                      {"algo_reason", reason}});
    }
    if (me == 0) {
      std::printf("# Out of bounds values : %zu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
      std::printf("# Avg bus bandwidth    : %.3f\n", busbw_rows ? busbw_sum / busbw_rows : 0.0);
      if (!o->json.empty()) {
        nlohmann::json doc = {{"op", kind},
                              {"world", n},
                              {"backend", c->describe()},
                              {"transport", env::Settings::read().transport},
                              {"algo", o->algo},
                              {"shared", o->shared},
                              {"rows", rows}};
        std::ofstream f(o->json);
        if (!f) COHORT_THROW("cannot write --json file '" << o->json << "'");
        f << doc.dump(2) << "\n";
      }
    }
    return total_wrong == 0 ? 0 : 2;
  };
}

}  // namespace cohort::cli
