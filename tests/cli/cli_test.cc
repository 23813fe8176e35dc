// The CLI's promises from the README, run as a user runs them (COHORT_BIN): make-dataset in
// DICOM, pack, bench data --digest over folders and shards, topo --all-ranks.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "testing/shell.h"
#include "testing/temp_dir.h"

namespace {

using cohort::testing::cohort_bin;
using cohort::testing::sh;
using cohort::testing::TempDir;
namespace fs = std::filesystem;

// The run digest `cohort bench data --digest` prints last ("digest <hex>").
std::string run_digest(const std::string& out) {
  const size_t at = out.rfind("\ndigest ");
  return at == std::string::npos ? "" : out.substr(at + 8, 16);
}

std::string bench_data(const std::string& source, int seed, const std::string& extra = "") {
  return "timeout 60 " + cohort_bin() + " bench data --source " + source +
         " --batch 4 --workers 2 --size 32 --epochs 1 --digest --seed " + std::to_string(seed) +
         " " + extra;
}

// DICOM scans made by make-dataset decode through the pipeline; the same seed gives the same
// bytes (digest), another seed other bytes; packed into shards, the same samples give the same
// digest as the folder they came from.
TEST(Cli, DicomDatasetPackAndDigest) {
  TempDir dir;
  const std::string scans = dir.file("dcm"), shards = dir.file("shards");
  auto made = sh("timeout 60 " + cohort_bin() + " make-dataset scans --out " + scans +
                 " --count 12 --format dicom --size 64 --seed 3");
  ASSERT_EQ(made.code, 0) << made.out;
  int dcm = 0;
  for (const auto& e : fs::recursive_directory_iterator(scans))
    dcm += e.path().extension() == ".dcm";
  EXPECT_EQ(dcm, 12) << made.out;

  auto a = sh(bench_data(scans, 5)), b = sh(bench_data(scans, 5)), c = sh(bench_data(scans, 6));
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("images 12  skipped 0"), std::string::npos) << a.out;
  ASSERT_EQ(run_digest(a.out).size(), 16u) << a.out;
  EXPECT_EQ(run_digest(a.out), run_digest(b.out)) << a.out << b.out;
  EXPECT_NE(run_digest(a.out), run_digest(c.out)) << a.out << c.out;
  // --warmup: the clock starts after the first batches, which are taken all the same; taking
  // every batch untimed is an error naming the flag.
  auto w = sh(bench_data(scans, 5, "--warmup 2"));
  ASSERT_EQ(w.code, 0) << w.out;
  EXPECT_NE(w.out.find("images 12  skipped 0"), std::string::npos) << w.out;
  EXPECT_NE(w.out.find("(timed after 2 warm-up batches)"), std::string::npos) << w.out;
  EXPECT_EQ(run_digest(w.out), run_digest(a.out)) << w.out;
  auto none = sh(bench_data(scans, 5, "--warmup 3"));  // 12 images in batches of 4
  EXPECT_NE(none.code, 0) << none.out;
  EXPECT_NE(none.out.find("--warmup 3 takes every one of the 3 batches"), std::string::npos)
      << none.out;

  auto packed =
      sh("timeout 60 " + cohort_bin() + " pack " + scans + " --out " + shards + " --shards 3");
  ASSERT_EQ(packed.code, 0) << packed.out;
  int files = 0;
  for (const auto& e : fs::directory_iterator(shards)) files += e.path().extension() == ".cshard";
  EXPECT_EQ(files, 3) << packed.out;
  auto s = sh(bench_data(shards, 5));
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("images 12  skipped 0"), std::string::npos) << s.out;
  EXPECT_EQ(run_digest(s.out), run_digest(a.out)) << s.out;
}

// The pipeline's other outputs from the CLI: bf16 and u8, channels-last, evaluation mode; each
// decodes every file, and differs in bytes from the f32 run.
TEST(Cli, BenchDataOutputTypesAndLayouts) {
  TempDir dir;
  const std::string scans = dir.file("png");
  ASSERT_EQ(sh("timeout 60 " + cohort_bin() + " make-dataset scans --out " + scans +
               " --count 8 --format png --size 48")
                .code,
            0);
  // Three channels, so that channels-last differs from NCHW in bytes.
  const std::string f32 = run_digest(sh(bench_data(scans, 1, "--channels 3")).out);
  ASSERT_EQ(f32.size(), 16u);
  for (const char* extra : {"--out-type bf16", "--out-type u8", "--layout nhwc", "--eval"}) {
    auto r = sh(bench_data(scans, 1, std::string("--channels 3 ") + extra));
    EXPECT_EQ(r.code, 0) << extra << "\n" << r.out;
    EXPECT_NE(r.out.find("images 8  skipped 0"), std::string::npos) << extra << "\n" << r.out;
    EXPECT_NE(run_digest(r.out), f32) << extra;
  }
}

// topo --all-ranks: every rank prints its own view (transports from itself).
TEST(Cli, TopoAllRanks) {
  auto r = sh("timeout 60 " + cohort_bin() + " launch --nproc-per-node 2 -- " + cohort_bin() +
              " topo --all-ranks");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 0] transport from rank 0: 1=shm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] transport from rank 1: 0=shm"), std::string::npos) << r.out;
  auto one =
      sh("timeout 60 " + cohort_bin() + " launch --nproc-per-node 2 -- " + cohort_bin() + " topo");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_EQ(one.out.find("[rank 1] transport from rank 1"), std::string::npos) << one.out;
}

}  // namespace
