// How Cohort's own backend runs, decided once when a communicator starts: the environment's
// settings (core's env::Settings) checked and turned into the engine's types.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "cohort/comm/communicator.h"

namespace cohort::comm::detail {

struct Settings {
  std::chrono::milliseconds timeout{300000};
  // Every rank beats in the store every `heartbeat` (0: never); a rank that others wait on and
  // whose beat has not changed for `heartbeat_timeout` is stopped or frozen: the call fails
  // naming it, before the timeout.
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  bool force_tcp = false;   // COHORT_TRANSPORT=tcp: TCP to every peer
  bool ucx = false;         // COHORT_TRANSPORT=ucx: UCX to every peer
  bool ucx_remote = false;  // auto, with UCX and an RDMA device: UCX to other hosts
  bool net_everywhere() const { return force_tcp || ucx; }
  int tcp_streams = 1;
  size_t stripe_min = 1u << 20;  // messages this large are striped across TCP lanes
  size_t shm_ring = 4u << 20;
  std::optional<std::string> socket_addr;  // where to listen for peers (default: towards master)
  std::optional<std::string> flight_dir;   // where the flight recorder dumps (none: no dumps)
  size_t ucx_chunk = 256u << 10;
  int ucx_chunks = 8;
  Algo algo = Algo::automatic;   // COHORT_ALGO: forces this algorithm where a collective has it
  size_t ring_slice = 4u << 20;  // bytes per rank of one pass of the ring allreduce
  size_t hier_chunk = 0;         // chunk of the pipelined hierarchical allreduce
  unsigned spin = 2000;          // idle polls before a waiting rank yields its core
  bool caller_runs = true;       // COHORT_CALLER_RUNS
  bool probe = false;            // COHORT_PROBE: measure the links at start-up
  std::string host_id;           // groups ranks into hosts
  std::string backend = "cohort";
  static Settings from_env();
};

}  // namespace cohort::comm::detail
