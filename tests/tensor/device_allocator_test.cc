// The caching device allocator's policy (tensor/device_allocator.h) over host memory standing in
// for a device: the test decides when each stream's events complete, which is what the policy
// depends on. CUDA's DeviceMemory under the same policy runs in scripts/gpu-check.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "cohort/core/error.h"
#include "cohort/tensor/device_allocator.h"

namespace {

using cohort::tensor::Block;
using cohort::tensor::DeviceAllocator;
using cohort::tensor::DeviceMemory;
using cohort::tensor::MemoryUse;

// Host memory with a capacity, and events that complete when the test says their stream has
// run (finish(stream)).
struct HostDevice {
  size_t capacity = 1 << 30, used = 0;
  std::map<void*, size_t> live;
  uint64_t next_event = 1;
  std::map<uint64_t, uintptr_t> events;  // event -> stream, while not done
  std::set<uint64_t> released;
  int synchronizations = 0;
  void finish(uintptr_t stream) {
    for (auto it = events.begin(); it != events.end();)
      it = it->second == stream ? events.erase(it) : std::next(it);
  }
};

class HostMemory final : public DeviceMemory {
 public:
  explicit HostMemory(HostDevice* d) : d_(d) {}
  void* allocate(size_t bytes) override {
    if (d_->used + bytes > d_->capacity) return nullptr;
    void* p = std::malloc(bytes);
    d_->used += bytes;
    d_->live[p] = bytes;
    return p;
  }
  void free(void* p) override {
    d_->used -= d_->live.at(p);
    d_->live.erase(p);
    std::free(p);
  }
  uint64_t record_event(uintptr_t stream) override {
    d_->events[d_->next_event] = stream;
    return d_->next_event++;
  }
  bool event_done(uint64_t e) override { return d_->events.count(e) == 0; }
  void release_event(uint64_t e) override { d_->released.insert(e); }
  void synchronize() override {
    d_->synchronizations++;
    d_->events.clear();
  }
  size_t total_memory() override { return d_->capacity; }
  std::string name() override { return "host:0 (test)"; }

 private:
  HostDevice* d_;
};

constexpr uintptr_t kCompute = 1, kComm = 2;

TEST(DeviceAllocator, ReusesABlockFreedOnTheSameStreamAtOnce) {
  HostDevice dev;
  DeviceAllocator a(std::make_unique<HostMemory>(&dev));
  void* first = nullptr;
  {
    auto b = a.allocate(1000, kCompute);
    first = b->ptr;
    EXPECT_EQ(b->bytes, 1024u);  // rounded to 512
    EXPECT_EQ(a.stats().in_use, 1024u);
  }
  EXPECT_EQ(a.stats().in_use, 0u);
  EXPECT_EQ(a.stats().cached, 1024u);
  auto again = a.allocate(900, kCompute);  // 1024 is within 1/8 of 1024: reused
  EXPECT_EQ(again->ptr, first);
  const auto s = a.stats();
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.device_allocations, 1u);
  EXPECT_EQ(s.reserved, 1024u);
  EXPECT_EQ(s.cached, 0u);
}

TEST(DeviceAllocator, AnotherStreamGetsItsOwnBlock) {
  HostDevice dev;
  DeviceAllocator a(std::make_unique<HostMemory>(&dev));
  void* first = a.allocate(4096, kCompute)->ptr;  // freed at once into kCompute's list
  auto other = a.allocate(4096, kComm);
  EXPECT_NE(other->ptr, first);  // kComm's work is not ordered after kCompute's
  EXPECT_EQ(a.stats().device_allocations, 2u);
  EXPECT_EQ(a.stats().cache_hits, 0u);
}

TEST(DeviceAllocator, ABlockUsedByAnotherStreamWaitsForIt) {
  HostDevice dev;
  DeviceAllocator a(std::make_unique<HostMemory>(&dev));
  void* p = nullptr;
  {
    auto b = a.allocate(8192, kCompute);
    p = b->ptr;
    a.record_stream(b.get(), kComm);  // a gradient bucket the communication stream reads
  }
  EXPECT_EQ(a.stats().pending, 8192u);
  EXPECT_EQ(a.stats().cached, 0u);
  auto busy = a.allocate(8192, kCompute);  // kComm may still read p
  EXPECT_NE(busy->ptr, p);
  dev.finish(kComm);
  auto free_now = a.allocate(8192, kCompute);
  EXPECT_EQ(free_now->ptr, p);
  EXPECT_EQ(a.stats().pending, 0u);
  EXPECT_EQ(dev.released.size(), 1u);  // the event went back to the pool
}

TEST(DeviceAllocator, BestFitTakesAtMostAnEighthMore) {
  HostDevice dev;
  DeviceAllocator a(std::make_unique<HostMemory>(&dev));
  void* big = a.allocate(1 << 20, kCompute)->ptr;
  auto half = a.allocate(1 << 19, kCompute);
  EXPECT_NE(half->ptr, big);
  auto close = a.allocate((1 << 20) - 100 * 1024, kCompute);  // 1 MiB is < 1/8 larger
  EXPECT_EQ(close->ptr, big);
}

TEST(DeviceAllocator, OutOfMemoryGivesTheCacheBackOnceThenNamesTheDevice) {
  HostDevice dev;
  dev.capacity = 16 * 1024;
  DeviceAllocator a(std::make_unique<HostMemory>(&dev));
  a.allocate(12 * 1024, kComm);  // cached on kComm, holding 12 KiB of the 16
  EXPECT_EQ(a.stats().cached, 12u * 1024);
  auto b = a.allocate(8 * 1024, kCompute);  // fits only once kComm's block is given back
  ASSERT_TRUE(b->ptr);
  auto s = a.stats();
  EXPECT_EQ(s.out_of_memory_retries, 1u);
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.reserved, 8u * 1024);
  EXPECT_EQ(dev.synchronizations, 1);
  try {
    a.allocate(10 * 1024, kCompute);
    FAIL() << "expected an out-of-memory error";
  } catch (const cohort::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of device memory on host:0 (test) allocating 10K: 8K in use"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("device total 16K"), std::string::npos) << m;
  }
  EXPECT_EQ(a.stats().in_use, 8u * 1024);  // the failed request left nothing behind
}

TEST(DeviceAllocator, WorkspacesAreCountedApartAndPeaksReset) {
  HostDevice dev;
  DeviceAllocator a(std::make_unique<HostMemory>(&dev));
  {
    auto t = a.allocate(4096, kCompute);
    auto w = a.allocate(64 * 1024, kCompute, MemoryUse::workspace);
    auto s = a.stats();
    EXPECT_EQ(s.workspace, 64u * 1024);
    EXPECT_EQ(s.in_use, 68u * 1024);
  }
  auto s = a.stats();
  EXPECT_EQ(s.workspace, 0u);
  EXPECT_EQ(s.peak_workspace, 64u * 1024);
  EXPECT_EQ(s.peak_in_use, 68u * 1024);
  a.reset_peak();
  s = a.stats();
  EXPECT_EQ(s.peak_in_use, 0u);
  EXPECT_EQ(s.peak_workspace, 0u);
  EXPECT_EQ(s.peak_reserved, s.reserved);
  a.trim();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(dev.used, 0u);  // every block went back to the device
}

TEST(DeviceAllocator, DestroyingItWaitsAndGivesEverythingBack) {
  HostDevice dev;
  {
    DeviceAllocator a(std::make_unique<HostMemory>(&dev));
    auto b = a.allocate(2048, kCompute);
    a.record_stream(b.get(), kComm);
    b.reset();  // pending on kComm, which never finishes by itself
    a.allocate(4096, kComm);
    EXPECT_GT(dev.used, 0u);
  }
  EXPECT_EQ(dev.used, 0u);
  EXPECT_GE(dev.synchronizations, 1);
}

}  // namespace
