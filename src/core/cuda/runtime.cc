// The CUDA runtime behind cuda.h (built when CUDA is found). It links CUDA's static runtime, which
// loads the driver at the first call: on a machine without one, device_count() is 0 and
// unavailable_reason() carries CUDA's message.
#include <cuda_runtime.h>

#include <mutex>
#include <sstream>
#include <vector>

#include "cohort/core/cuda.h"
#include "cohort/core/error.h"

namespace cohort::cuda {

namespace {

#define COHORT_CUDA_CALL(call)                                                                    \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      COHORT_THROW(#call << " failed: " << cudaGetErrorString(e_) << " (" << cudaGetErrorName(e_) \
                         << ")");                                                                 \
    }                                                                                             \
  } while (0)

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      std::ostringstream o;
      if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
        o << "no CUDA device is usable on this machine (" << cudaGetErrorString(e) << ")";
      } else {
        o << "CUDA could not be initialised: " << cudaGetErrorString(e);
      }
      r.reason = o.str();
      cudaGetLastError();  // clear the sticky error for later calls
    } else if (r.count == 0) {
      r.reason = "the CUDA driver reports no device";
    }
    return r;
  }();
  return p;
}

struct Current {
  std::mutex mu;
  int device = -1;
  cudaStream_t compute = nullptr, copy = nullptr;
};
Current& current() {
  static Current* c = new Current();  // never destroyed: streams outlive statics
  return *c;
}

}  // namespace

bool built() {
  return true;
}

int device_count() {
  return probe().count;
}

std::string unavailable_reason() {
  return probe().reason;
}

DeviceInfo info(int index) {
  cudaDeviceProp p{};
  COHORT_CUDA_CALL(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.total_memory = p.totalGlobalMem;
  d.major = p.major;
  d.minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  return d;
}

void use_device(int index, const std::string& why) {
  const int n = device_count();
  if (n == 0) {
    COHORT_THROW(why << ": " << unavailable_reason());
  }
  COHORT_CHECK(index >= 0 && index < n, why << " asks for GPU " << index
                                            << ", and this machine has " << n
                                            << (n == 1 ? " GPU" : " GPUs"));
  Current& c = current();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.device == index) return;
  COHORT_CHECK(c.device < 0, "this process already uses GPU " << c.device << "; asked for GPU "
                                                              << index << " (" << why << ")");
  COHORT_CUDA_CALL(cudaSetDevice(index));
  COHORT_CUDA_CALL(cudaStreamCreateWithFlags(&c.compute, cudaStreamNonBlocking));
  COHORT_CUDA_CALL(cudaStreamCreateWithFlags(&c.copy, cudaStreamNonBlocking));
  c.device = index;
}

bool device_chosen() {
  Current& c = current();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.device >= 0;
}

int current_device() {
  Current& c = current();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.device < 0) {
    if (device_count() == 0) COHORT_THROW("CUDA: " << unavailable_reason());
    COHORT_THROW("no CUDA device chosen (--device cuda chooses the local rank's)");
  }
  return c.device;
}

Stream Stream::compute() {
  current_device();
  return Stream(current().compute);
}

Stream Stream::copy() {
  current_device();
  return Stream(current().copy);
}

Stream Stream::create() {
  current_device();
  cudaStream_t s = nullptr;
  COHORT_CUDA_CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

void Stream::synchronize() const {
  COHORT_CUDA_CALL(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

Event::Event(bool timing) {
  cudaEvent_t e = nullptr;
  COHORT_CUDA_CALL(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = e;
}

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

void Event::record(const Stream& s) {
  COHORT_CUDA_CALL(
      cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(s.handle())));
}

void Event::wait(const Stream& s) const {
  COHORT_CUDA_CALL(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle()),
                                       static_cast<cudaEvent_t>(handle_), 0));
}

bool Event::done() const {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (e == cudaErrorNotReady) return false;
  COHORT_CUDA_CALL(e);
  return true;
}

void Event::synchronize() const {
  COHORT_CUDA_CALL(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

float Event::milliseconds_since(const Event& start) const {
  float ms = 0;
  COHORT_CUDA_CALL(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                        static_cast<cudaEvent_t>(handle_)));
  return ms;
}

void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  COHORT_CUDA_CALL(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;
}

void free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}

namespace {
void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const Stream& s) {
  if (bytes == 0) return;
  COHORT_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, kind, static_cast<cudaStream_t>(s.handle())));
}
}  // namespace

void copy_to_device(void* dst, const void* src, size_t bytes, const Stream& s) {
  copy(dst, src, bytes, cudaMemcpyHostToDevice, s);
}
void copy_to_host(void* dst, const void* src, size_t bytes, const Stream& s) {
  copy(dst, src, bytes, cudaMemcpyDeviceToHost, s);
}
void copy_on_device(void* dst, const void* src, size_t bytes, const Stream& s) {
  copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}
void memset_on_device(void* dst, int value, size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  COHORT_CUDA_CALL(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(s.handle())));
}

void* device_malloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  COHORT_CUDA_CALL(e);
  return p;
}

void device_free(void* p) {
  COHORT_CUDA_CALL(cudaFree(p));
}

namespace {
std::mutex g_events_mu;
std::vector<cudaEvent_t>& spare_events() {
  static auto* v = new std::vector<cudaEvent_t>();
  return *v;
}
}  // namespace

uint64_t record_event(uintptr_t stream) {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    if (!spare_events().empty()) {
      e = spare_events().back();
      spare_events().pop_back();
    }
  }
  if (!e) COHORT_CUDA_CALL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  COHORT_CUDA_CALL(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)));
  return reinterpret_cast<uint64_t>(e);
}

bool event_done(uint64_t event) {
  const cudaError_t e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  COHORT_CUDA_CALL(e);
  return true;
}

void release_event(uint64_t event) {
  std::lock_guard<std::mutex> lock(g_events_mu);
  spare_events().push_back(reinterpret_cast<cudaEvent_t>(event));
}

void device_synchronize() {
  COHORT_CUDA_CALL(cudaDeviceSynchronize());
}

}  // namespace cohort::cuda
