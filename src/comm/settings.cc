// The backend's settings from the environment's (core's env::Settings), checked once.
#include "settings.h"

#include <unistd.h>

#include "cohort/comm/cost_model.h"
#include "cohort/core/error.h"
#include "cohort/core/settings.h"
#ifdef COHORT_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace cohort::comm::detail {

Settings Settings::from_env() {
  const env::Settings e = env::Settings::read();
  Settings s;
  s.timeout = std::chrono::milliseconds(static_cast<int64_t>(e.timeout_s * 1000.0));
  COHORT_CHECK(e.heartbeat_s >= 0 && e.heartbeat_timeout_s > 0,
               "COHORT_HEARTBEAT=" << e.heartbeat_s << ", COHORT_HEARTBEAT_TIMEOUT="
                                   << e.heartbeat_timeout_s << ": expected >= 0 and > 0 seconds");
  COHORT_CHECK(e.heartbeat_s == 0 || e.heartbeat_timeout_s >= 2 * e.heartbeat_s,
               "COHORT_HEARTBEAT_TIMEOUT=" << e.heartbeat_timeout_s << " s: expected at least "
                                           << "two beats of COHORT_HEARTBEAT=" << e.heartbeat_s
                                           << " s");
  s.heartbeat = std::chrono::milliseconds(static_cast<int64_t>(e.heartbeat_s * 1000.0));
  s.heartbeat_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(e.heartbeat_timeout_s * 1000.0));
  const std::string& tr = e.transport;
#ifdef COHORT_HAVE_UCX
  if (tr != "auto" && tr != "tcp" && tr != "shm" && tr != "ucx") {
    COHORT_THROW("COHORT_TRANSPORT='" << tr << "': expected auto, shm, tcp or ucx");
  }
  s.ucx = tr == "ucx";
  s.ucx_remote = tr == "auto" && ucx_has_rdma();
#else
  if (tr == "ucx") COHORT_THROW("COHORT_TRANSPORT=ucx, but this build has no UCX (libucx-dev)");
  if (tr != "auto" && tr != "tcp" && tr != "shm") {
    COHORT_THROW("COHORT_TRANSPORT='" << tr << "': expected auto, shm or tcp");
  }
#endif
  s.force_tcp = tr == "tcp";
  s.tcp_streams = e.tcp_streams;
  s.shm_ring = e.shm_ring_bytes;
  s.socket_addr = e.socket_addr;
  s.flight_dir = e.flight_dir;
  s.ucx_chunk = e.ucx_chunk_bytes;
  s.ucx_chunks = e.ucx_chunks;
  s.algo = parse_algo(e.algo);
  s.ring_slice = e.ring_slice_bytes;
  s.hier_chunk = e.hier_chunk_bytes.value_or(kHierChunkBytes);
  s.spin = static_cast<unsigned>(e.spin);
  s.caller_runs = e.caller_runs;
  s.probe = e.probe;
  if (e.host_id) {
    s.host_id = *e.host_id;
  } else {
    char buf[256] = {0};
    ::gethostname(buf, sizeof(buf) - 1);
    s.host_id = buf;
  }
  s.backend = e.backend;
  if (s.backend != "cohort" && s.backend != "mpi" && s.backend != "nccl") {
    COHORT_THROW("COHORT_BACKEND='" << s.backend << "': expected cohort, mpi or nccl");
  }
  return s;
}

}  // namespace cohort::comm::detail
