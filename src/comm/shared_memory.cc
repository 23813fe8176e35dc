// Communicator::alloc_shared: each rank's memory in a shared-memory segment that every rank of
// its host maps, named through the store and unlinked once all have mapped it (nothing is left
// in /dev/shm after, even if a rank dies later). The algorithms that work on it: `shared`
// allreduce, reduce_scatter and allgather (collectives/, their handshake in shared.cc).
#include "shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cohort/core/error.h"
#include "native_comm.h"
#include "transport/shm/shm_transport.h"

namespace cohort::comm {

// Backends without shared memory: ordinary memory, zeroed, which no algorithm treats specially.
SharedBuffer Communicator::alloc_shared(size_t bytes) {
  const size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, n);
  if (p == nullptr) COHORT_THROW("alloc_shared: cannot allocate " << bytes << " bytes");
  std::memset(p, 0, n);
  return SharedBuffer(p, bytes, std::shared_ptr<const void>(p, std::free), false);
}

namespace detail {

SharedRegion::~SharedRegion() {
  for (uint8_t* p : at) {
    if (p != nullptr) ::munmap(p, map_bytes);
  }
}

void SharedRegions::add(const std::shared_ptr<const SharedRegion>& r) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(regions_, [](const auto& w) { return w.expired(); });
  regions_.push_back(r);
  ever_ = true;
}

std::shared_ptr<const SharedRegion> SharedRegions::find(int rank, const void* p, size_t n,
                                                        size_t* offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto* q = static_cast<const uint8_t*>(p);
  for (const auto& w : regions_) {
    auto r = w.lock();
    if (!r) continue;
    const uint8_t* base = r->at[static_cast<size_t>(rank)];
    if (base != nullptr && q >= base && q + n <= base + r->bytes) {
      *offset = static_cast<size_t>(q - base);
      return r;
    }
  }
  return nullptr;
}

bool SharedRegions::ever() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ever_;
}

namespace {

uint8_t* map_segment(const std::string& name, int flags, size_t bytes, const std::string& whose) {
  const int fd = ::shm_open(name.c_str(), flags, 0600);
  if (fd < 0) {
    COHORT_THROW_AS(CommError, "alloc_shared: cannot open shared-memory segment "
                                   << name << " of " << whose << ": " << errno_string(errno));
  }
  if (flags & O_CREAT) {
    // fallocate, not ftruncate: a full /dev/shm then fails here, not as SIGBUS at first touch.
    const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (e != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      COHORT_THROW_AS(CommError, "alloc_shared: cannot give shared-memory segment "
                                     << name << " " << bytes << " bytes: " << errno_string(e)
                                     << " (is /dev/shm large enough?)");
    }
  }
  // This rank's own memory is populated: the first collective would otherwise pay a page fault
  // per 4 KiB, dear in a VM. A peer's is not: the kernel counts every page a process has mapped
  // in its resident size, and a rank touches only its block of each peer's buffers, about one
  // buffer in all, where populating them would count every peer's whole buffer again in each
  // rank's (and in --max-memory's check).
  const int populate = (flags & O_CREAT) ? MAP_POPULATE : 0;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (flags & O_CREAT) ::shm_unlink(name.c_str());
    COHORT_THROW_AS(CommError, "alloc_shared: mmap of " << name << " (" << bytes
                                                        << " bytes): " << errno_string(e));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

SharedBuffer NativeComm::alloc_shared(size_t bytes) {
  COHORT_CHECK(bytes > 0 && bytes <= (1ull << 40),
               "alloc_shared: " << bytes << " bytes is not a size to share");
  auto region = std::make_shared<SharedRegion>();
  region->id = shared_seq_++;
  region->bytes = bytes;
  region->map_bytes = (bytes + 4095) / 4096 * 4096;
  region->at.assign(members_.size(), nullptr);
  char id[24];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(comm_id_));
  const std::string prefix = "/" + shm_job_prefix(token_) + "-" + std::string(id).substr(0, 8) +
                             "-m" + std::to_string(region->id) + "-";
  const std::string key = "shared/" + std::to_string(region->id) + "/";
  const std::string name = prefix + std::to_string(rank_);
  region->at[static_cast<size_t>(rank_)] =
      map_segment(name, O_CREAT | O_EXCL | O_RDWR, region->map_bytes, "this rank");
  try {
    store_.set(key + std::to_string(rank_), name + " " + std::to_string(bytes));
    for (int p : engine_->local().ranks) {
      if (p == rank_) continue;
      const PeerDesc& peer = members_[static_cast<size_t>(p)];
      std::istringstream in(store_.get(key + std::to_string(p)));
      std::string peer_name;
      size_t peer_bytes = 0;
      in >> peer_name >> peer_bytes;
      if (peer_bytes != bytes) {
        COHORT_THROW_AS(CommError, "alloc_shared: rank " << rank_ << " asks for " << bytes
                                                         << " bytes, " << peer.name() << " for "
                                                         << peer_bytes);
      }
      region->at[static_cast<size_t>(p)] =
          map_segment(peer_name, O_RDWR, region->map_bytes, peer.name());
    }
    store_.set(key + std::to_string(rank_) + "/mapped", "1");
    for (int p : engine_->local().ranks) {
      if (p != rank_) store_.get(key + std::to_string(p) + "/mapped");
    }
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
  ::shm_unlink(name.c_str());
  engine_->shared().add(region);
  choices_.clear();  // large allreduces may now run `shared`
  return SharedBuffer(region->at[static_cast<size_t>(rank_)], bytes, region, true);
}

}  // namespace detail
}  // namespace cohort::comm
