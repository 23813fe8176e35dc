// Every COHORT_* setting a user may give in the environment, read in this one place
// (src/core/settings.cc) into typed values with their defaults; README.md's table lists the same
// variables. Each part reads them afresh when it starts (a communicator at init, the logger,
// the allocator, the reduction kernels), so that a process that sets one before starting that
// part is honoured. The launcher's own protocol (RANK, WORLD_SIZE, Open MPI's and Slurm's
// variables, COHORT_JOB_TOKEN, COHORT_STORE_EXTERNAL) is read where the job is described
// (comm's job_env.cc), not here: it says who the process is, not how it should run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::env {

struct Settings {
  // comm
  double timeout_s = 300;                    // COHORT_TIMEOUT
  double heartbeat_s = 1;                    // COHORT_HEARTBEAT: interval; 0: none
  double heartbeat_timeout_s = 10;           // COHORT_HEARTBEAT_TIMEOUT: silence that fails
  std::string transport = "auto";            // COHORT_TRANSPORT: auto | shm | tcp | ucx
  std::string backend = "cohort";            // COHORT_BACKEND: cohort | mpi
  std::string algo = "auto";                 // COHORT_ALGO
  std::optional<std::string> host_id;        // COHORT_HOST_ID (default: the hostname)
  int tcp_streams = 2;                       // COHORT_TCP_STREAMS
  uint64_t shm_ring_bytes = 4u << 20;        // COHORT_SHM_RING_BYTES
  std::optional<std::string> socket_addr;    // COHORT_SOCKET_ADDR
  std::optional<std::string> flight_dir;     // COHORT_FLIGHT_DIR: flight recorder dumps
  uint64_t ring_slice_bytes = 4u << 20;      // COHORT_RING_SLICE
  std::optional<uint64_t> hier_chunk_bytes;  // COHORT_HIER_CHUNK (default: the cost model's)
  int64_t spin = 2000;                       // COHORT_SPIN
  bool caller_runs = true;                   // COHORT_CALLER_RUNS
  bool probe = false;                        // COHORT_PROBE
  uint64_t ucx_chunk_bytes = 256u << 10;     // COHORT_UCX_CHUNK
  int ucx_chunks = 8;                        // COHORT_UCX_CHUNKS
  bool no_avx2 = false;                      // COHORT_NO_AVX2: scalar reduction kernels
  // core
  std::string log = "info";  // COHORT_LOG: debug | info | warn | error
  // tensor
  bool alloc_cache = true;  // COHORT_ALLOC_CACHE
  // data
  std::optional<std::string> gdcm_helper;  // COHORT_GDCM_HELPER: its path, or "off" (default:
                                           // the cohort-gdcm built with the library)
  double decode_timeout_s = 60;            // COHORT_DECODE_TIMEOUT: a helper's decode, at most
  std::string gdcm_helper_fault;           // COHORT_GDCM_HELPER_FAULT: abort:TEXT | hang:TEXT
                                           // (tests: a fault for files whose name holds TEXT)

  // Reads the environment now; a malformed value is an error naming the variable.
  static Settings read();
};

}  // namespace cohort::env
