// UCX transport: InfiniBand and RoCE through RDMA, or UCX's own tcp and shared-memory
// transports, chosen by UCX_TLS. Host memory only: the engine does not take device buffers.
// The same Link interface as shm and tcp: each direction of a link is a sequence of tag
// messages (tag: communicator, sender, receiver), which UCX delivers in order; the sender sends
// from the caller's memory, a few messages in flight, the receiver keeps receives posted into
// its own chunks and hands out spans of them, so a reduction reads data where it landed.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../link.h"
#include "../peer.h"
#include "cohort/comm/store.h"

namespace cohort::comm {

struct UcxOptions {
  std::string token;
  uint64_t comm_id = 0;
  size_t chunk_bytes = 256 << 10;  // largest message; each receive chunk
  int chunks =
      8;  // in flight per direction and link (over UCX tcp, 8 x 256 KiB beat 4 x 1 MiB by 40%)
  Clock::time_point deadline;
};

// One UCX context and worker per communicator, shared by its links.
class UcxWorker;

// Publishes this rank's worker address under "ucx/<rank>", connects an endpoint to every peer,
// exchanges and checks a hello carrying the job token on every link. Returns links by rank.
std::map<int, std::unique_ptr<Link>> connect_ucx_peers(Store& store, const UcxOptions& opt,
                                                       const PeerDesc& me,
                                                       const std::vector<PeerDesc>& peers);

// The RDMA devices (InfiniBand or RoCE) UCX can use on this host, by name (mlx5_0, ...).
std::vector<std::string> ucx_rdma_devices();
bool ucx_has_rdma();

}  // namespace cohort::comm
