// The CUDA runtime as the rest of Cohort sees it: which devices there are, the device this
// process uses, streams, events, pinned host memory and copies. No CUDA header is needed to use
// it: a build without CUDA links src/core/cuda/absent.cc, whose device_count() is 0 and whose
// unavailable_reason() says why; a CUDA build links src/core/cuda/runtime.cc, which loads the
// driver only when first asked, so the same binary runs on machines with and without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::cuda {

// True when this binary was built with the GPU parts.
bool built();
// Devices this process can use; 0 where there is no driver or no device (never throws).
int device_count();
// Why device_count() is 0, in a sentence ("this build has no CUDA ...", "no CUDA driver ...").
std::string unavailable_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;  // "NVIDIA H100 80GB HBM3"
  size_t total_memory = 0;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
};
DeviceInfo info(int index);

// Makes `index` this process's device (cudaSetDevice) and creates its streams. Throws naming
// the index, the count and, where there is none, unavailable_reason(), after `why`, which says
// who asks and where the index came from ("--device cuda (local rank 3, from LOCAL_RANK)").
void use_device(int index, const std::string& why);
// The device use_device chose; throws when none was chosen.
int current_device();
bool device_chosen();

// A stream of the current device. Streams are created once per device and live until exit.
class Stream {
 public:
  Stream() = default;
  static Stream compute();  // where layers queue their work
  static Stream copy();     // host-to-device and device-to-host copies of the input pipeline
  static Stream create();   // a new one (a communication stream)
  void* handle() const { return handle_; }  // cudaStream_t
  uintptr_t id() const { return reinterpret_cast<uintptr_t>(handle_); }
  void synchronize() const;  // waits on the host for everything queued so far
  bool operator==(const Stream& o) const { return handle_ == o.handle_; }

 private:
  explicit Stream(void* h) : handle_(h) {}
  void* handle_ = nullptr;
};

// A CUDA event without timing unless asked: marks a point in a stream's work.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& s);
  void wait(const Stream& s) const;  // s waits on the device; the host goes on
  bool done() const;
  void synchronize() const;
  float milliseconds_since(const Event& start) const;  // both recorded with timing

 private:
  void* handle_ = nullptr;
};

// Page-locked host memory (copies from it run at the link's full rate and asynchronously).
void* alloc_pinned(size_t bytes);
void free_pinned(void* p);

// Copies queued on `s`: host to device, device to host, device to device. With pageable host
// memory CUDA copies through its own staging and the host waits.
void copy_to_device(void* dst, const void* src, size_t bytes, const Stream& s);
void copy_to_host(void* dst, const void* src, size_t bytes, const Stream& s);
void copy_on_device(void* dst, const void* src, size_t bytes, const Stream& s);
void memset_on_device(void* dst, int value, size_t bytes, const Stream& s);


// The raw calls under tensor::DeviceAllocator: cudaMalloc (nullptr when the device is out of
// memory), cudaFree, events from a pool to mark a stream's work, cudaDeviceSynchronize.
void* device_malloc(size_t bytes);
void device_free(void* p);
uint64_t record_event(uintptr_t stream);
bool event_done(uint64_t event);
void release_event(uint64_t event);  // back to the pool
void device_synchronize();

}  // namespace cohort::cuda
