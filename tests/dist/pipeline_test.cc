// Pipeline parallelism over real rank processes: pipelined training with deferred BatchNorm ends
// with the parameters and running statistics of unpipelined training on the same micro-batches
// (2, 3 and 4 stages, 1 to 8 micro-batches, both schedules, with replicas, accumulation and
// recomputation, the replicas sharded by ZeRO-1, 2 and 3, whose freed gradients and parameters
// the kernel no longer holds); 1F1B and GPipe agree; 1F1B holds at most S - stage micro-batches and
// its peak activations stay within the bound; neighbours that disagree on shapes fail before
// training; a killed stage makes the others fail promptly, naming it. The schedules and the
// balanced cut are checked as functions first.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/dist/pipeline.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/safetensors.h"
#include "testing/compare.h"
#include "testing/ranks.h"
#include "testing/scans.h"
#include "testing/shell.h"
#include "testing/temp_dir.h"

namespace cohort::dist {
namespace {

using testing::run_ranks;
using testing::RunOptions;

TEST(PipelineSchedule, EveryMicroBatchOnceForwardThenBackward) {
  for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b})
    for (int S = 1; S <= 5; ++S)
      for (int M = 1; M <= 9; ++M)
        for (int st = 0; st < S; ++st) {
          const std::vector<Action> a = schedule_actions(s, S, st, M);
          ASSERT_EQ(a.size(), static_cast<size_t>(2 * M));
          std::vector<int> fwd(static_cast<size_t>(M), 0), bwd(static_cast<size_t>(M), 0);
          for (const Action& x : a) {
            if (x.forward) {
              ++fwd[static_cast<size_t>(x.micro)];
            } else {
              ASSERT_EQ(fwd[static_cast<size_t>(x.micro)], 1) << "backward before forward";
              ++bwd[static_cast<size_t>(x.micro)];
            }
          }
          for (int i = 0; i < M; ++i) {
            EXPECT_EQ(fwd[static_cast<size_t>(i)], 1);
            EXPECT_EQ(bwd[static_cast<size_t>(i)], 1);
          }
          // Micro-batches leave forward in order on every stage (the activations' channel is
          // FIFO), and backward in the same order on every stage (the gradients' channel).
          int last_f = -1;
          for (const Action& x : a) {
            if (x.forward) {
              EXPECT_EQ(x.micro, ++last_f);
            }
          }
          const int peak = peak_in_flight(a);
          if (s == Schedule::gpipe) {
            EXPECT_EQ(peak, M);
          } else {
            EXPECT_EQ(peak, std::min(S - st, M)) << "stage " << st << " of " << S << ", M " << M;
          }
        }
  EXPECT_DOUBLE_EQ(bubble_formula(4, 8), 3.0 / 11.0);
  EXPECT_EQ(schedule_name(parse_schedule("1f1b")), std::string("1f1b"));
  EXPECT_THROW(parse_schedule("interleaved"), Error);
}

TEST(PipelineSchedule, BalancedCutMinimisesTheCostliestStage) {
  EXPECT_EQ(balance_cuts({1, 1, 1, 1}, 2), (std::vector<int>{2}));
  EXPECT_EQ(balance_cuts({4, 1, 1, 1, 1}, 2), (std::vector<int>{1}));
  EXPECT_EQ(balance_cuts({1, 2, 3, 4, 5, 6}, 3), (std::vector<int>{3, 5}));  // 6 | 9 | 6
  EXPECT_EQ(balance_cuts({5, 5, 5}, 3), (std::vector<int>{1, 2}));
  // Brute force over every cut of 7 pieces into 3 stages.
  const std::vector<double> c = {3, 1, 4, 1, 5, 9, 2};
  double best = 1e9;
  for (int a = 1; a < 7; ++a)
    for (int b = a + 1; b < 7; ++b) {
      double s0 = 0, s1 = 0, s2 = 0;
      for (int i = 0; i < 7; ++i) (i < a ? s0 : i < b ? s1 : s2) += c[static_cast<size_t>(i)];
      best = std::min(best, std::max({s0, s1, s2}));
    }
  const std::vector<int> cut = balance_cuts(c, 3);
  double s0 = 0, s1 = 0, s2 = 0;
  for (int i = 0; i < 7; ++i) (i < cut[0] ? s0 : i < cut[1] ? s1 : s2) += c[static_cast<size_t>(i)];
  EXPECT_DOUBLE_EQ(std::max({s0, s1, s2}), best);
  EXPECT_THROW(balance_cuts({1, 2}, 3), Error);
}

TEST(PipelineSchedule, ModelsAreChainsOfTheirUnits) {
  for (const std::string name : {"resnet18", "resnet50", "densenet121", "smallcnn"}) {
    auto m = nn::make_model(name, nn::ModelOptions{3, 10, 64, 1});
    const auto& pieces = m->pieces();
    ASSERT_FALSE(pieces.empty()) << name;
    EXPECT_EQ(pieces.front().first, 0);
    EXPECT_EQ(pieces.back().last, static_cast<int>(m->params().size()));
    // The chain computes the model's forward, bit for bit.
    m->train(false);
    nn::NoGrad off;
    tensor::Tensor x = tensor::Tensor::empty({2, 3, 64, 64});
    nn::init::normal(x, 0.0, 1.0, 5);
    x = x.channels_last();
    tensor::Tensor whole = m->forward(nn::constant(x))->value.contiguous();
    nn::Var h = nn::constant(x);
    for (const nn::Piece& p : pieces) h = p.forward(h);
    tensor::Tensor chained = h->value.contiguous();
    ASSERT_EQ(whole.shape(), chained.shape());
    EXPECT_EQ(std::memcmp(whole.raw(), chained.raw(), whole.bytes()), 0) << name;
  }
}

// Deferred statistics over M chunks are one forward's over the whole batch.
TEST(PipelineSchedule, DeferredBatchNormStatisticsAreTheWholeBatchs) {
  auto whole = nn::make_model("smallcnn", nn::ModelOptions{1, 3, 16, 4});
  auto chunks = nn::make_model("smallcnn", nn::ModelOptions{1, 3, 16, 4});
  tensor::Tensor x = tensor::Tensor::empty({12, 1, 16, 16});
  nn::init::normal(x, 0.5, 2.0, 9);
  x = x.channels_last();
  // Only the first BatchNorm sees exactly the same inputs both ways (later ones see the first's
  // outputs, normalised per chunk): compare it, and that every one was committed once.
  nn::NoGrad off;
  whole->forward(nn::constant(x));
  nn::defer_batch_norm_statistics(chunks->root(), true);
  for (int i = 0; i < 4; ++i) chunks->forward(nn::constant(x.narrow0(3 * i, 3 * i + 3)));
  for (nn::Buffer* b : chunks->buffers()) {
    if (b->value.dtype() == tensor::DType::i64) {
      EXPECT_EQ(b->value.data<int64_t>()[0], 0);
    }
  }
  nn::commit_batch_norm_statistics(chunks->root());
  for (const char* name : {"features.1.running_mean", "features.1.running_var"}) {
    EXPECT_LT(
        testing::max_rel_diff(chunks->find_buffer(name)->value, whole->find_buffer(name)->value),
        1e-5)
        << name;
  }
  for (nn::Buffer* b : chunks->buffers()) {
    if (b->value.dtype() == tensor::DType::i64) {
      EXPECT_EQ(b->value.data<int64_t>()[0], 1);
    }
  }
}

constexpr int kMicro = 2;  // samples per micro-batch
constexpr int kPx = 16;

tensor::Tensor batch(int step, int replica, int m, int px = kPx) {
  tensor::Tensor x = tensor::Tensor::empty({m * kMicro, 1, px, px});
  nn::init::normal(x, 0.0, 1.0, 1000 + static_cast<uint64_t>(step * 16 + replica));
  return x.channels_last();
}

std::vector<int> labels_of(int step, int replica, int m) {
  std::vector<int> l;
  for (int i = 0; i < m * kMicro; ++i) l.push_back((i + step + replica) % 3);
  return l;
}

struct Case {
  int stages = 2, replicas = 1, micro = 4, accum = 1;
  Schedule schedule = Schedule::one_f_one_b;
  bool recompute = false;
  std::string model = "smallcnn";
  int steps = 3;
  float lr = 0.05f;
  int px = kPx;
  Shard shard = Shard::none;  // over each stage's replicas
  bool sync_bn = false;       // SyncBatchNorm over each stage's replicas (instead of deferred)
  int ranks_per_host = 0;     // > 0: emulated hosts of this many ranks (hybrid)
  std::string optimizer = "sgd";
  float clip = 0;
};

std::unique_ptr<nn::Model> model_of(const Case& k) {
  return nn::make_model(k.model, nn::ModelOptions{1, 3, k.px, 4});
}

nn::OptimOptions optim_of(const Case& k) {
  nn::OptimOptions o;
  o.kind = k.optimizer;
  return o;
}

// Unpipelined: every replica's micro-batches accumulated in one process, the running statistics
// deferred over replica 0's (what replica 0's stages hold). Under SyncBatchNorm, micro-batch i
// of every replica is one batch (what SyncBatchNorm normalises over), statistics not deferred.
std::unique_ptr<nn::Model> reference(const Case& k) {
  auto m = model_of(k);
  auto opt = nn::make_optimizer(*m, optim_of(k));
  if (!k.sync_bn) nn::defer_batch_norm_statistics(m->root(), true);
  const float scale = 1.0f / static_cast<float>(k.micro * k.replicas * k.accum);
  for (int s = 0; s < k.steps; ++s) {
    m->zero_grad();
    for (int a = 0; a < k.accum && k.sync_bn; ++a) {
      const int D = k.replicas;
      for (int i = 0; i < k.micro; ++i) {
        tensor::Tensor x = tensor::Tensor::empty({D * kMicro, 1, k.px, k.px});
        std::vector<int> l;
        for (int r = 0; r < D; ++r) {
          tensor::Tensor part = x.narrow0(r * kMicro, (r + 1) * kMicro);
          part.copy_(
              batch(s * k.accum + a, r, k.micro, k.px).narrow0(i * kMicro, (i + 1) * kMicro));
          const std::vector<int> lr = labels_of(s * k.accum + a, r, k.micro);
          l.insert(l.end(), lr.begin() + i * kMicro, lr.begin() + (i + 1) * kMicro);
        }
        nn::Tape tape;
        nn::Tape::Recording rec(tape);
        nn::Var logits = m->forward(nn::constant(x.channels_last()));
        tape.backward(nn::cross_entropy(logits, l), static_cast<float>(D) * scale);
      }
    }
    for (int a = 0; a < k.accum && !k.sync_bn; ++a)
      for (int r = k.replicas; r-- > 0;) {
        tensor::Tensor x = batch(s * k.accum + a, r, k.micro, k.px);
        const std::vector<int> l = labels_of(s * k.accum + a, r, k.micro);
        for (int i = 0; i < k.micro; ++i) {
          std::unique_ptr<nn::FrozenBatchNormStatistics> other;
          if (r != 0) other = std::make_unique<nn::FrozenBatchNormStatistics>();
          nn::Tape tape;
          nn::Tape::Recording rec(tape);
          nn::Var logits = m->forward(nn::constant(x.narrow0(i * kMicro, (i + 1) * kMicro)));
          nn::Var loss = nn::cross_entropy(
              logits, std::vector<int>(l.begin() + i * kMicro, l.begin() + (i + 1) * kMicro));
          tape.backward(loss, scale);
        }
      }
    nn::commit_batch_norm_statistics(m->root());
    if (k.clip > 0) nn::clip_grad_norm(*m, k.clip);
    opt->step(k.lr);
  }
  return m;
}

// Bytes of the whole pages inside [p, p + bytes) that the kernel holds (mincore).
size_t resident_bytes(const void* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (a >= e) return 0;
  std::vector<unsigned char> in((e - a) / page);
  REQUIRE(mincore(reinterpret_cast<void*>(a), e - a, in.data()) == 0,
          "mincore: " << std::strerror(errno));
  size_t n = 0;
  for (unsigned char c : in) n += c & 1u;
  return n * page;
}

struct Trained {
  std::unique_ptr<nn::Model> model;
  StageStats stats;
  // Between steps (after after_step), the most of the stage's flat gradients and values the
  // kernel held, and the memory report's gradients and parameters.
  size_t resident_grads = 0, resident_values = 0;
  MemoryReport report;
};

Trained pipelined(const Case& k, const std::shared_ptr<comm::Communicator>& c) {
  Trained t;
  t.model = model_of(k);
  PipelineOptions o;
  o.stages = k.stages;
  o.micro_batches = k.micro;
  o.schedule = k.schedule;
  o.deferred_batch_norm = !k.sync_bn;
  o.recompute = k.recompute;
  o.shard = k.shard;
  o.sync_batch_norm = k.sync_bn;
  Pipeline p(*t.model, c, o, {kMicro, 1, k.px, k.px});
  auto opt = nn::make_optimizer(p.optim_target(), optim_of(k));
  for (int s = 0; s < k.steps; ++s) {
    p.zero_grad();
    for (int a = 0; a < k.accum; ++a) {
      const int b = s * k.accum + a;
      const std::vector<int> l = labels_of(b, p.replica(), k.micro);
      p.run(
          batch(b, p.replica(), k.micro, k.px),
          [&](const nn::Var& logits, int i) {
            return nn::cross_entropy(
                logits, std::vector<int>(l.begin() + i * kMicro, l.begin() + (i + 1) * kMicro));
          },
          1.0f / static_cast<float>(k.accum));
    }
    p.finish();
    if (k.clip > 0) nn::clip_grad_norm(p.optim_target(), k.clip);
    opt->step(k.lr);
    p.after_step();
    const size_t bytes = (p.end() - p.begin()) * sizeof(float);
    t.resident_grads = std::max(
        t.resident_grads, resident_bytes(t.model->flat_grads().data<float>() + p.begin(), bytes));
    t.resident_values = std::max(
        t.resident_values, resident_bytes(t.model->flat_values().data<float>() + p.begin(), bytes));
  }
  t.stats = p.stats();
  t.report = p.memory(*opt);
  p.gather_model();
  return t;
}

void expect_equal(const nn::Model& a, const nn::Model& b, bool buffers, double tol,
                  const std::string& what) {
  for (nn::Param* p : a.params()) {
    const double d = testing::max_rel_diff(b.find_param(p->name)->value, p->value);
    REQUIRE(d < tol, what << ": " << p->name << " differs by " << d << " (relative)");
  }
  if (!buffers) return;
  for (nn::Buffer* x : a.buffers()) {
    if (x->value.dtype() != tensor::DType::f32) continue;
    const double d = testing::max_rel_diff(b.find_buffer(x->name)->value, x->value);
    REQUIRE(d < tol, what << ": " << x->name << " differs by " << d);
  }
}

void equals_unpipelined(const Case& k) {
  RunOptions ro;
  ro.timeout_s = 120;
  const int world = k.stages * k.replicas;
  ro.ranks_per_host = k.ranks_per_host;
  auto rs = run_ranks(
      world,
      [&](int rank) {
        tensor::set_threads(1);
        auto c = comm::init();
        Trained t = pipelined(k, c);
        auto ref = reference(k);
        std::ostringstream what;
        what << k.stages << " stages x " << k.replicas << " replicas, M " << k.micro << ", "
             << schedule_name(k.schedule) << (k.recompute ? ", recompute" : "") << ", "
             << shard_name(k.shard) << (k.sync_bn ? ", SyncBN" : "") << ", accum " << k.accum
             << ", rank " << rank;
        // Replica 0's stages hold replica 0's statistics; every replica the same parameters.
        expect_equal(*ref, *t.model, rank < k.stages, 2e-4, what.str());
        REQUIRE(t.stats.peak_in_flight == (k.schedule == Schedule::gpipe
                                               ? k.micro
                                               : std::min(k.stages - rank % k.stages, k.micro)),
                what.str() << ": " << t.stats.peak_in_flight << " micro-batches held at once");
        // Sharded, what the replicas no longer need between steps is gone from memory: the
        // full-size gradients under zero2, zero3 and hybrid, the parameters under zero3 and
        // hybrid (the whole pages of the stage's range; the edges may share a page with the
        // next stage's).
        if (k.replicas == 1) return;
        const bool values_freed = k.shard == Shard::zero3 || k.shard == Shard::hybrid;
        const bool grads_freed = values_freed || k.shard == Shard::zero2;
        // The replicas each unit is split over: all, or those on one host.
        const int n = k.shard == Shard::none     ? 1
                      : k.shard == Shard::hybrid ? k.ranks_per_host / k.stages
                                                 : k.replicas;
        REQUIRE((t.resident_grads == 0) == grads_freed,
                what.str() << ": " << t.resident_grads
                           << " bytes of the stage's full-size gradients resident between steps");
        REQUIRE((t.resident_values == 0) == values_freed,
                what.str() << ": " << t.resident_values
                           << " bytes of the stage's full-size parameters resident between steps");
        REQUIRE(t.report.mode == k.shard && t.report.ranks == n,
                what.str() << ": the memory report says " << shard_name(t.report.mode) << " over "
                           << t.report.ranks << " ranks");
        const size_t full = t.report.gradients_in_flight;
        REQUIRE(grads_freed == (full > 0 && t.report.gradients * static_cast<size_t>(n) == full),
                what.str() << ": the report's gradients " << t.report.gradients
                           << " bytes, in flight " << full);
      },
      ro);
  testing::expect_all_ok(rs);
}

TEST(Pipeline, TwoStagesEqualUnpipelinedForEveryMicroBatchCount) {
  for (int m = 1; m <= 8; ++m)
    for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b}) {
      Case k;
      k.micro = m;
      k.schedule = s;
      k.steps = 2;
      equals_unpipelined(k);
    }
}

TEST(Pipeline, ThreeAndFourStagesEqualUnpipelined) {
  for (int stages : {3, 4})
    for (int m : {1, 3, 8})
      for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b}) {
        Case k;
        k.stages = stages;
        k.micro = m;
        k.schedule = s;
        k.steps = 2;
        equals_unpipelined(k);
      }
}

TEST(Pipeline, TwoStagesTimesTwoReplicasWithAccumulationEqualUnpipelined) {
  Case k;
  k.replicas = 2;
  k.micro = 3;
  k.accum = 2;
  equals_unpipelined(k);
}

// 2 stages x 2 replicas, each stage sharded over its replicas by `shard`, with AdamW (its state
// sharded) and clipping (the norm summed over every stage's and replica's chunk).
Case sharded_case(Shard shard) {
  Case k;
  k.replicas = 2;
  k.micro = 3;
  k.shard = shard;
  k.optimizer = "adamw";
  k.lr = 1e-3f;
  k.clip = 0.05f;
  return k;
}

// ZeRO-1 over the replicas of each stage, and SyncBatchNorm over the replicas.
TEST(Pipeline, StageReplicasWithZero1AndSyncBnEqualUnpipelined) {
  Case k = sharded_case(Shard::zero1);
  equals_unpipelined(k);
  k.replicas = 3;
  k.stages = 2;
  k.shard = Shard::none;
  k.sync_bn = true;
  k.optimizer = "sgd";
  k.lr = 0.05f;
  k.clip = 0;
  equals_unpipelined(k);
}

// ZeRO-2 and ZeRO-3 over the replicas of each stage: the same parameters as unpipelined
// training (AdamW, clipping, accumulation, both schedules, 2 and 3 replicas, recomputation
// reading zero3's gathered parameters again in backward), and between steps the kernel holds
// none of the stage's full-size gradients (zero2, zero3) or parameters (zero3).
TEST(Pipeline, StageReplicasWithZero2AndZero3EqualUnpipelined) {
  for (Shard shard : {Shard::zero2, Shard::zero3})
    for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b}) {
      Case k = sharded_case(shard);
      k.accum = 2;
      k.schedule = s;
      equals_unpipelined(k);
    }
  Case k;
  k.stages = 2;
  k.replicas = 3;
  k.micro = 2;
  k.shard = Shard::zero3;
  k.recompute = true;
  equals_unpipelined(k);
}

// Hybrid over two emulated hosts of 4 ranks: 2 stages x 4 replicas, each stage's 2 replicas on
// a host sharded (zero3), each chunk all-reduced with its copy on the other host. The same
// parameters as unpipelined training, clipping summing every piece once. Hosts that hold
// different numbers of a stage's replicas are refused on every rank, naming both counts.
TEST(Pipeline, HybridShardsAStageOnEachHostAndReducesAcrossHosts) {
  Case k = sharded_case(Shard::hybrid);
  k.replicas = 4;
  k.micro = 2;
  k.ranks_per_host = 4;
  equals_unpipelined(k);

  RunOptions ro;
  ro.timeout_s = 60;
  ro.ranks_per_host = 4;  // host 0: replicas 0 and 1; host 1: replica 2
  auto rs = run_ranks(
      6,
      [&](int) {
        tensor::set_threads(1);
        auto c = comm::init();
        auto m = nn::make_model("smallcnn", nn::ModelOptions{1, 3, kPx, 4});
        PipelineOptions o;
        o.stages = 2;
        o.micro_batches = 2;
        o.shard = Shard::hybrid;
        try {
          Pipeline p(*m, c, o, {kMicro, 1, kPx, kPx});
        } catch (const Error& e) {
          const std::string msg = e.what();
          REQUIRE(msg.find("every host must hold as many replicas of every stage") !=
                          std::string::npos &&
                      msg.find("another host has") != std::string::npos,
                  "the refusal does not say why: " << msg);
          return;
        }
        REQUIRE(false, "uneven hosts were accepted");
      },
      ro);
  testing::expect_all_ok(rs);
}

TEST(Pipeline, RecomputationEqualsUnpipelined) {
  Case k;
  k.stages = 3;
  k.micro = 4;
  k.recompute = true;
  equals_unpipelined(k);
}

TEST(Pipeline, ResNetBlocksEqualUnpipelined) {
  Case k;
  k.model = "resnet18";
  k.stages = 3;
  k.micro = 3;
  k.steps = 2;
  k.lr = 1e-4f;  // ResNets on these inputs are chaotic at larger rates (see sharded_test.cc)
  equals_unpipelined(k);
}

// The two schedules in one process each: the same parameters; 1F1B's peak activations within
// S/M of GPipe's (plus 10% and the receive buffers' few kilobytes).
TEST(Pipeline, OneFOneBEqualsGPipeInLessMemory) {
  RunOptions ro;
  ro.timeout_s = 120;
  auto rs = run_ranks(
      4,
      [&](int rank) {
        tensor::set_threads(1);
        auto c = comm::init();
        Case k;
        k.stages = 4;
        k.micro = 8;
        k.model = "resnet18";
        k.lr = 1e-4f;
        k.px = 64;  // activations, not the weights' scratch, dominate
        k.steps = 2;
        k.schedule = Schedule::gpipe;
        Trained g = pipelined(k, c);
        k.schedule = Schedule::one_f_one_b;
        Trained f = pipelined(k, c);
        // Both add the micro-batches' gradients in the same order: the same bits.
        expect_equal(*g.model, *f.model, true, 1e-7,
                     "1f1b against gpipe, rank " + std::to_string(rank));
        const double bound =
            1.1 * 4.0 / 8.0 * static_cast<double>(g.stats.peak_activations) + 65536;
        REQUIRE(static_cast<double>(f.stats.peak_activations) <= bound,
                "stage " << rank << ": 1f1b held " << f.stats.peak_activations
                         << " bytes of activations at peak, gpipe " << g.stats.peak_activations
                         << "; the bound is " << bound);
      },
      ro);
  testing::expect_all_ok(rs);
}

TEST(Pipeline, NeighboursThatDisagreeOnShapesFailBeforeTraining) {
  RunOptions ro;
  ro.timeout_s = 60;
  auto rs = run_ranks(
      2,
      [&](int rank) {
        tensor::set_threads(1);
        auto c = comm::init();
        auto m = nn::make_model("smallcnn", nn::ModelOptions{1, 3, kPx, 4});
        PipelineOptions o;
        o.stages = 2;
        o.micro_batches = 2;
        // Rank 1 thinks the images are twice as large.
        const int64_t px = rank == 0 ? kPx : 2 * kPx;
        try {
          Pipeline p(*m, c, o, {kMicro, 1, px, px});
        } catch (const Error& e) {
          const std::string msg = e.what();
          REQUIRE(rank == 1, "rank 0 failed: " << msg);
          REQUIRE(msg.find("stage 0 sends activations of shape") != std::string::npos &&
                      msg.find("stage 1 expects") != std::string::npos,
                  "the error does not name both sides: " << msg);
          return;
        }
        REQUIRE(rank == 0, "rank 1 accepted the wrong shape");
      },
      ro);
  testing::expect_all_ok(rs);
}

TEST(Pipeline, AKilledStageMakesTheOthersFailNamingIt) {
  RunOptions ro;
  ro.timeout_s = 90;
  ro.env["COHORT_TIMEOUT"] = "60";
  auto rs = run_ranks(
      3,
      [&](int rank) {
        tensor::set_threads(1);
        auto c = comm::init();
        auto m = nn::make_model("smallcnn", nn::ModelOptions{1, 3, kPx, 4});
        PipelineOptions o;
        o.stages = 3;
        o.micro_batches = 4;
        Pipeline p(*m, c, o, {kMicro, 1, kPx, kPx});
        const std::vector<int> l = labels_of(0, 0, 4);
        auto loss = [&](const nn::Var& logits, int i) {
          return nn::cross_entropy(
              logits, std::vector<int>(l.begin() + i * kMicro, l.begin() + (i + 1) * kMicro));
        };
        for (int s = 0; s < 5; ++s) {
          if (s == 2 && rank == 1) kill(getpid(), SIGKILL);
          p.zero_grad();
          p.run(batch(0, 0, 4), loss);
          p.finish();
        }
      },
      ro);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_FALSE(rs[1].exited);
  EXPECT_EQ(rs[1].signal, SIGKILL);
  for (int r : {0, 2}) {
    const testing::RankResult& x = rs[static_cast<size_t>(r)];
    EXPECT_TRUE(x.exited && x.code != 0) << "rank " << r << " did not fail:\n" << x.output;
    EXPECT_LT(x.seconds, 45) << "rank " << r << " took " << x.seconds << " s to fail";
    EXPECT_NE(x.output.find("stage 1 (rank 1)"), std::string::npos)
        << "rank " << r << " does not name the dead stage:\n"
        << x.output;
  }
}

// The CLI end to end: `cohort train` on 2 stages ends with the weights of an unpipelined run
// that accumulates the same micro-batches; the run reports the cut, every stage and the bubble;
// what is not built yet is refused by name; `cohort bench train` writes the per-stage JSON.
TEST(Pipeline, CohortTrainEqualsAccumulatedTrainingAndReports) {
  testing::TempDir dir;
  const std::string bin = testing::cohort_bin();
  const std::string scans = testing::make_scan_set(dir.file("scans"), 32, 32);
  const std::string common = " train --model smallcnn --data " + scans +
                             " --epochs 1 --image-size 32 --lr 0.05 --threads 1 --seed 5 ";
  auto piped = testing::sh(bin + " launch --nproc-per-node 2 -- " + bin + common +
                           "--batch 8 --pipeline-stages 2 --micro-batches 4 --deferred-batch-norm "
                           "--pipeline-schedule gpipe --save " +
                           dir.file("piped") + " --json " + dir.file("piped.json"));
  ASSERT_EQ(piped.code, 0) << piped.out;
  for (const char* want : {"pipeline: 2 stages x 1 replicas, 4 micro-batches, gpipe",
                           "stage 1: ", "train: rank 1 (stage 1): compute", "pipeline bubble",
                           "% by the formula (S-1)/(M+S-1)"}) {
    EXPECT_NE(piped.out.find(want), std::string::npos) << want << " missing:\n" << piped.out;
  }
  auto alone = testing::sh(bin + common + "--batch 2 --accum-steps 4 --save " + dir.file("alone"));
  ASSERT_EQ(alone.code, 0) << alone.out;
  auto a = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 32, 0});
  auto b = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 32, 0});
  nn::load_weights(*a, dir.file("piped") + "/model.safetensors");
  nn::load_weights(*b, dir.file("alone") + "/model.safetensors");
  for (nn::Param* p : a->params()) {
    EXPECT_LT(testing::max_rel_diff(p->value, b->find_param(p->name)->value), 2e-4) << p->name;
  }
  nlohmann::json log = nlohmann::json::parse(std::ifstream(dir.file("piped.json")));
  EXPECT_GT(log["summary"]["pipeline_bubble"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(log["summary"]["pipeline_bubble_formula"].get<double>(), 0.2);

  // Per-stage checkpoints: stopped after 2 of 4 steps and resumed on the same layout, the run
  // ends with the uninterrupted run's weights; resumed by one rank accumulating the same
  // micro-batches (the checkpoint reshards), too; consolidated into one weights file.
  const std::string piped_args =
      "--batch 8 --pipeline-stages 2 --micro-batches 4 "
      "--deferred-batch-norm --pipeline-schedule gpipe ";
  auto first = testing::sh(bin + " launch --nproc-per-node 2 -- " + bin + common + piped_args +
                           "--max-steps 2 --checkpoint-dir " + dir.file("ck"));
  ASSERT_EQ(first.code, 0) << first.out;
  auto inspect = testing::sh(bin + " checkpoint inspect " + dir.file("ck"));
  EXPECT_NE(inspect.out.find("under pipeline-2x1"), std::string::npos) << inspect.out;
  auto resumed = testing::sh(bin + " launch --nproc-per-node 2 -- " + bin + common + piped_args +
                             "--resume " + dir.file("ck") + " --save " + dir.file("resumed"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  auto alone_resumed = testing::sh(bin + common + "--batch 2 --accum-steps 4 --resume " +
                                   dir.file("ck") + " --save " + dir.file("alone-resumed"));
  ASSERT_EQ(alone_resumed.code, 0) << alone_resumed.out;
  auto consolidated = testing::sh(bin + " checkpoint consolidate " + dir.file("ck") + " --out " +
                                  dir.file("ck.safetensors"));
  ASSERT_EQ(consolidated.code, 0) << consolidated.out;
  for (const char* run : {"resumed", "alone-resumed"}) {
    auto c = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 32, 0});
    nn::load_weights(*c, dir.file(run) + "/model.safetensors");
    for (nn::Param* p : a->params()) {
      EXPECT_LT(testing::max_rel_diff(c->find_param(p->name)->value, p->value), 2e-4)
          << run << ": " << p->name;
    }
  }
  // The consolidated file holds every parameter under the model's names (a strict load).
  auto halfway = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 32, 0});
  EXPECT_NO_THROW(nn::load_weights(*halfway, dir.file("ck.safetensors")));

  // 2 stages x 2 replicas with SyncBatchNorm and the replicas sharded: ZeRO-1 uninterrupted;
  // ZeRO-3 stopped halfway (every rank wrote its chunk); resumed under ZeRO-2. All three shard
  // the same chunks and reduce them alike, so the run ends with the uninterrupted run's weights.
  const std::string sharded =
      "--batch 4 --pipeline-stages 2 --micro-batches 2 --sync-bn --optimizer adamw ";
  auto whole = testing::sh(bin + " launch --nproc-per-node 4 -- " + bin + common + sharded +
                           "--shard zero1 --save " + dir.file("z-whole"));
  ASSERT_EQ(whole.code, 0) << whole.out;
  EXPECT_NE(whole.out.find("(ZeRO-1 over a stage's replicas, SyncBatchNorm)"), std::string::npos)
      << whole.out;
  auto half = testing::sh(bin + " launch --nproc-per-node 4 -- " + bin + common + sharded +
                          "--shard zero3 --max-steps 2 --checkpoint-dir " + dir.file("zck"));
  ASSERT_EQ(half.code, 0) << half.out;
  EXPECT_NE(half.out.find("(ZeRO-3: parameters gathered once per step"), std::string::npos)
      << half.out;
  auto rest =
      testing::sh(bin + " launch --nproc-per-node 4 -- " + bin + common + sharded +
                  "--shard zero2 --resume " + dir.file("zck") + " --save " + dir.file("z-resumed"));
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("(ZeRO-2: gradients reduce-scattered once per step"), std::string::npos)
      << rest.out;
  {
    auto w = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 32, 0});
    auto z = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 32, 0});
    nn::load_weights(*w, dir.file("z-whole") + "/model.safetensors");
    nn::load_weights(*z, dir.file("z-resumed") + "/model.safetensors");
    for (nn::Param* p : w->params()) {
      EXPECT_LT(testing::max_rel_diff(z->find_param(p->name)->value, p->value), 1e-6)
          << "zero3 stopped, resumed under zero2: " << p->name;
    }
  }
  auto odd = testing::sh(bin + " launch --nproc-per-node 3 -- " + bin + common +
                         "--batch 8 --pipeline-stages 2 --micro-batches 4");
  EXPECT_NE(odd.code, 0);
  EXPECT_NE(odd.out.find("--pipeline-stages 2 does not divide the 3 ranks"), std::string::npos)
      << odd.out;

  auto bench = testing::sh(bin + " launch --nproc-per-node 2 -- " + bin +
                           " bench train --model smallcnn --batch 8 --image-size 32 --steps 2 "
                           "--warmup 1 --pipeline-stages 2 --micro-batches 4 --json " +
                           dir.file("bench.json"));
  ASSERT_EQ(bench.code, 0) << bench.out;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir.file("bench.json")));
  ASSERT_EQ(j["pipeline"]["per_rank"].size(), 2u);
  EXPECT_EQ(j["pipeline"]["per_rank"][1]["peak_in_flight"], 1);
  EXPECT_EQ(j["pipeline"]["per_rank"][0]["peak_in_flight"], 2);
  EXPECT_GT(j["pipeline"]["per_rank"][1]["ms_compute"].get<double>(), 0.0);
}

}  // namespace
}  // namespace cohort::dist
