// The caching device allocator (see device_allocator.h): per-stream free lists with a best fit,
// blocks waiting on other streams' events, and one retry with the cache given back when the
// device runs out; and the CUDA device's DeviceMemory, through core/cuda.h.
#include "cohort/tensor/device_allocator.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "cohort/core/cuda.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"

namespace cohort::tensor {

namespace {
// Requests round up to 512 bytes, as cudaMalloc's own granularity makes smaller steps waste;
// a cached block up to 1/8 larger than the request serves it, so the last, shorter batch of an
// epoch reuses the full batches' blocks, as on the host.
size_t round_request(size_t bytes) {
  return (std::max<size_t>(bytes, 1) + 511) & ~size_t{511};
}
}  // namespace

struct DeviceAllocator::State {
  std::unique_ptr<DeviceMemory> memory;
  mutable std::mutex mu;
  // (stream, bytes) -> pointer: a stream's free blocks, by size.
  std::multimap<std::pair<uintptr_t, size_t>, void*> free;
  struct Pending {
    void* ptr;
    size_t bytes;
    uintptr_t stream;
    std::vector<uint64_t> events;
  };
  std::vector<Pending> pending;
  DeviceAllocatorStats stats;

  // Moves pending blocks whose every event has completed into their stream's free list.
  void collect_pending() {
    for (size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      bool all = true;
      for (uint64_t e : p.events) all = all && memory->event_done(e);
      if (!all) {
        ++i;
        continue;
      }
      for (uint64_t e : p.events) memory->release_event(e);
      free.emplace(std::make_pair(p.stream, p.bytes), p.ptr);
      stats.pending -= p.bytes;
      stats.cached += p.bytes;
      pending[i] = std::move(pending.back());
      pending.pop_back();
    }
  }

  // Gives every cached block back to the device, after waiting for it (pending blocks too).
  void give_back_cache() {
    memory->synchronize();
    collect_pending();
    for (auto& [key, ptr] : free) {
      memory->free(ptr);
      stats.reserved -= key.second;
    }
    free.clear();
    stats.cached = 0;
  }
};

DeviceAllocator::DeviceAllocator(std::unique_ptr<DeviceMemory> memory)
    : s_(std::make_unique<State>()) {
  s_->memory = std::move(memory);
}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->give_back_cache();
}

std::shared_ptr<Block> DeviceAllocator::allocate(size_t bytes, uintptr_t stream, MemoryUse use) {
  const size_t rounded = round_request(bytes);
  auto b = std::make_shared<Block>();
  b->device = Device::cuda;
  b->stream = stream;
  b->use = static_cast<uint8_t>(use);
  std::lock_guard<std::mutex> lock(s_->mu);
  State& s = *s_;
  s.stats.allocations++;
  if (!s.pending.empty()) s.collect_pending();
  auto it = s.free.lower_bound({stream, rounded});
  if (it != s.free.end() && it->first.first == stream &&
      it->first.second <= rounded + rounded / 8) {
    b->ptr = it->second;
    b->bytes = it->first.second;
    s.stats.cached -= b->bytes;
    s.free.erase(it);
    s.stats.cache_hits++;
  } else {
    b->bytes = rounded;
    b->ptr = s.memory->allocate(rounded);
    s.stats.device_allocations++;
    if (!b->ptr && (!s.free.empty() || !s.pending.empty())) {
      // Blocks cached for other sizes or streams may be what the device lacks.
      s.stats.out_of_memory_retries++;
      s.give_back_cache();
      b->ptr = s.memory->allocate(rounded);
      s.stats.device_allocations++;
    }
    if (!b->ptr) {
      b->owned = false;
      COHORT_THROW("out of device memory on "
                   << s.memory->name() << " allocating " << env::format_bytes(rounded) << ": "
                   << env::format_bytes(s.stats.in_use) << " in use, "
                   << env::format_bytes(s.stats.workspace) << " of it workspaces, device total "
                   << env::format_bytes(s.memory->total_memory()));
    }
    s.stats.reserved += rounded;
    s.stats.peak_reserved = std::max(s.stats.peak_reserved, s.stats.reserved);
  }
  s.stats.in_use += b->bytes;
  s.stats.peak_in_use = std::max(s.stats.peak_in_use, s.stats.in_use);
  if (use == MemoryUse::workspace) {
    s.stats.workspace += b->bytes;
    s.stats.peak_workspace = std::max(s.stats.peak_workspace, s.stats.workspace);
  }
  b->device_allocator = this;
  return b;
}

void DeviceAllocator::record_stream(Block* b, uintptr_t stream) {
  COHORT_CHECK(b->device_allocator == this, "record_stream of a block this allocator did not give");
  if (stream == b->stream) return;
  std::lock_guard<std::mutex> lock(s_->mu);
  auto& o = b->other_streams;
  if (std::find(o.begin(), o.end(), stream) == o.end()) o.push_back(stream);
}

void DeviceAllocator::release(Block* b) {
  std::lock_guard<std::mutex> lock(s_->mu);
  State& s = *s_;
  s.stats.in_use -= b->bytes;
  if (b->use == static_cast<uint8_t>(MemoryUse::workspace)) s.stats.workspace -= b->bytes;
  if (b->other_streams.empty()) {
    // Work queued on b->stream after this point runs after the work that used the block.
    s.free.emplace(std::make_pair(b->stream, b->bytes), b->ptr);
    s.stats.cached += b->bytes;
    return;
  }
  State::Pending p{b->ptr, b->bytes, b->stream, {}};
  for (uintptr_t other : b->other_streams) p.events.push_back(s.memory->record_event(other));
  s.stats.pending += b->bytes;
  s.pending.push_back(std::move(p));
}

DeviceAllocatorStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->stats;
}

void DeviceAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->stats.peak_in_use = s_->stats.in_use;
  s_->stats.peak_reserved = s_->stats.reserved;
  s_->stats.peak_workspace = s_->stats.workspace;
}

void DeviceAllocator::trim() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->give_back_cache();
}

namespace {
// The current CUDA device through core's runtime (a build without CUDA throws on first use).
class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {}
  void* allocate(size_t bytes) override { return cuda::device_malloc(bytes); }
  void free(void* p) override { cuda::device_free(p); }
  uint64_t record_event(uintptr_t stream) override { return cuda::record_event(stream); }
  bool event_done(uint64_t event) override { return cuda::event_done(event); }
  void release_event(uint64_t event) override { cuda::release_event(event); }
  void synchronize() override { cuda::device_synchronize(); }
  size_t total_memory() override { return cuda::info(device_).total_memory; }
  std::string name() override {
    return "cuda:" + std::to_string(device_) + " (" + cuda::info(device_).name + ")";
  }

 private:
  int device_;
};
}  // namespace

DeviceAllocator& DeviceAllocator::cuda() {
  COHORT_CHECK(cuda::device_count() > 0, "device memory: " << cuda::unavailable_reason());
  // Never destroyed: blocks may outlive statics.
  static DeviceAllocator* a =
      new DeviceAllocator(std::make_unique<CudaMemory>(cuda::current_device()));
  return *a;
}

}  // namespace cohort::tensor
