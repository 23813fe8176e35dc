// Link set-up and the choice of transport per peer: shared memory inside a host (plus a small
// eager ring for short messages), TCP across hosts (several lanes for striping), UCX where
// asked or where an RDMA device is present. What comes out is owned by the engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/store.h"
#include "settings.h"
#include "transport/link.h"
#include "transport/peer.h"

namespace cohort::comm::detail {

struct LinkSet {
  std::vector<std::vector<std::unique_ptr<Link>>> lanes;  // [peer][lane]
  std::vector<std::unique_ptr<Link>> eager;               // [peer]: small messages (shm only)
};

// Collective over `members`: every rank connects to every other through `store`.
LinkSet connect_links(Store& store, const std::string& token, uint64_t comm_id, int rank,
                      const std::vector<PeerDesc>& members, const Settings& s);

}  // namespace cohort::comm::detail
