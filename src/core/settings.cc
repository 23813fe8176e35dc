// The one place COHORT_* settings are read from the environment (see settings.h).
#include "cohort/core/settings.h"

#include <algorithm>

#include "cohort/core/env.h"
#include "cohort/core/error.h"

namespace cohort::env {

namespace {
uint64_t bytes_or(const char* name, uint64_t fallback) {
  auto v = get(name);
  if (!v) return fallback;
  try {
    return parse_bytes(*v);
  } catch (const Error& e) {
    COHORT_THROW("environment variable " << name << ": " << e.message());
  }
}
}  // namespace

Settings Settings::read() {
  Settings s;
  s.timeout_s = double_or("COHORT_TIMEOUT", s.timeout_s);
  s.heartbeat_s = double_or("COHORT_HEARTBEAT", s.heartbeat_s);
  s.heartbeat_timeout_s = double_or("COHORT_HEARTBEAT_TIMEOUT", s.heartbeat_timeout_s);
  s.transport = get_or("COHORT_TRANSPORT", s.transport);
  s.backend = get_or("COHORT_BACKEND", s.backend);
  s.algo = get_or("COHORT_ALGO", s.algo);
  s.host_id = get("COHORT_HOST_ID");
  s.tcp_streams = static_cast<int>(int_or("COHORT_TCP_STREAMS", s.tcp_streams));
  if (s.tcp_streams < 1 || s.tcp_streams > 16) {
    COHORT_THROW("COHORT_TCP_STREAMS=" << s.tcp_streams << ": expected 1..16");
  }
  s.shm_ring_bytes = bytes_or("COHORT_SHM_RING_BYTES", s.shm_ring_bytes);
  s.socket_addr = get("COHORT_SOCKET_ADDR");
  s.flight_dir = get("COHORT_FLIGHT_DIR");
  s.ring_slice_bytes = bytes_or("COHORT_RING_SLICE", s.ring_slice_bytes);
  if (get("COHORT_HIER_CHUNK")) s.hier_chunk_bytes = bytes_or("COHORT_HIER_CHUNK", 0);
  // At least one poll, so that the engine's idle clock always starts.
  s.spin = std::max<int64_t>(1, int_or("COHORT_SPIN", s.spin));
  s.caller_runs = int_or("COHORT_CALLER_RUNS", 1) != 0;
  s.probe = flag("COHORT_PROBE");
  s.ucx_chunk_bytes = bytes_or("COHORT_UCX_CHUNK", s.ucx_chunk_bytes);
  s.ucx_chunks = static_cast<int>(int_or("COHORT_UCX_CHUNKS", s.ucx_chunks));
  s.no_avx2 = flag("COHORT_NO_AVX2");
  s.log = get_or("COHORT_LOG", s.log);
  if (s.log != "debug" && s.log != "info" && s.log != "warn" && s.log != "error") {
    COHORT_THROW("COHORT_LOG='" << s.log << "': expected debug, info, warn or error");
  }
  s.alloc_cache = int_or("COHORT_ALLOC_CACHE", 1) != 0;
  s.gdcm_helper = get("COHORT_GDCM_HELPER");
  s.decode_timeout_s = double_or("COHORT_DECODE_TIMEOUT", s.decode_timeout_s);
  if (s.decode_timeout_s <= 0) {
    COHORT_THROW("COHORT_DECODE_TIMEOUT=" << s.decode_timeout_s << ": expected seconds above 0");
  }
  s.gdcm_helper_fault = get_or("COHORT_GDCM_HELPER_FAULT", "");
  return s;
}

}  // namespace cohort::env
