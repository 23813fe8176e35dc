// cuda.h in a build without CUDA: there are no devices, and every call that needs one says
// that this build has none.
#include "cohort/core/cuda.h"
#include "cohort/core/error.h"

namespace cohort::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  COHORT_THROW(what << ": " << unavailable_reason());
}
}  // namespace

bool built() {
  return false;
}
int device_count() {
  return 0;
}
std::string unavailable_reason() {
  return "this build of Cohort has no GPU parts (CUDA was not found when it was built; "
         "scripts/build builds them where /usr/local/cuda has nvcc)";
}
DeviceInfo info(int) {
  no_cuda("cuda::info");
}
void use_device(int, const std::string& why) {
  COHORT_THROW(why << ": " << unavailable_reason());
}
int current_device() {
  no_cuda("cuda::current_device");
}
bool device_chosen() {
  return false;
}
Stream Stream::compute() {
  no_cuda("a CUDA stream");
}
Stream Stream::copy() {
  no_cuda("a CUDA stream");
}
Stream Stream::create() {
  no_cuda("a CUDA stream");
}
void Stream::synchronize() const {
  no_cuda("a CUDA stream");
}
Event::Event(bool) {
  no_cuda("a CUDA event");
}
Event::~Event() = default;
void Event::record(const Stream&) {}
void Event::wait(const Stream&) const {}
bool Event::done() const {
  return true;
}
void Event::synchronize() const {}
float Event::milliseconds_since(const Event&) const {
  return 0;
}
void* alloc_pinned(size_t) {
  no_cuda("pinned memory");
}
void free_pinned(void*) {}
void copy_to_device(void*, const void*, size_t, const Stream&) {
  no_cuda("a copy to the device");
}
void copy_to_host(void*, const void*, size_t, const Stream&) {
  no_cuda("a copy from the device");
}
void copy_on_device(void*, const void*, size_t, const Stream&) {
  no_cuda("a copy on the device");
}
void memset_on_device(void*, int, size_t, const Stream&) {
  no_cuda("a memset on the device");
}
void* device_malloc(size_t) {
  no_cuda("device memory");
}
void device_free(void*) {}
uint64_t record_event(uintptr_t) {
  no_cuda("a CUDA event");
}
bool event_done(uint64_t) {
  return true;
}
void release_event(uint64_t) {}
void device_synchronize() {}

}  // namespace cohort::cuda
