// Tensors: a shape, strides, a dtype and a device over a shared block of memory. Blocks come
// from a caching allocator so that a training step, whose shapes repeat, allocates nothing new
// after the first. 4-d activations are kept channels-last (NHWC strides over a logical NCHW
// shape), the layout oneDNN's fastest CPU kernels read and write directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::tensor {

enum class DType : uint8_t { f32, bf16, f16, i64, u8 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", ...

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& s);  // "[16, 64, 32, 32]"
int64_t shape_numel(const Shape& s);

// Memory order of a new tensor: row-major, or channels-last for 4-d shapes.
enum class Order : uint8_t { contiguous, channels_last };

class DeviceAllocator;

// One allocation. Returned to the allocator's cache when the last tensor using it goes.
struct Block {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device = Device::cpu;
  bool owned = true;  // false: wraps memory someone else owns
  // Device memory: the allocator it returns to, the stream it was allocated for, the other
  // streams that used it (see device_allocator.h), and what it is for (MemoryUse).
  DeviceAllocator* device_allocator = nullptr;
  uintptr_t stream = 0;
  std::vector<uintptr_t> other_streams;
  uint8_t use = 0;
  ~Block();
};

struct AllocatorStats {
  size_t in_use = 0, peak_in_use = 0, cached = 0;
  uint64_t allocations = 0, cache_hits = 0;
};

// 64-byte aligned host memory, cached by size. COHORT_ALLOC_CACHE=0 frees at once instead.
class Allocator {
 public:
  static Allocator& cpu();
  std::shared_ptr<Block> allocate(size_t bytes);
  void release(Block* b);  // called by ~Block
  AllocatorStats stats() const;
  void reset_peak();  // peak_in_use starts again from in_use
  void trim();        // frees every cached block (after a set-up that dropped large buffers)

 private:
  Allocator();
  struct State;
  std::unique_ptr<State> s_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype = DType::f32,
                      Order order = Order::contiguous);
  // On `device`: cuda takes memory from DeviceAllocator::cuda() for the compute stream.
  static Tensor empty_on(Device device, const Shape& shape, DType dtype = DType::f32,
                         Order order = Order::contiguous);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32,
                      Order order = Order::contiguous);
  static Tensor full(const Shape& shape, float value, Order order = Order::contiguous);
  // A view of memory owned elsewhere (a batch buffer, a mapped file); the caller keeps it alive.
  static Tensor wrap(void* ptr, const Shape& shape, DType dtype, Order order = Order::contiguous,
                     Device device = Device::cpu);
  // Shares `base`'s block at a byte offset (flat parameter buffers hand out such views).
  static Tensor view_of(const Tensor& base, size_t byte_offset, const Shape& shape);

  bool defined() const { return block_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_contiguous() const;
  bool is_channels_last() const;
  // Dense: the elements fill numel() consecutive slots in some order (either order above).
  bool is_dense() const { return is_contiguous() || is_channels_last(); }
  // The order a copy of this tensor keeps (channels-last stays channels-last).
  Order order() const { return is_channels_last() ? Order::channels_last : Order::contiguous; }

  void* raw() const { return static_cast<char*>(block_->ptr) + offset_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  const std::shared_ptr<Block>& block() const { return block_; }

  // Same memory, another shape; only for contiguous tensors.
  Tensor reshape(const Shape& shape) const;
  // The same dense memory read with another shape and order; the caller vouches that the
  // element order matches (a channels-last [N, C, 1, 1] is a contiguous [N, C]).
  Tensor reinterpret(const Shape& shape, Order order) const;
  // Rows [begin, end) of dimension 0 (a slice of the batch).
  Tensor narrow0(int64_t begin, int64_t end) const;

  Tensor& zero_();
  Tensor& fill_(float value);  // f32 only
  // Copies values element by element, converting layout (and f32 <-> bf16/f16).
  Tensor& copy_(const Tensor& src);
  Tensor clone(Order order) const;
  // A dense copy on `device` (this when already there); across devices the copy is queued on
  // the compute stream, and a copy to the host waits for it.
  Tensor to(Device device) const;
  Tensor contiguous() const;  // this when already contiguous
  Tensor channels_last() const;

 private:
  std::shared_ptr<Block> block_;
  size_t offset_ = 0;
  Shape shape_, strides_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

Shape strides_for(const Shape& shape, Order order);

const char* device_name(Device d);  // "cpu", "cuda"
// "cpu", or "cuda:N" for a tensor on this process's CUDA device.
std::string device_string(Device d);
// Throws unless t is in host memory: the loops of this file read it on the CPU. `what` names
// the caller ("add_").
void require_host(const Tensor& t, const char* what);
// Throws unless a and b are on the same device, naming both: "Conv2d: the input is on cuda:0
// and the weight on cpu". Layers check this at their boundary.
void require_same_device(const char* where, const char* a_name, const Tensor& a, const char* b_name,
                         const Tensor& b);

// f32 kernels over dense tensors of the same shape and layout (vectorised loops).
void add_(Tensor& dst, const Tensor& src, float alpha = 1.0f);  // dst += alpha * src
void add_into(Tensor& dst, const Tensor& a, const Tensor& b);   // dst = a + b
void scale_(Tensor& dst, float s);
double sum(const Tensor& t);
double sum_squares(const Tensor& t);
// Zeroes [p, p + bytes) and returns the whole pages in it to the kernel (madvise DONTNEED on
// this private anonymous memory): it reads back as zeros and costs no memory until written.
// What a new layout and ZeRO do with flat buffers they do not keep whole.
void drop_pages(void* p, size_t bytes);
// Asks the kernel for transparent huge pages (2 MiB) in [p, p + bytes) (madvise HUGEPAGE on
// the 2 MiB-aligned part; nothing where the kernel has none). For memory dropped and written
// again every step: a fault then maps 2 MiB, not 4 KiB. Measured on this VM, taking 42 MB back
// after drop_pages cost 128 ms in 4 KiB faults (12 us each) and 2.4 ms in huge pages.
void prefer_huge_pages(void* p, size_t bytes);
bool all_finite(const Tensor& t);
double max_abs(const Tensor& t);  // inf or nan when any element is

// C = alpha * op(A) op(B) + beta * C, 2-d f32, through oneDNN's matmul.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float beta = 0.0f);

// Threads used by the compute kernels (OpenMP under oneDNN); 0 keeps the default.
void set_threads(int n);
int threads();

}  // namespace cohort::tensor
