// Shared-memory transport between ranks of one host: one segment per pair holding two
// single-producer/single-consumer byte rings. The segment is unlinked as soon as both sides
// have mapped it, so a crash cannot leave it in /dev/shm.
#pragma once

#include <memory>
#include <string>

#include "../link.h"
#include "../peer.h"
#include "cohort/comm/store.h"

namespace cohort::comm {

struct ShmOptions {
  size_t ring_bytes = 4u << 20;  // per direction; COHORT_SHM_RING_BYTES
  std::string name_prefix;       // /cohort-<token>-<comm>: unique per job and communicator
};

// The start of every segment name of a job (in /dev/shm, without the leading '/'): what a leak
// check looks for after a job ends.
std::string shm_job_prefix(const std::string& token);

// Both ranks of the pair call this; the lower rank creates the segment. Uses `store` to agree.
std::unique_ptr<Link> connect_shm(Store& store, const ShmOptions& opt, const PeerDesc& me,
                                  const PeerDesc& peer);

}  // namespace cohort::comm
