// Data-parallel training over real rank processes: N ranks with batch B end with the parameters
// of 1 rank with batch N x B (SyncBatchNorm, so batch statistics match too), with accumulation
// and with buckets that split the model finely; the first bucket goes out before backward ends;
// compressed buckets stay close.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "cohort/dist/ddp.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/model.h"
#include "cohort/train/trainer.h"
#include "testing/compare.h"
#include "testing/half_used.h"
#include "testing/ranks.h"
#include "testing/scans.h"
#include "testing/temp_dir.h"

namespace cohort::dist {
namespace {

using testing::run_ranks;
using testing::RunOptions;
using train::Targets;

RunOptions timeout(double seconds) {
  RunOptions o;
  o.timeout_s = seconds;
  return o;
}

constexpr int kGlobal = 8;  // samples per global micro-batch

// The fixed data: sample i of global micro-batch k.
tensor::Tensor samples(int k, int first, int count) {
  tensor::Tensor all = tensor::Tensor::empty({kGlobal, 1, 16, 16});
  nn::init::normal(all, 0.0, 1.0, 1000 + static_cast<uint64_t>(k));
  tensor::Tensor part = tensor::Tensor::empty({count, 1, 16, 16});
  std::memcpy(part.raw(), all.data<float>() + first * 256, static_cast<size_t>(count) * 256 * 4);
  return part.channels_last();
}

Targets labels(int first, int count) {
  Targets t;
  for (int i = first; i < first + count; ++i) t.classes.push_back(i % 3);
  return t;
}

// `steps` optimiser steps of `accum` micro-batches; this process holds `count` samples of each
// global micro-batch starting at `first`.
void train(nn::Model& m, nn::Optimizer& opt, Ddp* ddp, int steps, int accum, int first, int count) {
  for (int s = 0; s < steps; ++s) {
    m.zero_grad();
    for (int k = 0; k < accum; ++k) {
      const int micro = s * accum + k;
      // Each micro-batch's loss is a mean over its samples; 1/accum makes the sum the mean.
      train::forward_backward(m, samples(micro, first, count), labels(first, count), 0.0f,
                              1.0f / static_cast<float>(accum), ddp, k == accum - 1, nullptr);
    }
    if (ddp) ddp->finish();
    opt.step(0.05f);
  }
}

using testing::max_rel_diff;

void equivalence(int world, int accum, DdpOptions o, double tol) {
  const int per_rank = kGlobal / world;
  auto rs = run_ranks(
      world,
      [&](int rank) {
        auto c = comm::init();
        auto m = nn::make_model("smallcnn", nn::ModelOptions{1, 3, 16, 4});
        nn::OptimOptions oo;
        oo.momentum = 0.9f;
        // Rank 1 starts from other weights: the broadcast must make them rank 0's.
        if (rank == 1) m->reset_parameters(77);
        Ddp ddp(*m, c, o);
        auto opt = nn::make_optimizer(ddp.optim_target(), oo);  // where Ddp put the gradients
        ddp.broadcast_from_rank0();
        sync_batch_norm(*m, c);
        train(*m, *opt, &ddp, 3, accum, rank * per_rank, per_rank);
        if (rank != 0) return;
        // One process, the whole global batch, plain BatchNorm.
        auto ref = nn::make_model("smallcnn", nn::ModelOptions{1, 3, 16, 4});
        auto ref_opt = nn::make_optimizer(*ref, oo);
        train(*ref, *ref_opt, nullptr, 3, accum, 0, kGlobal);
        const double d = max_rel_diff(m->flat_values(), ref->flat_values());
        REQUIRE(d < tol, "world " << world << " accum " << accum << ": parameters differ from "
                                  << "the 1-rank run by " << d << " (relative)");
        const double bn = max_rel_diff(m->find_buffer("features.1.running_var")->value,
                                       ref->find_buffer("features.1.running_var")->value);
        REQUIRE(bn < tol, "running_var differs by " << bn);
      },
      timeout(120));
  testing::expect_all_ok(rs);
}

TEST(Ddp, TwoRanksEqualOneRankWithTheWholeBatch) {
  equivalence(2, 1, DdpOptions{}, 2e-4);
}

TEST(Ddp, FourRanksWithAccumulationAndBucketsThatSplitTheModel) {
  DdpOptions o;
  o.first_bucket_mb = 0.001;
  o.bucket_mb = 0.01;  // a few parameters per bucket
  equivalence(4, 2, o, 2e-4);
}

TEST(Ddp, Bf16CompressedBucketsStayClose) {
  DdpOptions o;
  o.compression = Compression::bf16;
  equivalence(2, 1, o, 3e-2);
}

TEST(Ddp, F16CompressedBucketsStayClose) {
  DdpOptions o;
  o.compression = Compression::f16;
  equivalence(2, 1, o, 3e-3);  // f16 keeps 11 bits of mantissa, bf16 8
}

// Compression really puts the buckets on the wire in its type: every bucket gets a staging
// tensor of that type covering its range; without compression there is none.
TEST(Ddp, CompressionStagesEveryBucketInTheWireType) {
  auto m = nn::make_model("resnet18", nn::ModelOptions{});
  auto rs = run_ranks(1, [&](int) {
    auto c = comm::init();
    for (Compression k : {Compression::none, Compression::bf16, Compression::f16}) {
      DdpOptions o;
      o.compression = k;
      Ddp ddp(*m, c, o);
      for (const Bucket& b : ddp.buckets()) {
        if (k == Compression::none) {
          REQUIRE(!b.wire.defined(), "a staging tensor without compression");
          continue;
        }
        const tensor::DType want =
            k == Compression::bf16 ? tensor::DType::bf16 : tensor::DType::f16;
        REQUIRE(b.wire.defined() && b.wire.dtype() == want, compression_name(k) << " bucket");
        REQUIRE(b.wire.numel() == static_cast<int64_t>(b.end - b.begin), "staging size");
      }
    }
  });
  testing::expect_all_ok(rs);
}

TEST(Ddp, BucketsCoverEveryParameterInReverseOrder) {
  auto m = nn::make_model("resnet18", nn::ModelOptions{});
  // A communicator of one rank is enough to lay out buckets.
  auto rs = run_ranks(1, [&](int) {
    Ddp ddp(*m, comm::init(), DdpOptions{});
    const auto& b = ddp.buckets();
    REQUIRE(b.size() >= 2, "resnet18 in " << b.size() << " buckets");
    // The first holds fc (registered last) and is about 1 MiB or one parameter.
    REQUIRE(b[0].params.front() == static_cast<int>(m->params().size()) - 1, "first bucket");
    REQUIRE(b.back().begin == 0, "the last bucket ends at the first parameter");
    for (size_t i = 1; i < b.size(); ++i)
      REQUIRE(b[i].end == b[i - 1].begin, "buckets " << i - 1 << " and " << i << " not adjacent");
    REQUIRE(b[0].end == static_cast<size_t>(m->flat_grads().numel()), "first bucket end");
  });
  testing::expect_all_ok(rs);
}

TEST(Ddp, FirstBucketGoesOutBeforeBackwardEnds) {
  auto rs = run_ranks(2, [](int rank) {
    auto c = comm::init();
    auto m = nn::make_model("resnet18", nn::ModelOptions{3, 10, 64, 1});
    Ddp ddp(*m, c, DdpOptions{});
    auto opt = nn::make_optimizer(ddp.optim_target(), nn::OptimOptions{});
    ddp.broadcast_from_rank0();
    tensor::Tensor x = tensor::Tensor::empty({4, 3, 64, 64});
    nn::init::normal(x, 0, 1, 5 + static_cast<uint64_t>(rank));
    Targets t;
    t.classes = {1, 2, 3, 4};
    train::train_step(*m, *opt, x.channels_last(), t, 0.01f, 0.0f, nullptr, &ddp);
    const double first = ddp.first_launch_s(), end = ddp.backward_end_s();
    REQUIRE(first > 0 && first < 0.5 * end,
            "first bucket launched at " << first << " s, backward ended at " << end << " s");
    for (size_t i = 1; i < ddp.buckets().size(); ++i)
      REQUIRE(ddp.buckets()[i].launched_at >= ddp.buckets()[i - 1].launched_at,
              "bucket " << i << " launched before bucket " << i - 1);
    // On one host the gradients lie in shared memory: the large buckets read them there.
    int shared = 0;
    for (const Bucket& b : ddp.buckets()) {
      if ((b.end - b.begin) * sizeof(float) < (256u << 10)) continue;
      REQUIRE(b.work.algorithm() == "shared",
              "a bucket of " << (b.end - b.begin) * 4 << " bytes ran " << b.work.algorithm());
      ++shared;
    }
    REQUIRE(shared > 0, "no bucket of 256 KiB or more");
  });
  testing::expect_all_ok(rs);
}

// Validation sharded over 3 ranks gives the figures of one rank over the whole set.
TEST(Ddp, ShardedValidationEqualsOneRank) {
  testing::TempDir tmp("cohort-val");
  // 50: not a multiple of 3 x batch, so padding and a short last batch.
  const std::string dir = testing::make_scan_set(tmp.file("scans"), 50, 24);
  auto options = [](int world, int rank) {
    data::PipelineOptions po;
    po.batch = 4;
    po.size = 24;
    po.train = false;
    po.shuffle = false;
    po.resize = 24;
    po.layout = data::Layout::nhwc;
    po.world = world;
    po.rank = rank;
    return po;
  };
  auto rs = run_ranks(3, [&](int rank) {
    auto c = comm::init();
    auto m = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 24, 6});
    data::Pipeline p(data::open_source(dir), options(3, rank));
    const train::EvalResult r = train::evaluate(*m, p, false, 2, c.get());
    data::Pipeline whole(data::open_source(dir), options(1, 0));
    const train::EvalResult one = train::evaluate(*m, whole, false, 2, nullptr);
    REQUIRE(r.samples == 50 && one.samples == 50, r.samples << " and " << one.samples);
    REQUIRE(std::abs(r.loss - one.loss) < 1e-6 && r.accuracy == one.accuracy &&
                std::abs(r.auc - one.auc) < 1e-9,
            "sharded " << r.loss << "/" << r.accuracy << "/" << r.auc << " vs " << one.loss << "/"
                       << one.accuracy << "/" << one.auc);
  });
  testing::expect_all_ok(rs);
}

// A parameter the forward never uses: its bucket still goes out and nobody hangs.
using testing::HalfUsed;

TEST(Ddp, ParametersWithoutGradientsDoNotHang) {
  auto rs = run_ranks(2, [](int rank) {
    auto c = comm::init();
    nn::Model m("halfused", std::make_unique<HalfUsed>(), nn::ModelOptions{});
    DdpOptions o;
    o.first_bucket_mb = 1e-5;  // one parameter per bucket
    o.bucket_mb = 1e-5;
    Ddp ddp(m, c, o);
    ddp.broadcast_from_rank0();
    m.zero_grad();
    tensor::Tensor x = tensor::Tensor::full({2, 4}, 1.0f + static_cast<float>(rank));
    Targets t;
    t.classes = {0, 2};
    train::forward_backward(m, x, t, 0.0f, 1.0f, &ddp, true, nullptr);
    ddp.finish();
    // The used layer's bias gradient is the mean of both ranks'; the unused one's stays zero.
    float g = m.find_param("used.bias")->grad.data<float>()[0];
    float both[2];
    c->allgather(&g, both, 1, comm::DataType::f32).wait();
    REQUIRE(both[0] == both[1] && g != 0.0f, "used.bias grads " << both[0] << " " << both[1]);
    REQUIRE(m.find_param("unused.weight")->grad.data<float>()[0] == 0.0f, "unused grad");
  });
  testing::expect_all_ok(rs);
}

}  // namespace
}  // namespace cohort::dist
