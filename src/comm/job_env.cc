// Where a rank learns who it is: cohort launch and torchrun (RANK, WORLD_SIZE, ...), Open MPI's
// mpirun (OMPI_COMM_WORLD_*), or Slurm's srun (SLURM_PROCID, ...), in that order.
#include <unistd.h>

#include <cctype>
#include <functional>
#include <random>

#include "cohort/comm/communicator.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "native_comm.h"

namespace cohort::comm {

std::string detail::random_token() {
  std::random_device rd;
  const char* hex = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 24; ++i) t += hex[rd() % 16];
  return t;
}

namespace {

uint16_t port_from(const std::string& seed) {
  return static_cast<uint16_t>(20000 + std::hash<std::string>{}(seed) % 20000);
}

// First host of a Slurm node list such as "node[03-05,7],gpu1" -> "node03".
std::string first_slurm_host(const std::string& list) {
  std::string out;
  size_t i = 0;
  while (i < list.size() && list[i] != ',' && list[i] != '[') out += list[i++];
  if (i < list.size() && list[i] == '[') {
    ++i;
    while (i < list.size() && std::isdigit(static_cast<unsigned char>(list[i]))) out += list[i++];
  }
  return out;
}

std::string alnum(const std::string& s) {
  std::string o;
  for (char c : s) o += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return o;
}

}  // namespace

JobEnv detect_job_env() {
  JobEnv j;
  auto need = [](const char* name) {
    auto v = env::int_or(name, -1);
    if (v < 0) COHORT_THROW("environment variable " << name << " is missing or negative");
    return static_cast<int>(v);
  };
  if (env::get("RANK") && env::get("WORLD_SIZE")) {
    j.launcher = env::get("COHORT_JOB_TOKEN") ? "cohort" : "torchrun";
    j.rank = need("RANK");
    j.world = need("WORLD_SIZE");
    j.local_rank = static_cast<int>(env::int_or("LOCAL_RANK", 0));
    j.local_world = static_cast<int>(env::int_or("LOCAL_WORLD_SIZE", j.world));
    j.master_addr = env::get_or("MASTER_ADDR", "127.0.0.1");
    // Under cohort launch the store is on COHORT_STORE_PORT (MASTER_PORT is left to torch).
    j.master_port =
        static_cast<uint16_t>(env::int_or("COHORT_STORE_PORT", env::int_or("MASTER_PORT", 29500)));
    j.token = env::get_or("COHORT_JOB_TOKEN",
                          "torchrun-" + j.master_addr + "-" + std::to_string(j.master_port));
  } else if (env::get("OMPI_COMM_WORLD_RANK")) {
    j.launcher = "mpirun";
    j.rank = need("OMPI_COMM_WORLD_RANK");
    j.world = need("OMPI_COMM_WORLD_SIZE");
    j.local_rank = static_cast<int>(env::int_or("OMPI_COMM_WORLD_LOCAL_RANK", 0));
    j.local_world = static_cast<int>(env::int_or("OMPI_COMM_WORLD_LOCAL_SIZE", j.world));
    std::string job = env::get_or("OMPI_MCA_ess_base_jobid", env::get_or("PMIX_NAMESPACE", "0"));
    j.master_addr = env::get_or("MASTER_ADDR", "127.0.0.1");
    j.master_port = static_cast<uint16_t>(env::int_or("MASTER_PORT", port_from("ompi" + job)));
    j.token = env::get_or("COHORT_JOB_TOKEN", "ompi-" + alnum(job));
  } else if (env::get("SLURM_PROCID") && env::get("SLURM_NTASKS")) {
    j.launcher = "slurm";
    j.rank = need("SLURM_PROCID");
    j.world = need("SLURM_NTASKS");
    j.local_rank = static_cast<int>(env::int_or("SLURM_LOCALID", 0));
    std::string per_node = env::get_or("SLURM_TASKS_PER_NODE", "");
    j.local_world = per_node.empty() ? j.world : std::atoi(per_node.c_str());
    std::string job = env::get_or("SLURM_JOB_ID", "0") + "." + env::get_or("SLURM_STEP_ID", "0");
    std::string nodes = env::get_or("SLURM_STEP_NODELIST", env::get_or("SLURM_JOB_NODELIST", ""));
    j.master_addr =
        env::get_or("MASTER_ADDR", nodes.empty() ? "127.0.0.1" : first_slurm_host(nodes));
    j.master_port = static_cast<uint16_t>(env::int_or("MASTER_PORT", port_from("slurm" + job)));
    j.token = env::get_or("COHORT_JOB_TOKEN", "slurm-" + alnum(job));
  } else {
    j.launcher = "single";
    j.token = env::get_or("COHORT_JOB_TOKEN", detail::random_token());
  }
  j.store_external = env::flag("COHORT_STORE_EXTERNAL");
  if (j.world < 1) COHORT_THROW("world size must be >= 1, got " << j.world);
  if (j.rank >= j.world) {
    COHORT_THROW("rank " << j.rank << " is outside the world size " << j.world);
  }
  return j;
}

}  // namespace cohort::comm
