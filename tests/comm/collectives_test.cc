// Every collective x type x op across real rank processes, checked against a reference
// computed independently in double precision.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/comm/types.h"
#include "cohort/core/error.h"
#include "testing/ranks.h"

using namespace cohort::comm;
using cohort::testing::expect_all_ok;
using cohort::testing::run_ranks;
using cohort::testing::RunOptions;

namespace {

// Unaligned-safe element access.
double load(DataType t, const uint8_t* p, size_t i) {
  const uint8_t* q = p + i * dtype_size(t);
  switch (t) {
    case DataType::f32: {
      float v;
      std::memcpy(&v, q, 4);
      return v;
    }
    case DataType::f64: {
      double v;
      std::memcpy(&v, q, 8);
      return v;
    }
    case DataType::f16: {
      uint16_t v;
      std::memcpy(&v, q, 2);
      return f16_to_f32(v);
    }
    case DataType::bf16: {
      uint16_t v;
      std::memcpy(&v, q, 2);
      return bf16_to_f32(v);
    }
    case DataType::i32: {
      int32_t v;
      std::memcpy(&v, q, 4);
      return v;
    }
    case DataType::i64: {
      int64_t v;
      std::memcpy(&v, q, 8);
      return static_cast<double>(v);
    }
    case DataType::u8:
      return *q;
  }
  return 0;
}

void store(DataType t, uint8_t* p, size_t i, double v) {
  uint8_t* q = p + i * dtype_size(t);
  switch (t) {
    case DataType::f32: {
      float x = static_cast<float>(v);
      std::memcpy(q, &x, 4);
      break;
    }
    case DataType::f64:
      std::memcpy(q, &v, 8);
      break;
    case DataType::f16: {
      uint16_t x = f32_to_f16(static_cast<float>(v));
      std::memcpy(q, &x, 2);
      break;
    }
    case DataType::bf16: {
      uint16_t x = f32_to_bf16(static_cast<float>(v));
      std::memcpy(q, &x, 2);
      break;
    }
    case DataType::i32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(q, &x, 4);
      break;
    }
    case DataType::i64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(q, &x, 8);
      break;
    }
    case DataType::u8:
      *q = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

// Inputs are small integers (exact in every type); negative ones for signed types.
double input(DataType t, RedOp op, int rank, size_t i) {
  if (op == RedOp::prod) return (rank + i) % 3 == 0 ? 2.0 : 1.0;
  double v = static_cast<double>((rank * 7 + i * 3) % 11);
  bool sign = t != DataType::u8;
  return sign ? v - 4 : v;
}

double reference(DataType t, RedOp op, int n, size_t i) {
  double acc = input(t, op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = input(t, op, r, i);
    if (op == RedOp::sum || op == RedOp::avg) acc += v;
    if (op == RedOp::prod) acc *= v;
    if (op == RedOp::min) acc = std::min(acc, v);
    if (op == RedOp::max) acc = std::max(acc, v);
  }
  if (t == DataType::u8) acc = static_cast<double>(static_cast<int64_t>(acc) & 0xff);
  if (op == RedOp::avg) {
    bool integer = t == DataType::i32 || t == DataType::i64 || t == DataType::u8;
    acc = integer ? std::trunc(acc / n) : acc / n;
  }
  return acc;
}

bool near(DataType t, double got, double want) {
  double tol =
      (t == DataType::f16 || t == DataType::bf16) ? 1e-2 : (t == DataType::f32 ? 1e-6 : 1e-12);
  if (t == DataType::i32 || t == DataType::i64 || t == DataType::u8) tol = 0;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// Buffers offset by one byte so that no element is aligned.
struct Buf {
  std::vector<uint8_t> v;
  uint8_t* p;
  explicit Buf(size_t bytes) : v(bytes + 17, 0xEE) { p = v.data() + 1; }
};

const size_t kCounts[] = {0, 1, 7, 13, 1031, 4099};

void check_reductions(Communicator& c, DataType t, RedOp op, size_t count, bool in_place,
                      Algo algo) {
  const int n = c.size(), me = c.rank();
  CollOptions o;
  o.algo = algo;
  const std::string what = std::string(dtype_name(t)) + " " + redop_name(op) + " count " +
                           std::to_string(count) + (in_place ? " in-place" : "") + " algo " +
                           algo_name(algo);
  {  // allreduce
    Buf in(count * dtype_size(t)), out(count * dtype_size(t));
    for (size_t i = 0; i < count; ++i) store(t, in.p, i, input(t, op, me, i));
    uint8_t* dst = in_place ? in.p : out.p;
    Work w = c.allreduce(in.p, dst, count, t, op, o);
    w.wait();
    REQUIRE(algo == Algo::automatic || w.algorithm() == algo_name(algo),
            "allreduce forced to " << algo_name(algo) << " ran " << w.algorithm());
    REQUIRE(algo == Algo::automatic || w.reason() == "forced by the call", w.reason());
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(near(t, load(t, dst, i), reference(t, op, n, i)),
              "allreduce " << what << " element " << i << ": got " << load(t, dst, i) << " want "
                           << reference(t, op, n, i));
    }
  }
  if (algo != Algo::automatic) return;
  {  // reduce_scatter: rank r gets block r of the reduction of n*count elements
    Buf in(count * n * dtype_size(t)), out(count * dtype_size(t));
    for (size_t i = 0; i < count * n; ++i) store(t, in.p, i, input(t, op, me, i));
    c.reduce_scatter(in.p, out.p, count, t, op).wait();
    for (size_t i = 0; i < count; ++i) {
      double want = reference(t, op, n, static_cast<size_t>(me) * count + i);
      REQUIRE(near(t, load(t, out.p, i), want), "reduce_scatter " << what << " element " << i);
    }
  }
  for (int root : {0, n - 1}) {  // reduce
    for (Algo a : {Algo::tree, Algo::ring}) {
      CollOptions ro;
      ro.algo = a;
      Buf in(count * dtype_size(t)), out(count * dtype_size(t));
      for (size_t i = 0; i < count; ++i) store(t, in.p, i, input(t, op, me, i));
      uint8_t* dst = in_place && me == root ? in.p : out.p;
      Work w = c.reduce(in.p, dst, count, t, op, root, ro);
      w.wait();
      REQUIRE(w.algorithm() == algo_name(a),
              "reduce forced to " << algo_name(a) << " ran " << w.algorithm());
      if (me == root) {
        for (size_t i = 0; i < count; ++i) {
          REQUIRE(near(t, load(t, dst, i), reference(t, op, n, i)),
                  "reduce root " << root << " " << algo_name(a) << " " << what << " element " << i);
        }
      }
    }
  }
}

void check_data_movement(Communicator& c, DataType t, size_t count) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(t);
  const RedOp op = RedOp::sum;  // only selects the input pattern
  for (Algo a : {Algo::automatic, Algo::ring, Algo::recursive_doubling}) {  // allgather
    CollOptions o;
    o.algo = a;
    Buf in(count * es), out(count * n * es);
    for (size_t i = 0; i < count; ++i) store(t, in.p, i, input(t, op, me, i));
    if (a == Algo::recursive_doubling && (n & (n - 1)) != 0) {
      // A forced algorithm this group cannot run fails at issue, saying why, and is never
      // replaced by another; the communicator stays usable.
      std::string error;
      try {
        c.allgather(in.p, out.p, count, t, o);
      } catch (const cohort::Error& e) {
        error = e.what();
      }
      REQUIRE(error.find("power-of-two") != std::string::npos,
              "rd allgather on " << n << ": " << error);
      continue;
    }
    Work w = c.allgather(in.p, out.p, count, t, o);
    w.wait();
    REQUIRE(a == Algo::automatic || w.algorithm() == algo_name(a),
            "allgather forced to " << algo_name(a) << " ran " << w.algorithm());
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        REQUIRE(near(t, load(t, out.p, r * count + i), input(t, op, r, i)),
                "allgather " << dtype_name(t) << " count " << count << " block " << r);
      }
    }
  }
  for (int root : {0, n / 2}) {
    for (Algo a : {Algo::tree, Algo::ring}) {  // broadcast, in place on the root
      CollOptions o;
      o.algo = a;
      Buf buf(count * es);
      for (size_t i = 0; i < count; ++i)
        store(t, buf.p, i, me == root ? input(t, op, root, i) : -1);
      Work w = c.broadcast(buf.p, buf.p, count, t, root, o);
      w.wait();
      REQUIRE(w.algorithm() == algo_name(a),
              "broadcast forced to " << algo_name(a) << " ran " << w.algorithm());
      for (size_t i = 0; i < count; ++i) {
        REQUIRE(near(t, load(t, buf.p, i), input(t, op, root, i)),
                "broadcast root " << root << " " << algo_name(a) << " count " << count);
      }
    }
    {  // gather
      Buf in(count * es), out(count * n * es);
      for (size_t i = 0; i < count; ++i) store(t, in.p, i, input(t, op, me, i));
      c.gather(in.p, out.p, count, t, root).wait();
      if (me == root) {
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            REQUIRE(near(t, load(t, out.p, r * count + i), input(t, op, r, i)),
                    "gather block " << r);
          }
        }
      }
    }
    {  // scatter
      Buf in(count * n * es), out(count * es);
      for (size_t i = 0; i < count * n; ++i) store(t, in.p, i, input(t, op, root, i));
      c.scatter(in.p, out.p, count, t, root).wait();
      for (size_t i = 0; i < count; ++i) {
        REQUIRE(near(t, load(t, out.p, i), input(t, op, root, me * count + i)), "scatter");
      }
    }
  }
  for (bool in_place : {false, true}) {  // alltoall: block j of rank r holds input(r, j*count+i)
    Buf in(count * n * es), out(count * n * es);
    for (size_t i = 0; i < count * n; ++i) store(t, in.p, i, input(t, op, me, i));
    uint8_t* dst = in_place ? in.p : out.p;
    c.alltoall(in.p, dst, count, t).wait();
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        REQUIRE(near(t, load(t, dst, r * count + i), input(t, op, r, me * count + i)),
                "alltoall from " << r << (in_place ? " in place" : ""));
      }
    }
  }
}

void full_matrix(int) {
  auto c = init();
  for (DataType t : kAllDataTypes) {
    for (size_t count : kCounts) {
      check_data_movement(*c, t, count);
      for (RedOp op : kAllRedOps) {
        check_reductions(*c, t, op, count, false, Algo::automatic);
        check_reductions(*c, t, op, count, true, Algo::automatic);
      }
    }
  }
  for (Algo a : {Algo::ring, Algo::recursive_doubling, Algo::rabenseifner}) {
    for (size_t count : {size_t(0), size_t(5), size_t(1031), size_t(300007)}) {
      check_reductions(*c, DataType::f32, RedOp::sum, count, false, a);
      check_reductions(*c, DataType::bf16, RedOp::max, count, true, a);
    }
  }
  // point to point: a ring of sends
  const int n = c->size(), me = c->rank();
  if (n > 1) {
    std::vector<int32_t> out(100, me), in(100, -1);
    auto s = c->send(out.data(), out.size(), DataType::i32, (me + 1) % n);
    auto r = c->recv(in.data(), in.size(), DataType::i32, (me - 1 + n) % n);
    r.wait();
    s.wait();
    REQUIRE(in[99] == (me - 1 + n) % n, "recv got " << in[99]);
  }
  c->barrier().wait();
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, EveryCollectiveTypeAndOp) {
  RunOptions o;
  o.timeout_s = 240;
  o.env["COHORT_TIMEOUT"] = "60";
  expect_all_ok(run_ranks(GetParam(), full_matrix, o));
}

INSTANTIATE_TEST_SUITE_P(Comm, WorldSize, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(Comm, ForcedTcp) {
  RunOptions o;
  o.env["COHORT_TRANSPORT"] = "tcp";
  o.env["COHORT_TIMEOUT"] = "60";
  expect_all_ok(run_ranks(
      3,
      [](int) {
        auto c = init();
        REQUIRE(c->describe().find("tcp") != std::string::npos, c->describe());
        REQUIRE(c->describe().find("shm") == std::string::npos, c->describe());
        for (size_t count : {size_t(0), size_t(1), size_t(1031), size_t(1u << 20)}) {
          check_reductions(*c, DataType::f32, RedOp::sum, count, false, Algo::automatic);
          check_reductions(*c, DataType::f16, RedOp::avg, count, true, Algo::ring);
          check_data_movement(*c, DataType::i64, count / 8);
        }
      },
      o));
}

// Settings with an effect a rank can see: COHORT_TCP_STREAMS lanes per TCP peer, and
// COHORT_NO_AVX2 the scalar reduction kernels (the results stay the same).
TEST(Comm, TcpStreamsAndScalarKernelsFromTheEnvironment) {
  RunOptions o;
  o.env["COHORT_TRANSPORT"] = "tcp";
  o.env["COHORT_TCP_STREAMS"] = "3";
  o.env["COHORT_NO_AVX2"] = "1";
  o.env["COHORT_TIMEOUT"] = "60";
  expect_all_ok(run_ranks(
      2,
      [](int rank) {
        auto c = init();
        const std::string report = c->topology_report();
        REQUIRE(report.find(rank == 0 ? "1=tcpx3" : "0=tcpx3") != std::string::npos, report);
        REQUIRE(c->describe().find("reduce scalar") != std::string::npos, c->describe());
        check_reductions(*c, DataType::bf16, RedOp::sum, 4099, false, Algo::automatic);
        check_reductions(*c, DataType::f32, RedOp::max, 3u << 20, true, Algo::ring);
      },
      o));
}

TEST(Comm, TwoEmulatedHostsUseHierarchicalAllreduce) {
  RunOptions o;
  o.ranks_per_host = 2;
  o.env["COHORT_TIMEOUT"] = "60";
  expect_all_ok(run_ranks(
      4,
      [](int) {
        auto c = init();
        REQUIRE(c->num_hosts() == 2, "hosts " << c->num_hosts());
        REQUIRE(c->local_size() == 2, "local size " << c->local_size());
        REQUIRE(c->describe().find("shm+tcp") != std::string::npos, c->describe());
        for (size_t count : {size_t(3), size_t(1031), size_t(1u << 20)}) {
          check_reductions(*c, DataType::f32, RedOp::sum, count, false, Algo::hierarchical);
          check_reductions(*c, DataType::i32, RedOp::max, count, true, Algo::hierarchical);
        }
        std::vector<float> big(8u << 20, 1.0f);
        auto w = c->allreduce(big.data(), big.data(), big.size(), DataType::f32, RedOp::sum);
        w.wait();
        REQUIRE(w.algorithm() == "hier", "the cost model picked " << w.algorithm());
        REQUIRE(big[12345] == 4.0f, big[12345]);
      },
      o));
}

// The pipelined hierarchical allreduce (large messages): chunks of 64 KiB, so that a few MiB run
// through many ticks in which chunks in different phases share one exchange; hosts of one, two
// and three ranks, two and three hosts, uneven sizes, in place and out of place.
TEST(Comm, PipelinedHierarchicalAllreduceOnEveryHostShape) {
  struct Shape {
    int hosts, per_host;
  };
  for (Shape sh : {Shape{2, 2}, Shape{2, 1}, Shape{3, 2}, Shape{2, 3}}) {
    SCOPED_TRACE(std::to_string(sh.hosts) + " hosts x " + std::to_string(sh.per_host));
    RunOptions o;
    o.ranks_per_host = sh.per_host;
    o.env["COHORT_TIMEOUT"] = "60";
    o.env["COHORT_HIER_CHUNK"] = "65536";
    const int world = sh.hosts * sh.per_host;
    expect_all_ok(run_ranks(
        world,
        [sh](int) {
          auto c = init();
          REQUIRE(c->num_hosts() == sh.hosts, "hosts " << c->num_hosts());
          for (size_t count : {size_t(1u << 20) + 7, size_t(3u << 20) + 1}) {
            check_reductions(*c, DataType::f32, RedOp::sum, count, false, Algo::hierarchical);
            check_reductions(*c, DataType::i32, RedOp::max, count, true, Algo::hierarchical);
          }
          check_reductions(*c, DataType::bf16, RedOp::sum, 5u << 20, false, Algo::hierarchical);
        },
        o));
  }
}

// The algorithm is chosen once, at issue: what a call was forced to is what runs (the Work says
// so, with the reason); what cannot run fails at issue naming the collective and the need;
// COHORT_ALGO forces its algorithm where the collective has it and leaves the rest to the cost
// model.
TEST(Comm, ForcedAlgorithmsRunAsAskedOrFailSayingWhy) {
  RunOptions o;
  o.env["COHORT_ALGO"] = "rd";
  o.env["COHORT_TIMEOUT"] = "60";
  expect_all_ok(run_ranks(
      3,
      [](int) {
        auto c = init();
        auto error_of = [](auto&& issue) {
          try {
            issue();
          } catch (const cohort::Error& e) {
            return std::string(e.what());
          }
          return std::string("no error");
        };
        std::vector<float> v(1000, 1.0f), all(3000);
        Work w = c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum);
        REQUIRE(w.algorithm() == "rd" && w.reason() == "COHORT_ALGO",
                w.algorithm() << " (" << w.reason() << ")");
        w.wait();
        REQUIRE(v[999] == 3.0f, v[999]);
        // broadcast has no rd: the cost model picks.
        w = c->broadcast(v.data(), v.data(), v.size(), DataType::f32, 0);
        REQUIRE(w.reason() == "cost model", w.algorithm() << " (" << w.reason() << ")");
        w.wait();
        // allgather has rd, but 3 ranks cannot run it.
        std::string e =
            error_of([&] { c->allgather(v.data(), all.data(), v.size(), DataType::f32); });
        REQUIRE(e.find("allgather cannot run COHORT_ALGO=rd") != std::string::npos &&
                    e.find("power-of-two number of ranks; this group has 3") != std::string::npos,
                e);
        CollOptions tree;
        tree.algo = Algo::tree;
        e = error_of([&] { c->allreduce(v.data(), v.data(), 1, DataType::f32, RedOp::sum, tree); });
        REQUIRE(e.find("allreduce has no algorithm 'tree' (it has: ring, rd, rabenseifner, hier, "
                       "shared)") != std::string::npos,
                e);
        CollOptions hier;
        hier.algo = Algo::hierarchical;
        e = error_of([&] { c->allreduce(v.data(), v.data(), 1, DataType::f32, RedOp::sum, hier); });
        REQUIRE(e.find("cannot run the forced algorithm 'hier'") != std::string::npos &&
                    e.find("this group has 1 host(s) with 3 rank(s)") != std::string::npos,
                e);
        // Refused calls sent nothing: the communicator still works, in step on every rank.
        CollOptions ring;
        ring.algo = Algo::ring;
        w = c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum, ring);
        REQUIRE(w.algorithm() == "ring" && w.reason() == "forced by the call", w.reason());
        w.wait();
        REQUIRE(v[0] == 9.0f, v[0]);
      },
      o));
}

// Allreduce on memory from alloc_shared: every rank count of one host, types and operations,
// sizes that do not divide by the ranks, in place and out of place, at an offset into the
// allocation; each call runs `shared` (the Work says so) and gives the reference's values.
// Where one rank's buffer is ordinary memory, every rank runs the ring and says so; a forced
// `shared` without shared memory fails at issue; sizes that differ between ranks fail the
// allocation naming both.
TEST(Comm, SharedMemoryAllreduceReadsThePeersBuffersWhereTheyLie) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    RunOptions o;
    o.env["COHORT_TIMEOUT"] = "60";
    expect_all_ok(run_ranks(
        n,
        [](int) {
          auto c = init();
          const int n = c->size(), me = c->rank();
          struct Case {
            DataType t;
            RedOp op;
            size_t count;
            bool in_place;
          };
          for (const Case& k : {Case{DataType::f32, RedOp::sum, (1u << 18) + 7, false},
                                Case{DataType::f32, RedOp::sum, (1u << 20) + 3, true},
                                Case{DataType::bf16, RedOp::avg, (1u << 18) + 1, false},
                                Case{DataType::i32, RedOp::max, 100003, true},
                                Case{DataType::f64, RedOp::min, 50001, false}}) {
            const size_t bytes = k.count * dtype_size(k.t);
            SharedBuffer in = c->alloc_shared(bytes + 8), out = c->alloc_shared(bytes + 8);
            REQUIRE(in.size() == bytes + 8 && in.data() != nullptr && in.shared(), in.size());
            uint8_t* src = in.as<uint8_t>() + 8;  // at an offset into the allocation
            uint8_t* dst = k.in_place ? src : out.as<uint8_t>();
            for (size_t i = 0; i < k.count; ++i) store(k.t, src, i, input(k.t, k.op, me, i));
            Work w = c->allreduce(src, dst, k.count, k.t, k.op);
            REQUIRE(w.algorithm() == "shared", "chose " << w.algorithm() << " (" << w.reason()
                                                        << ") for " << bytes << " bytes");
            w.wait();
            REQUIRE(w.algorithm() == "shared", "ran " << w.algorithm() << ": " << w.reason());
            for (size_t i = 0; i < k.count; ++i) {
              REQUIRE(near(k.t, load(k.t, dst, i), reference(k.t, k.op, n, i)),
                      dtype_name(k.t) << " " << redop_name(k.op) << " count " << k.count
                                      << " element " << i << ": got " << load(k.t, dst, i)
                                      << " want " << reference(k.t, k.op, n, i));
            }
          }
          // reduce_scatter and allgather read only the peers' inputs there: the outputs may be
          // ordinary memory, or (in place) the rank's own block of the input.
          for (bool in_place : {false, true}) {
            const size_t count = (1u << 16) + 5;  // per block; the input holds n blocks
            const size_t all = count * static_cast<size_t>(n);
            SharedBuffer send = c->alloc_shared(all * 4);
            std::vector<float> plain(count);
            float* in = send.as<float>();
            for (size_t i = 0; i < all; ++i)
              in[i] = static_cast<float>(input(DataType::f32, RedOp::sum, me, i));
            float* out = in_place ? in + static_cast<size_t>(me) * count : plain.data();
            Work w = c->reduce_scatter(in, out, count, DataType::f32, RedOp::sum);
            w.wait();
            REQUIRE(w.algorithm() == "shared",
                    "reduce_scatter ran " << w.algorithm() << " (" << w.reason() << ")");
            for (size_t i = 0; i < count; ++i) {
              const double want =
                  reference(DataType::f32, RedOp::sum, n, static_cast<size_t>(me) * count + i);
              REQUIRE(out[i] == want,
                      "reduce_scatter element " << i << ": " << out[i] << " want " << want);
            }
            SharedBuffer gathered = c->alloc_shared(all * 4);
            std::vector<float> plain_all(all);
            float* result = in_place ? gathered.as<float>() : plain_all.data();
            float* mine = in_place ? result + static_cast<size_t>(me) * count : send.as<float>();
            for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(me * 1000 + i % 997);
            w = c->allgather(mine, result, count, DataType::f32);
            w.wait();
            REQUIRE(w.algorithm() == "shared",
                    "allgather ran " << w.algorithm() << " (" << w.reason() << ")");
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i) {
                const float want = static_cast<float>(r * 1000 + i % 997);
                REQUIRE(result[static_cast<size_t>(r) * count + i] == want,
                        "allgather block " << r << " element " << i << ": "
                                           << result[static_cast<size_t>(r) * count + i]);
              }
            }
          }
          // Rank 1's output is ordinary memory: every rank runs the ring.
          const size_t count = 1u << 18;
          SharedBuffer in = c->alloc_shared(count * 4), out = c->alloc_shared(count * 4);
          std::vector<float> plain(count);
          float* dst = me == 1 ? plain.data() : out.as<float>();
          for (size_t i = 0; i < count; ++i) in.as<float>()[i] = static_cast<float>(me + i % 5);
          Work w = c->allreduce(in.data(), dst, count, DataType::f32, RedOp::sum);
          w.wait();
          REQUIRE(w.algorithm() == "ring" &&
                      w.reason() == std::string("a rank's buffers lie outside shared memory"),
                  w.algorithm() << " (" << w.reason() << ")");
          for (size_t i = 0; i < count; i += 997) {
            const float want = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 5));
            REQUIRE(dst[i] == want, "element " << i << ": " << dst[i] << " want " << want);
          }
          // Small calls keep the cost model's choice.
          w = c->allreduce(in.data(), in.data(), 1000, DataType::f32, RedOp::sum);
          REQUIRE(w.algorithm() != "shared", w.algorithm());
          w.wait();
          bool refused = false;
          try {
            c->alloc_shared(me == 0 ? 4096 : 8192);
          } catch (const cohort::Error& e) {
            refused = std::string(e.what()).find("asks for") != std::string::npos;
            REQUIRE(refused, e.what());
          }
          REQUIRE(refused, "allocations of different sizes were accepted");
        },
        o));
  }
  expect_all_ok(run_ranks(2, [](int) {
    auto c = init();
    std::vector<float> v(1u << 18, 1.0f);
    CollOptions shared;
    shared.algo = Algo::shared;
    try {
      c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum, shared);
      REQUIRE(false, "a forced shared allreduce ran without shared memory");
    } catch (const cohort::Error& e) {
      REQUIRE(std::string(e.what()).find("no shared memory was allocated") != std::string::npos,
              e.what());
    }
    Work w = c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum);
    REQUIRE(w.algorithm() != "shared", w.algorithm());
    w.wait();
    REQUIRE(v[5] == 2.0f, v[5]);
  }));
}

TEST(Comm, ManyCallsInFlight) {
  expect_all_ok(run_ranks(3, [](int) {
    auto c = init();
    const int k = 64;
    std::vector<std::vector<int64_t>> bufs(k);
    std::vector<Work> works;
    for (int i = 0; i < k; ++i) {
      bufs[static_cast<size_t>(i)].assign(static_cast<size_t>(1 + i * 997), i + c->rank());
      auto& b = bufs[static_cast<size_t>(i)];
      works.push_back(c->allreduce(b.data(), b.data(), b.size(), DataType::i64, RedOp::sum));
    }
    for (auto& w : works) w.wait();
    for (int i = 0; i < k; ++i) {
      REQUIRE(bufs[static_cast<size_t>(i)].back() == 3 * i + 3, "call " << i);
    }
  }));
}

// A call nobody waits for still runs at once, also right after many blocking calls (which the
// waiting caller runs itself, so that the progress thread sleeps and is not woken per call):
// rank 0 issues an allreduce and does not wait for 300 ms; rank 1, waiting for the same
// allreduce, must get it long before then.
TEST(Comm, CallsNobodyWaitsForStillRunAfterBlockingOnes) {
  expect_all_ok(run_ranks(2, [](int rank) {
    auto c = init();
    std::vector<float> v(16, 1.0f);
    // Long enough for an idle progress thread to back off to its longest sleep; the count is
    // agreed by rank 0's clock, so both ranks issue the same calls.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    for (int go = 1; go != 0;) {
      for (int i = 0; i < 100; ++i) {
        c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::max).wait();
      }
      go = rank == 0 && std::chrono::steady_clock::now() < until ? 1 : 0;
      c->broadcast(&go, &go, 1, DataType::i32, 0).wait();
    }
    c->barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    Work w = c->allreduce(v.data(), v.data(), v.size(), DataType::f32, RedOp::sum);
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      REQUIRE(w.test(), "the call did not finish while its caller was away");
    } else {
      w.wait();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      REQUIRE(ms < 150, "the peer's unwaited call took " << ms << " ms to run");
    }
    w.wait();
    REQUIRE(v[0] == 2.0f, v[0]);
  }));
}

TEST(Comm, SplitByParity) {
  expect_all_ok(run_ranks(5, [](int rank) {
    auto c = init();
    auto sub = c->split(rank % 2, -rank);  // reversed order inside each color
    REQUIRE(sub, "no communicator");
    const int expect_size = rank % 2 == 0 ? 3 : 2;
    REQUIRE(sub->size() == expect_size, "size " << sub->size());
    std::vector<int32_t> v{rank};
    sub->allreduce(v.data(), v.data(), 1, DataType::i32, RedOp::sum).wait();
    REQUIRE(v[0] == (rank % 2 == 0 ? 0 + 2 + 4 : 1 + 3), "sum " << v[0]);
    std::vector<int32_t> all(static_cast<size_t>(sub->size()));
    int32_t mine = rank;
    sub->allgather(&mine, all.data(), 1, DataType::i32).wait();
    REQUIRE(all[0] > all.back(), "order by key: first " << all[0] << " last " << all.back());
    auto none = c->split(rank == 0 ? -1 : 1, 0);
    REQUIRE((rank == 0) == (none == nullptr), "color -1 must give no communicator");
  }));
}

}  // namespace
