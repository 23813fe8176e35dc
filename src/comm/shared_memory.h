// Memory this host's ranks map from each other (Communicator::alloc_shared): one allocation's
// mappings on this rank, and the lookup from a call's buffer to the allocation that holds it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace cohort::comm::detail {

struct SharedRegion {
  uint64_t id = 0;           // the communicator's allocation number: the same on every rank
  size_t bytes = 0;          // what was asked for
  size_t map_bytes = 0;      // what each mapping spans (whole pages)
  std::vector<uint8_t*> at;  // [rank]: that rank's memory as mapped here; null off this host
  SharedRegion() = default;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();  // unmaps every mapping
};

// The live allocations, looked up by the algorithms (progress thread) while the caller's thread
// adds them; an allocation leaves when its last SharedBuffer goes.
class SharedRegions {
 public:
  void add(const std::shared_ptr<const SharedRegion>& r);
  // The allocation holding bytes [p, p + n) of `rank`'s memory, with p's offset in it; null
  // when none does (a call on ordinary memory).
  std::shared_ptr<const SharedRegion> find(int rank, const void* p, size_t n, size_t* offset) const;
  // Whether the communicator ever allocated shared memory: collective, hence the same answer on
  // every rank, which the choice of algorithm needs.
  bool ever() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<const SharedRegion>> regions_;
  bool ever_ = false;
};

}  // namespace cohort::comm::detail
