// --device as a user meets it on a machine without a GPU: `cohort train` and `cohort bench
// train` stop with a clear error that says why (no device, or no GPU parts in the build), never a
// crash; and, where CUDA is built, the CPU-only link of the same CLI (cohort-cpu-only) holds
// nothing of CUDA's and trains on the CPU. The commands run with CUDA_VISIBLE_DEVICES empty, so
// that a machine with a GPU shows them the same machine without one.
#include <gtest/gtest.h>

#include <string>

#include "cohort/core/cuda.h"
#include "testing/shell.h"
#include "testing/temp_dir.h"

namespace {

using cohort::testing::cohort_bin;
using cohort::testing::sh;
using cohort::testing::TempDir;

// Runs `cmd` with every GPU hidden.
cohort::testing::ShellResult sh_without_gpu(const std::string& cmd) {
  return sh("CUDA_VISIBLE_DEVICES= " + cmd);
}

// What the runtime says when it finds no device: CUDA's reason, or that the build has no GPU
// parts.
std::string no_gpu_reason() {
  return cohort::cuda::built() ? "no CUDA device is usable on this machine"
                               : "this build of Cohort has no GPU parts";
}

// A clean refusal: exit status 1 with Cohort's error, not a signal or an abort.
void expect_refused(const cohort::testing::ShellResult& r, const std::string& says) {
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(says), std::string::npos) << "expected '" << says << "' in:\n" << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Aborted"), std::string::npos) << r.out;
}

TEST(DeviceCli, CudaWithoutAGpuIsAClearErrorNamingTheLocalRank) {
  TempDir dir;
  const std::string data = dir.file("none");
  // Single process: GPU 0.
  expect_refused(
      sh_without_gpu("timeout 60 " + cohort_bin() + " train --data " + data + " --device cuda"),
      "--device cuda (local rank 0, from one process): ");
  // Under torchrun's variables: LOCAL_RANK's GPU.
  expect_refused(sh_without_gpu("RANK=0 WORLD_SIZE=1 LOCAL_RANK=1 timeout 60 " + cohort_bin() +
                                " bench train --model resnet18 --batch 2 --image-size 32 --steps 1 "
                                "--device cuda"),
                 "--device cuda (local rank 1, from LOCAL_RANK): ");
  // From a config file, as from the flag.
  const std::string cfg = dir.file("run.toml");
  ASSERT_EQ(sh("printf 'data = \"" + data + "\"\\ndevice = \"cuda\"\\n' > " + cfg).code, 0);
  expect_refused(sh_without_gpu("timeout 60 " + cohort_bin() + " train --config " + cfg),
                 "--device cuda (local rank 0, from one process): ");
  // The reason is the runtime's own sentence.
  auto r =
      sh_without_gpu("timeout 60 " + cohort_bin() + " train --data " + data + " --device cuda");
  EXPECT_NE(r.out.find("--device cuda (local rank 0, from one process): " + no_gpu_reason()),
            std::string::npos)
      << r.out;
}

// The input pipeline's GPU stages from the CLI: bench data asks for this rank's GPU and says why
// there is none; train refuses them on the CPU, naming the flag.
TEST(DeviceCli, GpuPipelineStagesSayWhyTheyCannotRun) {
  TempDir dir;
  const std::string scans = dir.file("jpg");
  ASSERT_EQ(sh("timeout 60 " + cohort_bin() + " make-dataset scans --out " + scans +
               " --count 4 --format jpeg --size 32")
                .code,
            0);
  expect_refused(sh_without_gpu("timeout 60 " + cohort_bin() + " bench data --source " + scans +
                                " --batch 2 --size 16 --decode gpu --augment-on gpu"),
                 "--decode gpu --augment-on gpu (local rank 0): " + no_gpu_reason());
  expect_refused(sh("timeout 60 " + cohort_bin() + " train --data " + scans +
                    " --epochs 1 --batch 2 --image-size 16 --augment-on gpu"),
                 "--augment-on gpu needs --device cuda");
  auto bad = sh("timeout 60 " + cohort_bin() + " bench data --source " + scans + " --decode tpu");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("tpu"), std::string::npos) << bad.out;
  // The CPU stages say where they ran.
  auto cpu =
      sh("timeout 60 " + cohort_bin() + " bench data --source " + scans + " --batch 2 --size 16");
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("stages: decode cpu, augment cpu"), std::string::npos) << cpu.out;
}

TEST(DeviceCli, AnUnknownDeviceNamesTheChoices) {
  TempDir dir;
  auto r = sh("timeout 60 " + cohort_bin() + " train --data " + dir.file("none") + " --device tpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("'device' must be one of cpu, cuda, got 'tpu'"), std::string::npos) << r.out;
  r = sh("timeout 60 " + cohort_bin() + " bench train --device tpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tpu"), std::string::npos) << r.out;
}

// COHORT_BACKEND=nccl without a GPU, with 2 real ranks under cohort launch: rank 0's NCCL unique
// id reaches rank 1 through the store (both log the same one, before either can stop), then each
// rank reports in the store whether it has a GPU and reads every rank's report, and the ranks
// stop with the reason of the first that has none, named, before any enters NCCL, which could
// then wait for a peer forever. (The launcher stops the other rank once one fails: which rank's
// error is printed first is a race, so the test reads the first.)
TEST(DeviceCli, NcclBackendAgreesOnItsIdThenNamesTheRankWithoutAGpu) {
  auto r = sh_without_gpu("COHORT_BACKEND=nccl COHORT_LOG=debug COHORT_TIMEOUT=20 timeout 60 " +
                          cohort_bin() + " launch --nproc-per-node 2 -- " + cohort_bin() +
                          " bench comm");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_LT(r.seconds, 20) << r.out;
#ifdef COHORT_CUDA_BUILT
  std::string ids[2];
  for (int rank = 0; rank < 2; ++rank) {
    const std::string tag = "[rank " + std::to_string(rank) + "] cohort debug: nccl: rank " +
                            std::to_string(rank) + " has unique id ";
    const size_t at = r.out.find(tag);
    ASSERT_NE(at, std::string::npos) << r.out;
    ids[rank] = r.out.substr(at + tag.size(), 16);
  }
  EXPECT_EQ(ids[0], ids[1]) << r.out;
  EXPECT_NE(r.out.find("] cohort: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("COHORT_BACKEND=nccl: rank 0 cannot join"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("its GPU (local rank 0): " + no_gpu_reason()), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("COHORT_BACKEND=nccl: rank 0: this build of Cohort has no NCCL"),
            std::string::npos)
      << r.out;
#endif
  auto bad = sh("COHORT_BACKEND=gloo timeout 30 " + cohort_bin() + " bench comm");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("COHORT_BACKEND='gloo': expected cohort, mpi or nccl"), std::string::npos)
      << bad.out;
}

#ifdef COHORT_CPU_ONLY_BIN
// The CLI linked with the CUDA runtime's stand-in: no CUDA symbol in the binary (the CUDA build
// has CUDA's static runtime in it), --device cuda says the build has no GPU parts, and a
// training step runs on the CPU.
TEST(DeviceCli, TheCpuOnlyBuildLinksNothingOfCudaAndTrains) {
  const std::string cpu_only = COHORT_CPU_ONLY_BIN;
  EXPECT_EQ(sh("grep -q cudaGetDeviceCount " + cohort_bin()).code, 0);
  EXPECT_EQ(sh("grep -q cudaGetDeviceCount " + cpu_only).code, 1);
  auto ldd = sh("ldd " + cpu_only);
  ASSERT_EQ(ldd.code, 0) << ldd.out;
  EXPECT_EQ(ldd.out.find("libcud"), std::string::npos) << ldd.out;
  EXPECT_EQ(ldd.out.find("libnccl"), std::string::npos) << ldd.out;

  TempDir dir;
  expect_refused(
      sh("timeout 60 " + cpu_only + " train --data " + dir.file("none") + " --device cuda"),
      "this build of Cohort has no GPU parts");
  auto nccl = sh("COHORT_BACKEND=nccl timeout 30 " + cpu_only + " bench comm");
  EXPECT_NE(nccl.out.find("COHORT_BACKEND=nccl: rank 0: this build of Cohort has no NCCL"),
            std::string::npos)
      << nccl.out;
  auto run = sh("timeout 120 " + cpu_only +
                " bench train --model resnet18 --batch 2 --image-size 32 --num-classes 4 "
                "--steps 2 --warmup 1 --no-profile --threads 1");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("images/s"), std::string::npos) << run.out;
}
#endif

}  // namespace
