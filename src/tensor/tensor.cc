#include "cohort/tensor/tensor.h"

#include <sys/mman.h>

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "cohort/core/cuda.h"
#include "cohort/core/env.h"
#include "cohort/core/half.h"
#include "cohort/core/settings.h"
#include "cohort/tensor/device_allocator.h"

namespace cohort::tensor {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

std::string shape_string(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape strides_for(const Shape& shape, Order order) {
  Shape st(shape.size());
  if (order == Order::channels_last && shape.size() == 4) {
    const int64_t c = shape[1], h = shape[2], w = shape[3];
    st = {h * w * c, 1, w * c, c};
    return st;
  }
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// Allocator: exact-size free lists. Training repeats the same shapes every step, so after the
// first step every request is served from the cache; a best fit within 1/8 extra is accepted
// so that the last, shorter batch of an epoch reuses blocks too.

struct Allocator::State {
  mutable std::mutex mu;
  std::multimap<size_t, void*> free;  // bytes -> block
  AllocatorStats stats;
  bool cache = true;
};

Allocator::Allocator() : s_(std::make_unique<State>()) {
  s_->cache = env::Settings::read().alloc_cache;
}

Allocator& Allocator::cpu() {
  static Allocator* a = new Allocator();  // never destroyed: blocks may outlive statics
  return *a;
}

std::shared_ptr<Block> Allocator::allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) & ~size_t{63};
  auto b = std::make_shared<Block>();
  b->bytes = rounded;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stats.allocations++;
    auto it = s_->free.lower_bound(rounded);
    if (it != s_->free.end() && it->first <= rounded + rounded / 8) {
      b->ptr = it->second;
      b->bytes = it->first;
      s_->stats.cached -= it->first;
      s_->free.erase(it);
      s_->stats.cache_hits++;
    }
    s_->stats.in_use += b->bytes;
    s_->stats.peak_in_use = std::max(s_->stats.peak_in_use, s_->stats.in_use);
  }
  if (!b->ptr) {
    // Blocks of a MiB and more start on a page: ZeRO frees whole pages of the flat buffers.
    const size_t align = rounded >= (size_t{1} << 20) ? 4096 : 64;
    b->ptr = std::aligned_alloc(align, (rounded + align - 1) & ~(align - 1));
    if (!b->ptr) {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stats.in_use -= b->bytes;
      b->owned = false;
      COHORT_THROW("out of memory allocating " << env::format_bytes(rounded) << " (in use "
                                               << env::format_bytes(s_->stats.in_use) << ")");
    }
  }
  return b;
}

void Allocator::release(Block* b) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->stats.in_use -= b->bytes;
  if (s_->cache) {
    s_->free.emplace(b->bytes, b->ptr);
    s_->stats.cached += b->bytes;
  } else {
    std::free(b->ptr);
  }
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->stats;
}

void Allocator::trim() {
  std::lock_guard<std::mutex> lock(s_->mu);
  for (auto& [bytes, ptr] : s_->free) std::free(ptr);
  s_->free.clear();
  s_->stats.cached = 0;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->stats.peak_in_use = s_->stats.in_use;
}

Block::~Block() {
  if (!owned || !ptr) return;
  if (device_allocator) {
    device_allocator->release(this);
  } else {
    Allocator::cpu().release(this);
  }
}

const char* device_name(Device d) {
  return d == Device::cuda ? "cuda" : "cpu";
}

std::string device_string(Device d) {
  if (d == Device::cpu) return "cpu";
  return cuda::device_chosen() ? "cuda:" + std::to_string(cuda::current_device()) : "cuda";
}

void require_host(const Tensor& t, const char* what) {
  COHORT_CHECK(t.device() == Device::cpu, what << " runs on the CPU, and its tensor "
                                               << shape_string(t.shape()) << " is on "
                                               << device_string(t.device()));
}

void require_same_device(const char* where, const char* a_name, const Tensor& a, const char* b_name,
                         const Tensor& b) {
  COHORT_CHECK(a.device() == b.device(), where << ": the " << a_name << " is on "
                                               << device_string(a.device()) << " and the " << b_name
                                               << " on " << device_string(b.device()));
}

// ---------------------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Order order) {
  for (int64_t d : shape) COHORT_CHECK(d >= 0, "negative dimension in " << shape_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = strides_for(shape, order);
  t.dtype_ = dtype;
  t.block_ = Allocator::cpu().allocate(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
  return t;
}

Tensor Tensor::empty_on(Device device, const Shape& shape, DType dtype, Order order) {
  if (device == Device::cpu) return empty(shape, dtype, order);
  for (int64_t d : shape) COHORT_CHECK(d >= 0, "negative dimension in " << shape_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = strides_for(shape, order);
  t.dtype_ = dtype;
  t.device_ = device;
  t.block_ = DeviceAllocator::cuda().allocate(
      static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), cuda::Stream::compute().id());
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  // Across devices the bytes move as they are: a dense tensor keeps its order.
  const Tensor src = is_dense() ? *this : contiguous();
  Tensor t = empty_on(device, src.shape_, src.dtype_, src.order());
  const cuda::Stream s = cuda::Stream::compute();
  if (device == Device::cuda) {
    cuda::copy_to_device(t.raw(), src.raw(), src.bytes(), s);
    // A pageable source is copied before cudaMemcpyAsync returns; wait anyway so that the
    // caller may free or change src at once whatever memory it is in.
    s.synchronize();
  } else {
    cuda::copy_to_host(t.raw(), src.raw(), src.bytes(), s);
    s.synchronize();
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Order order) {
  Tensor t = empty(shape, dtype, order);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Order order) {
  Tensor t = empty(shape, DType::f32, order);
  t.fill_(value);
  return t;
}

Tensor Tensor::wrap(void* ptr, const Shape& shape, DType dtype, Order order, Device device) {
  Tensor t;
  t.device_ = device;
  t.shape_ = shape;
  t.strides_ = strides_for(shape, order);
  t.dtype_ = dtype;
  t.block_ = std::make_shared<Block>();
  t.block_->ptr = ptr;
  t.block_->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  t.block_->owned = false;
  t.block_->device = device;
  return t;
}

Tensor Tensor::view_of(const Tensor& base, size_t byte_offset, const Shape& shape) {
  Tensor t;
  t.block_ = base.block_;
  t.offset_ = base.offset_ + byte_offset;
  t.shape_ = shape;
  t.strides_ = strides_for(shape, Order::contiguous);
  t.dtype_ = base.dtype_;
  t.device_ = base.device_;
  COHORT_CHECK(t.offset_ + t.bytes() <= base.block_->bytes,
               "view " << shape_string(shape) << " at byte " << byte_offset
                       << " runs past its block of " << base.block_->bytes << " bytes");
  return t;
}

bool Tensor::is_contiguous() const {
  return strides_ == strides_for(shape_, Order::contiguous);
}

bool Tensor::is_channels_last() const {
  return shape_.size() == 4 && strides_ == strides_for(shape_, Order::channels_last);
}

Tensor Tensor::reshape(const Shape& shape) const {
  COHORT_CHECK(is_contiguous(), "reshape of a non-contiguous tensor " << shape_string(shape_));
  COHORT_CHECK(shape_numel(shape) == numel(),
               "reshape " << shape_string(shape_) << " to " << shape_string(shape));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = strides_for(shape, Order::contiguous);
  return t;
}

Tensor Tensor::reinterpret(const Shape& shape, Order order) const {
  COHORT_CHECK(is_dense() && shape_numel(shape) == numel(),
               "reinterpret " << shape_string(shape_) << " as " << shape_string(shape));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = strides_for(shape, order);
  return t;
}

Tensor Tensor::narrow0(int64_t begin, int64_t end) const {
  COHORT_CHECK(dim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
               "narrow0 [" << begin << ", " << end << ") of " << shape_string(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += static_cast<size_t>(begin * strides_[0]) * dtype_size(dtype_);
  return t;
}

Tensor& Tensor::zero_() {
  if (device_ == Device::cuda && is_dense()) {
    cuda::memset_on_device(raw(), 0, bytes(), cuda::Stream::compute());
    return *this;
  }
  if (is_dense()) {
    std::memset(raw(), 0, bytes());
    return *this;
  }
  COHORT_THROW("zero_ of a strided tensor " << shape_string(shape_));
}

Tensor& Tensor::fill_(float value) {
  require_host(*this, "fill_");
  COHORT_CHECK(dtype_ == DType::f32 && is_dense(), "fill_ needs a dense f32 tensor");
  float* p = data<float>();
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
  return *this;
}

namespace {

float load_as_f32(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::i64:
      return static_cast<float>(static_cast<const int64_t*>(base)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

void store_from_f32(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::bf16:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(v);
      return;
    case DType::f16:
      static_cast<uint16_t*>(base)[i] = f32_to_f16(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      return;
    case DType::u8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      return;
  }
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  COHORT_CHECK(src.shape_ == shape_,
               "copy_ from " << shape_string(src.shape_) << " into " << shape_string(shape_));
  if (device_ == Device::cuda || src.device_ == Device::cuda) {
    COHORT_CHECK(
        src.dtype_ == dtype_ && src.strides_ == strides_ && is_dense(),
        "copy_ between " << device_string(src.device_) << " and " << device_string(device_)
                         << " moves bytes as they are: both dense, of one dtype and order");
    const cuda::Stream s = cuda::Stream::compute();
    if (device_ == Device::cuda && src.device_ == Device::cuda) {
      cuda::copy_on_device(raw(), src.raw(), bytes(), s);
    } else if (device_ == Device::cuda) {
      cuda::copy_to_device(raw(), src.raw(), bytes(), s);
      s.synchronize();
    } else {
      cuda::copy_to_host(raw(), src.raw(), bytes(), s);
      s.synchronize();
    }
    return *this;
  }
  if (src.dtype_ == dtype_ && src.strides_ == strides_ && is_dense()) {
    std::memcpy(raw(), src.raw(), bytes());
    return *this;
  }
  const int64_t n = numel();
  if (n == 0) return *this;
  // Walk the logical index space; 4-d tensors (the common layout change) get a fast path.
  const int nd = dim();
  if (src.dtype_ == dtype_ && dtype_ == DType::f32 && nd == 4) {
    const float* s = src.data<float>();
    float* d = data<float>();
    const auto& ss = src.strides_;
    const auto& ds = strides_;
#pragma omp parallel for collapse(2)
    for (int64_t a = 0; a < shape_[0]; ++a)
      for (int64_t b = 0; b < shape_[1]; ++b)
        for (int64_t c = 0; c < shape_[2]; ++c)
          for (int64_t e = 0; e < shape_[3]; ++e)
            d[a * ds[0] + b * ds[1] + c * ds[2] + e * ds[3]] =
                s[a * ss[0] + b * ss[1] + c * ss[2] + e * ss[3]];
    return *this;
  }
  std::vector<int64_t> idx(nd, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t so = 0, doff = 0;
    for (int k = 0; k < nd; ++k) {
      so += idx[k] * src.strides_[k];
      doff += idx[k] * strides_[k];
    }
    store_from_f32(raw(), dtype_, doff, load_as_f32(src.raw(), src.dtype_, so));
    for (int k = nd - 1; k >= 0; --k) {
      if (++idx[k] < shape_[k]) break;
      idx[k] = 0;
    }
  }
  return *this;
}

Tensor Tensor::clone(Order order) const {
  Tensor t = empty_on(device_, shape_, dtype_, order);
  t.copy_(*this);
  return t;
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone(Order::contiguous);
}

Tensor Tensor::channels_last() const {
  return is_channels_last() ? *this : clone(Order::channels_last);
}

// ---------------------------------------------------------------------------------------------

namespace {
void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  require_host(a, op);
  require_host(b, op);
  COHORT_CHECK(a.shape() == b.shape() && a.strides() == b.strides() && a.is_dense() &&
                   a.dtype() == DType::f32 && b.dtype() == DType::f32,
               op << ": " << shape_string(a.shape()) << " vs " << shape_string(b.shape())
                  << " (both dense f32 in one layout)");
}
}  // namespace

void add_(Tensor& dst, const Tensor& src, float alpha) {
  check_pair(dst, src, "add_");
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  const int64_t n = dst.numel();
  if (alpha == 1.0f) {
#pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
#pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] += alpha * s[i];
  }
}

void add_into(Tensor& dst, const Tensor& a, const Tensor& b) {
  check_pair(dst, a, "add_into");
  check_pair(dst, b, "add_into");
  float* d = dst.data<float>();
  const float* p = a.data<float>();
  const float* q = b.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for simd if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] = p[i] + q[i];
}

void scale_(Tensor& dst, float s) {
  require_host(dst, "scale_");
  COHORT_CHECK(dst.is_dense() && dst.dtype() == DType::f32, "scale_ needs dense f32");
  float* d = dst.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for simd if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] *= s;
}

double sum(const Tensor& t) {
  require_host(t, "sum");
  COHORT_CHECK(t.is_dense() && t.dtype() == DType::f32, "sum needs dense f32");
  const float* p = t.data<float>();
  double acc = 0;
  const int64_t n = t.numel();
#pragma omp parallel for reduction(+ : acc) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) acc += p[i];
  return acc;
}

void drop_pages(void* p, size_t bytes) {
  constexpr uintptr_t kPage = 4096;
  auto* b = static_cast<char*>(p);
  char* e = b + bytes;
  auto* pb = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b) + kPage - 1) & ~(kPage - 1));
  auto* pe = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(e) & ~(kPage - 1));
  if (pb >= pe) {
    std::memset(b, 0, bytes);
    return;
  }
  std::memset(b, 0, static_cast<size_t>(pb - b));
  std::memset(pe, 0, static_cast<size_t>(e - pe));
  COHORT_CHECK(::madvise(pb, static_cast<size_t>(pe - pb), MADV_DONTNEED) == 0,
               "madvise(DONTNEED) of " << (pe - pb) << " bytes: " << std::strerror(errno));
}

void prefer_huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  // A kernel without transparent huge pages refuses (EINVAL): 4 KiB pages then, as before.
  if (b < e) (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
}

double sum_squares(const Tensor& t) {
  require_host(t, "sum_squares");
  COHORT_CHECK(t.is_dense() && t.dtype() == DType::f32, "sum_squares needs dense f32");
  const float* p = t.data<float>();
  double acc = 0;
  const int64_t n = t.numel();
#pragma omp parallel for reduction(+ : acc) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]) * p[i];
  return acc;
}

bool all_finite(const Tensor& t) {
  require_host(t, "all_finite");
  COHORT_CHECK(t.is_dense() && t.dtype() == DType::f32, "all_finite needs dense f32");
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  int bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(p[i]);
  return bad == 0;
}

double max_abs(const Tensor& t) {
  require_host(t, "max_abs");
  COHORT_CHECK(t.is_dense() && t.dtype() == DType::f32, "max_abs needs dense f32");
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  float m = 0;
  int bad = 0;
#pragma omp parallel for reduction(max : m) reduction(| : bad) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    bad |= !std::isfinite(p[i]);
    m = std::max(m, std::abs(p[i]));
  }
  return bad ? std::numeric_limits<double>::infinity() : m;
}

void set_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

int threads() {
  return omp_get_max_threads();
}

}  // namespace cohort::tensor
