// Where a rank learns its place: cohort launch/torchrun, Open MPI and Slurm variables.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/core/error.h"

using namespace cohort::comm;

namespace {

class JobEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  void clear() {
    for (const char* v : {"RANK",
                          "WORLD_SIZE",
                          "LOCAL_RANK",
                          "LOCAL_WORLD_SIZE",
                          "MASTER_ADDR",
                          "MASTER_PORT",
                          "COHORT_JOB_TOKEN",
                          "COHORT_STORE_EXTERNAL",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "OMPI_MCA_ess_base_jobid",
                          "PMIX_NAMESPACE",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_LOCALID",
                          "SLURM_TASKS_PER_NODE",
                          "SLURM_JOB_ID",
                          "SLURM_STEP_ID",
                          "SLURM_STEP_NODELIST",
                          "SLURM_JOB_NODELIST"}) {
      unsetenv(v);
    }
  }
};

TEST_F(JobEnvTest, Torchrun) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "node0", 1);
  setenv("MASTER_PORT", "1234", 1);
  JobEnv j = detect_job_env();
  EXPECT_EQ(j.launcher, "torchrun");
  EXPECT_EQ(j.rank, 3);
  EXPECT_EQ(j.world, 8);
  EXPECT_EQ(j.local_rank, 1);
  EXPECT_EQ(j.local_world, 2);
  EXPECT_EQ(j.master_addr, "node0");
  EXPECT_EQ(j.master_port, 1234);
  setenv("COHORT_JOB_TOKEN", "abc", 1);
  setenv("COHORT_STORE_EXTERNAL", "1", 1);
  j = detect_job_env();
  EXPECT_EQ(j.launcher, "cohort");
  EXPECT_EQ(j.token, "abc");
  EXPECT_TRUE(j.store_external);
}

TEST_F(JobEnvTest, OpenMpi) {
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  setenv("OMPI_MCA_ess_base_jobid", "12345", 1);
  JobEnv j = detect_job_env();
  EXPECT_EQ(j.launcher, "mpirun");
  EXPECT_EQ(j.rank, 2);
  EXPECT_EQ(j.world, 4);
  EXPECT_EQ(j.local_world, 2);
  EXPECT_EQ(j.master_addr, "127.0.0.1");
  EXPECT_GE(j.master_port, 20000);
  const uint16_t port = j.master_port;
  EXPECT_EQ(detect_job_env().master_port, port);  // every rank derives the same port
  EXPECT_EQ(j.token, "ompi-12345");
}

TEST_F(JobEnvTest, SlurmTakesTheFirstHostOfTheStep) {
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  setenv("SLURM_JOB_ID", "777", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_STEP_NODELIST", "gpu[07-09,12],login1", 1);
  JobEnv j = detect_job_env();
  EXPECT_EQ(j.launcher, "slurm");
  EXPECT_EQ(j.rank, 5);
  EXPECT_EQ(j.world, 8);
  EXPECT_EQ(j.local_rank, 1);
  EXPECT_EQ(j.local_world, 4);
  EXPECT_EQ(j.master_addr, "gpu07");
  EXPECT_EQ(j.token, "slurm-777_0");
  setenv("SLURM_STEP_NODELIST", "single", 1);
  EXPECT_EQ(detect_job_env().master_addr, "single");
}

TEST_F(JobEnvTest, AloneIsAJobOfOne) {
  JobEnv j = detect_job_env();
  EXPECT_EQ(j.launcher, "single");
  EXPECT_EQ(j.world, 1);
  EXPECT_FALSE(j.token.empty());
}

TEST_F(JobEnvTest, InconsistentValuesAreErrors) {
  setenv("RANK", "4", 1);
  setenv("WORLD_SIZE", "4", 1);
  EXPECT_THROW(detect_job_env(), cohort::Error);
  setenv("RANK", "x", 1);
  EXPECT_THROW(detect_job_env(), cohort::Error);
}

}  // namespace
