// The caching device allocator: device memory is slow to get (cudaMalloc synchronises the whole
// device) and a training step asks for the same sizes every time, so freed blocks are kept and
// handed out again. It is stream-ordered, as PyTorch's CUDA allocator is: a block freed by work
// queued on stream S can serve the next request on S at once, because S runs in order; a block
// that other streams also used (record_stream) returns to the cache only once each of them has
// passed the point where it was freed, which an event per stream marks.
//
// The policy is written against DeviceMemory, the few calls it needs of a device. CUDA's is at the
// end of src/tensor/device_allocator.cc; tests/tensor/device_allocator_test.cc drives the policy
// with host memory and events it completes by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cohort/tensor/tensor.h"

namespace cohort::tensor {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* allocate(size_t bytes) = 0;  // nullptr when the device is out of memory
  virtual void free(void* p) = 0;
  // Marks the work queued on `stream` so far; done() once the device has run it.
  virtual uint64_t record_event(uintptr_t stream) = 0;
  virtual bool event_done(uint64_t event) = 0;
  virtual void release_event(uint64_t event) = 0;
  virtual void synchronize() = 0;     // the whole device
  virtual size_t total_memory() = 0;  // for the out-of-memory message
  virtual std::string name() = 0;     // "cuda:0 (NVIDIA H100 80GB HBM3)"
};

// What a request is for, counted apart in the statistics and the memory report.
enum class MemoryUse : uint8_t { tensor, workspace };

struct DeviceAllocatorStats : AllocatorStats {
  size_t reserved = 0;  // obtained from the device (in use + cached + pending)
  size_t peak_reserved = 0;
  size_t pending = 0;                        // freed, waiting for other streams to pass the free
  size_t workspace = 0, peak_workspace = 0;  // convolution workspaces among in_use
  uint64_t device_allocations = 0;           // calls to DeviceMemory::allocate
  uint64_t out_of_memory_retries = 0;        // times the cache was emptied to satisfy a request
};

class DeviceAllocator {
 public:
  explicit DeviceAllocator(std::unique_ptr<DeviceMemory> memory);
  ~DeviceAllocator();
  // The allocator of this process's CUDA device (cuda::use_device first); throws where there
  // is none.
  static DeviceAllocator& cuda();

  // A block of at least `bytes` for work on `stream`. Throws naming the device, the request and
  // the memory in use, cached and in all when the device has none left even after the cache is
  // given back.
  std::shared_ptr<Block> allocate(size_t bytes, uintptr_t stream,
                                  MemoryUse use = MemoryUse::tensor);
  // b is used by work on `stream` too (a copy or communication stream).
  void record_stream(Block* b, uintptr_t stream);
  void release(Block* b);  // called by ~Block
  DeviceAllocatorStats stats() const;
  void reset_peak();
  // Waits for the device and gives every cached block back to it.
  void trim();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace cohort::tensor
