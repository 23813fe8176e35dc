// Scratch memory of the data pipeline's device stages (jpeg_device, dicom_device,
// augment_device): a device or page-locked host buffer that grows when a batch needs more, by a
// quarter more than asked so that slightly larger batches do not reallocate, and otherwise
// stays. Built with CUDA only.
#pragma once

#include <cstddef>

#include "cohort/core/cuda.h"
#include "cohort/core/error.h"

namespace cohort::data {

class GrowingBuffer {
 public:
  explicit GrowingBuffer(bool pinned) : pinned_(pinned) {}
  ~GrowingBuffer() { release(); }
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;

  void* reserve(size_t bytes) {
    if (bytes_ >= bytes && p_) return p_;
    release();
    const size_t want = bytes + bytes / 4 + 256;
    p_ = pinned_ ? cuda::alloc_pinned(want) : cuda::device_malloc(want);
    COHORT_CHECK(p_, "out of device memory for " << want << " bytes of the input pipeline");
    bytes_ = want;
    return p_;
  }

 private:
  void release() {
    if (!p_) return;
    pinned_ ? cuda::free_pinned(p_) : cuda::device_free(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  bool pinned_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Offsets within a staged buffer start on 256 bytes (CUDA's allocation alignment).
inline size_t align256(size_t n) {
  return (n + 255) & ~size_t{255};
}

}  // namespace cohort::data
