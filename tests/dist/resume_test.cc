// Resuming anywhere: a checkpoint whose position is no whole number of the new layout's global
// batches (2 -> 3 and 4 -> 3 ranks) goes on exactly: every sample of the epoch once, in the
// sampler's order, rank by rank and micro-batch by micro-batch (read back from --sample-log),
// the leftover as a shorter first step whose loss is averaged over its samples across ranks
// (ending with the weights of one process resuming the same checkpoint; SyncBatchNorm makes the
// split over ranks invisible to the arithmetic), a rank with no leftover sample still taking
// part in every collective (zero3). Where asked, or where the layout cannot (SyncBatchNorm with
// a rank left without a sample), the run repeats or skips the positions it names and goes on.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cohort/data/sampler.h"
#include "cohort/nn/model.h"
#include "cohort/nn/safetensors.h"
#include "testing/compare.h"
#include "testing/scans.h"
#include "testing/shell.h"
#include "testing/temp_dir.h"

namespace cohort::dist {
namespace {

constexpr size_t kSamples = 72;

// `cohort train` on `ranks` ranks (one process without the launcher).
std::string train(int ranks, const std::string& args) {
  const std::string bin = testing::cohort_bin();
  return "timeout 120 " +
         (ranks > 1 ? bin + " launch --nproc-per-node " + std::to_string(ranks) + " -- " : "") +
         bin + " train " + args;
}

std::string run_ok(const std::string& cmd) {
  const testing::ShellResult r = testing::sh(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  return r.out;
}

// (epoch, step, micro-batch, rank) -> the data set indices the rank trained.
using SampleLog = std::map<std::tuple<int64_t, int64_t, int, int>, std::vector<size_t>>;

SampleLog read_log(const std::string& prefix, int ranks) {
  SampleLog log;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(prefix + ".rank" + std::to_string(r));
    EXPECT_TRUE(in) << prefix << ".rank" << r;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      int64_t epoch = 0, step = 0;
      int micro = 0;
      l >> epoch >> step >> micro;
      std::vector<size_t>& got = log[{epoch, step, micro, r}];
      for (size_t i; l >> i;) got.push_back(i);
    }
  }
  return log;
}

// A micro-batch as the sampler defines it: global positions [from, to) of the epoch, dealt over
// `ranks` ranks from `from`.
struct Micro {
  int64_t step;
  int micro;
  size_t from, to;
};

// What each rank must have trained in each micro-batch, from the epoch's global order.
SampleLog expected(const std::vector<Micro>& micros, int ranks) {
  const std::vector<size_t> order = data::Sampler(kSamples, 1, 0, {}).global_order(0);
  SampleLog log;
  for (const Micro& m : micros) {
    for (int r = 0; r < ranks; ++r) {
      std::vector<size_t>& want = log[{0, m.step, m.micro, r}];
      for (size_t p = m.from + static_cast<size_t>(r); p < m.to; p += static_cast<size_t>(ranks))
        want.push_back(order[p]);
    }
  }
  return log;
}

// Micro-batches of `size` global samples over [from, to), numbered from (step, micro).
void add_steps(std::vector<Micro>& out, size_t from, size_t to, size_t size, int accum,
               int64_t step, int micro) {
  for (size_t p = from; p < to; p += size) {
    out.push_back({step, micro, p, p + size});
    if (++micro == accum) {
      micro = 0;
      ++step;
    }
  }
}

// How often each position of the epoch's order was trained, over several logs.
std::vector<int> times_seen(const std::vector<SampleLog>& logs) {
  const std::vector<size_t> order = data::Sampler(kSamples, 1, 0, {}).global_order(0);
  std::vector<int> by_index(kSamples, 0), by_position(kSamples, 0);
  for (const SampleLog& log : logs)
    for (const auto& [at, indices] : log)
      for (size_t i : indices) ++by_index.at(i);
  for (size_t p = 0; p < kSamples; ++p) by_position[p] = by_index[order[p]];
  return by_position;
}

void expect_same_weights(const std::string& got_dir, const std::string& ref_dir) {
  auto ref = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 24, 0});
  auto got = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 24, 0});
  nn::load_weights(*ref, ref_dir + "/model.safetensors");
  nn::load_weights(*got, got_dir + "/model.safetensors");
  for (nn::Param* p : ref->params()) {
    EXPECT_LT(testing::max_rel_diff(got->find_param(p->name)->value, p->value), 2e-3) << p->name;
  }
}

class ResumeAnywhere : public ::testing::Test {
 protected:
  testing::TempDir dir;
  std::string data = testing::make_scan_set(dir.file("scans"), kSamples, 24);
  std::string args(int batch, const std::string& extra) const {
    return "--model smallcnn --data " + data +
           " --epochs 1 --image-size 24 --optimizer adamw --lr 0.01 --log-every 100 --batch " +
           std::to_string(batch) + " " + extra;
  }
};

// 2 ranks x 4 stop after 8 samples; 3 ranks x 4 (global batch 12) go on: the first step trains
// positions 8..11 (2, 1 and 1 on ranks 0..2), then steps of 12 from position 12.
TEST_F(ResumeAnywhere, TwoToThreeRanksExactly) {
  run_ok(train(2, args(4, "--sync-bn --max-steps 1 --checkpoint-dir " + dir.file("ck") +
                              " --sample-log " + dir.file("first"))));
  const std::string out =
      run_ok(train(3, args(4, "--sync-bn --resume " + dir.file("ck") + " --save " +
                                  dir.file("three") + " --sample-log " + dir.file("rest"))));
  EXPECT_NE(out.find("train: resume: position 8 of epoch 0 is not a whole number of global "
                     "batches of 12 (3 ranks x batch 4 x accumulation 1): the first step trains "
                     "the 4 sample(s) left of step 1 of the epoch (positions 8..11): positions "
                     "8..11 dealt over the ranks (2, 1, 1 sample(s) on ranks 0..2)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 1 of the checkpoint (global batch 8) is step 0 of this layout"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 6/6"), std::string::npos) << out;

  std::vector<Micro> first, rest;
  add_steps(first, 0, 8, 8, 1, 0, 0);
  rest.push_back({0, 0, 8, 12});
  add_steps(rest, 12, kSamples, 12, 1, 1, 0);
  const SampleLog a = read_log(dir.file("first"), 2), b = read_log(dir.file("rest"), 3);
  EXPECT_EQ(a, expected(first, 2));
  EXPECT_EQ(b, expected(rest, 3));
  EXPECT_EQ(times_seen({a, b}), std::vector<int>(kSamples, 1));

  // One process resuming the same checkpoint with the same global batch ends alike: the
  // leftover's loss is averaged over its 4 samples, not over the ranks' means.
  run_ok(train(1, args(12, "--resume " + dir.file("ck") + " --save " + dir.file("one"))));
  expect_same_weights(dir.file("three"), dir.file("one"));
}

// 4 ranks x 4 stop after 32 samples; 3 ranks x 2 x accumulation 4 (global batch 24, micro-batches
// of 6) go on: step 2 of the epoch is positions 32..35 (the rest of its second micro-batch, 2, 1
// and 1 on ranks 0..2) and its last two whole micro-batches, 16 samples.
TEST_F(ResumeAnywhere, FourToThreeRanksExactlyWithAccumulation) {
  run_ok(train(4, args(4, "--sync-bn --max-steps 2 --checkpoint-dir " + dir.file("ck") +
                              " --sample-log " + dir.file("first"))));
  const std::string out =
      run_ok(train(3, args(2, "--sync-bn --accum-steps 4 --resume " + dir.file("ck") + " --save " +
                                  dir.file("three") + " --sample-log " + dir.file("rest"))));
  EXPECT_NE(out.find("the first step trains the 16 sample(s) left of step 2 of the epoch "
                     "(positions 32..47): positions 32..35 dealt over the ranks (2, 1, 1 "
                     "sample(s) on ranks 0..2), then 2 whole micro-batch(es)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 3/3"), std::string::npos) << out;

  std::vector<Micro> first, rest;
  add_steps(first, 0, 32, 16, 1, 0, 0);
  rest.push_back({1, 1, 32, 36});
  add_steps(rest, 36, kSamples, 6, 4, 1, 2);
  const SampleLog a = read_log(dir.file("first"), 4), b = read_log(dir.file("rest"), 3);
  EXPECT_EQ(a, expected(first, 4));
  EXPECT_EQ(b, expected(rest, 3));
  EXPECT_EQ(times_seen({a, b}), std::vector<int>(kSamples, 1));

  run_ok(train(
      1, args(6, "--accum-steps 4 --resume " + dir.file("ck") + " --save " + dir.file("one"))));
  expect_same_weights(dir.file("three"), dir.file("one"));
}

// 2 ranks x 5 stop after 10 samples; 3 ranks x 4 get 2 left of the first step: rank 2 has none
// and runs a stand-in with no weight, so that its zero3 gathers and reduce-scatters still meet
// the others'. Under SyncBatchNorm, which would count the stand-in, the run repeats positions
// 0..9 by default and names them; --resume-policy exact is refused there, naming both ways on.
TEST_F(ResumeAnywhere, TwoToThreeRanksWithARankLeftEmptyOrRepeated) {
  run_ok(train(2, args(5, "--max-steps 1 --checkpoint-dir " + dir.file("ck") + " --sample-log " +
                              dir.file("first"))));
  const SampleLog a = read_log(dir.file("first"), 2);
  std::vector<Micro> first;
  add_steps(first, 0, 10, 10, 1, 0, 0);
  EXPECT_EQ(a, expected(first, 2));

  const std::string out = run_ok(train(3, args(4, "--shard zero3 --resume " + dir.file("ck") +
                                                      " --sample-log " + dir.file("zero3"))));
  EXPECT_NE(out.find("positions 10..11 dealt over the ranks (1, 1, 0 sample(s) on ranks 0..2)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 6/6"), std::string::npos) << out;
  std::vector<Micro> rest;
  rest.push_back({0, 0, 10, 12});
  add_steps(rest, 12, kSamples, 12, 1, 1, 0);
  const SampleLog b = read_log(dir.file("zero3"), 3);
  EXPECT_EQ(b, expected(rest, 3));
  EXPECT_EQ(times_seen({a, b}), std::vector<int>(kSamples, 1));

  const testing::ShellResult refused =
      testing::sh(train(3, args(4, "--sync-bn --resume-policy exact --resume " + dir.file("ck"))));
  EXPECT_NE(refused.code, 0) << refused.out;
  EXPECT_NE(refused.out.find("position 10 of epoch 0 is not a whole number of global batches of "
                             "12 (3 ranks x batch 4 x accumulation 1), and this layout cannot "
                             "train the samples left of that step as a shorter first step "
                             "(SyncBatchNorm: the 2 sample(s) left of the micro-batch leave 1 of "
                             "the 3 ranks without one); --resume-policy repeat trains sample "
                             "positions 0..9 of epoch 0"),
            std::string::npos)
      << refused.out;
  EXPECT_NE(refused.out.find("--resume-policy skip skips sample positions 10..11 of epoch 0"),
            std::string::npos)
      << refused.out;

  const std::string again = run_ok(train(
      3, args(4, "--sync-bn --resume " + dir.file("ck") + " --sample-log " + dir.file("again"))));
  EXPECT_NE(again.find("train: resume: position 10 of epoch 0 is not a whole number of global "
                       "batches of 12 (3 ranks x batch 4 x accumulation 1): sample positions "
                       "0..9 of epoch 0 (data set indices "),
            std::string::npos)
      << again;
  EXPECT_NE(again.find(") are trained again (--resume-policy repeat, since SyncBatchNorm"),
            std::string::npos)
      << again;
  EXPECT_NE(again.find("step 6/6"), std::string::npos) << again;
  std::vector<Micro> repeated;
  add_steps(repeated, 0, kSamples, 12, 1, 0, 0);
  const SampleLog c = read_log(dir.file("again"), 3);
  EXPECT_EQ(c, expected(repeated, 3));
  std::vector<int> twice(kSamples, 1);
  for (size_t p = 0; p < 10; ++p) twice[p] = 2;
  EXPECT_EQ(times_seen({a, c}), twice);
}

// 4 ranks x 4 stop after 32 samples; 3 ranks x 2 x accumulation 4 asked to skip go on at the
// next micro-batch boundary, 36: positions 32..35 are named and never trained.
TEST_F(ResumeAnywhere, FourToThreeRanksSkipping) {
  run_ok(train(4, args(4, "--max-steps 2 --checkpoint-dir " + dir.file("ck") + " --sample-log " +
                              dir.file("first"))));
  const std::string out =
      run_ok(train(3, args(2, "--accum-steps 4 --resume-policy skip --resume " + dir.file("ck") +
                                  " --sample-log " + dir.file("rest"))));
  EXPECT_NE(out.find("train: resume: position 32 of epoch 0 is not a whole number of global "
                     "batches of 24 (3 ranks x batch 2 x accumulation 4): sample positions "
                     "32..35 of epoch 0 (data set indices "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(") are skipped (--resume-policy skip)"), std::string::npos) << out;
  EXPECT_NE(out.find("step 3/3"), std::string::npos) << out;
  std::vector<Micro> rest;
  add_steps(rest, 36, kSamples, 6, 4, 1, 2);
  const SampleLog b = read_log(dir.file("rest"), 3);
  EXPECT_EQ(b, expected(rest, 3));
  std::vector<int> once(kSamples, 1);
  for (size_t p = 32; p < 36; ++p) once[p] = 0;
  EXPECT_EQ(times_seen({read_log(dir.file("first"), 4), b}), once);
}

}  // namespace
}  // namespace cohort::dist
