// cuDNN convolution (see conv_cudnn.h): descriptors for channels-last tensors, the algorithm
// search done once per layer and shape, and the three calls.
#include "conv_cudnn.h"

#include <cudnn.h>

#include <algorithm>
#include <mutex>
#include <sstream>

#include "cohort/core/cuda.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/tensor/device_allocator.h"

namespace cohort::nn::gpu {

using tensor::DType;
using tensor::Tensor;

namespace {

#define COHORT_CUDNN(call)                                            \
  do {                                                                \
    const cudnnStatus_t st_ = (call);                                 \
    if (st_ != CUDNN_STATUS_SUCCESS) {                                \
      COHORT_THROW(#call << " failed: " << cudnnGetErrorString(st_)); \
    }                                                                 \
  } while (0)

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::f16:
      return CUDNN_DATA_HALF;
    default:
      COHORT_THROW("cuDNN convolutions take f32, bf16 or f16, not " << tensor::dtype_name(t));
  }
}

// One cuDNN handle for the process's device, bound to its compute stream.
cudnnHandle_t cudnn_handle() {
  static std::once_flag once;
  static cudnnHandle_t h = nullptr;
  std::call_once(once, [] {
    COHORT_CUDNN(cudnnCreate(&h));
    COHORT_CUDNN(cudnnSetStream(h, static_cast<cudaStream_t>(cuda::Stream::compute().handle())));
  });
  return h;
}

// A 4-d descriptor over a logical NCHW shape with channels-last strides.
void set_nhwc(cudnnTensorDescriptor_t d, const tensor::Shape& s, DType t) {
  const int n = static_cast<int>(s[0]), c = static_cast<int>(s[1]), h = static_cast<int>(s[2]),
            w = static_cast<int>(s[3]);
  COHORT_CUDNN(cudnnSetTensor4dDescriptorEx(d, cudnn_type(t), n, c, h, w, h * w * c, 1, w * c, c));
}

void check_on_device(const char* what, const Tensor& t, const tensor::Shape& shape, DType type) {
  COHORT_CHECK(t.device() == tensor::Device::cuda,
               "cuDNN convolution: the " << what << " is on " << tensor::device_string(t.device()));
  COHORT_CHECK(t.shape() == shape && t.dtype() == type,
               "cuDNN convolution: the " << what << " is " << tensor::shape_string(t.shape()) << " "
                                         << tensor::dtype_name(t.dtype()) << ", planned "
                                         << tensor::shape_string(shape) << " "
                                         << tensor::dtype_name(type));
}

}  // namespace

struct CudnnConv::Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  ~Descriptors() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

CudnnConv::CudnnConv(const Conv2dOptions& o, const tensor::Shape& x, tensor::Order weight_order,
                     const ConvSettings& s)
    : d_(new Descriptors()), x_shape_(x), s_(s) {
  COHORT_CHECK(x.size() == 4 && x[1] == o.in, "cuDNN convolution: input " << tensor::shape_string(x)
                                                                          << " for " << o.in
                                                                          << " channels");
  const DType t = s.type;
  COHORT_CUDNN(cudnnCreateTensorDescriptor(&d_->x));
  COHORT_CUDNN(cudnnCreateTensorDescriptor(&d_->y));
  COHORT_CUDNN(cudnnCreateFilterDescriptor(&d_->w));
  COHORT_CUDNN(cudnnCreateConvolutionDescriptor(&d_->conv));
  set_nhwc(d_->x, x, t);
  w_shape_ = {o.out, o.in / o.groups, o.kernel, o.kernel};
  COHORT_CUDNN(cudnnSetFilter4dDescriptor(
      d_->w, cudnn_type(t),
      weight_order == tensor::Order::channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, o.out,
      o.in / o.groups, o.kernel, o.kernel));
  // Accumulation in f32 whatever the input type (as PyTorch's autocast convolutions).
  COHORT_CUDNN(cudnnSetConvolution2dDescriptor(d_->conv, o.padding, o.padding, o.stride, o.stride,
                                               o.dilation, o.dilation, CUDNN_CROSS_CORRELATION,
                                               CUDNN_DATA_FLOAT));
  COHORT_CUDNN(cudnnSetConvolutionGroupCount(d_->conv, o.groups));
  // f32 without TF32 must not touch tensor cores (CUDNN_FMA_MATH); bf16 and f16 use them.
  const cudnnMathType_t math = t != DType::f32 ? CUDNN_TENSOR_OP_MATH
                               : s.tf32        ? CUDNN_DEFAULT_MATH
                                               : CUDNN_FMA_MATH;
  COHORT_CUDNN(cudnnSetConvolutionMathType(d_->conv, math));
  int n, c, h, w;
  COHORT_CUDNN(cudnnGetConvolution2dForwardOutputDim(d_->conv, d_->x, d_->w, &n, &c, &h, &w));
  y_shape_ = {n, c, h, w};
  set_nhwc(d_->y, y_shape_, t);

  // The search runs each candidate on scratch tensors of the real shapes, in a workspace of
  // the limit, and keeps the fastest that fits: once, here.
  const tensor::Device dev = tensor::Device::cuda;
  Tensor xs = Tensor::empty_on(dev, x_shape_, t, tensor::Order::channels_last);
  Tensor ys = Tensor::empty_on(dev, y_shape_, t, tensor::Order::channels_last);
  Tensor ws = Tensor::empty_on(dev, w_shape_, t, weight_order);
  xs.zero_();
  ys.zero_();
  ws.zero_();
  auto& alloc = tensor::DeviceAllocator::cuda();
  auto scratch =
      alloc.allocate(s.workspace_limit, cuda::Stream::compute().id(), tensor::MemoryUse::workspace);
  cudnnHandle_t hd = cudnn_handle();
  constexpr int kMax = 16;
  int found = 0;
  {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    COHORT_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(hd, d_->x, xs.raw(), d_->w, ws.raw(),
                                                        d_->conv, d_->y, ys.raw(), kMax, &found,
                                                        perf, scratch->ptr, s.workspace_limit));
    auto* best = std::find_if(perf, perf + found, [&](const auto& p) {
      return p.status == CUDNN_STATUS_SUCCESS && p.memory <= s.workspace_limit;
    });
    COHORT_CHECK(best != perf + found, "cuDNN has no forward algorithm for "
                                           << tensor::shape_string(x) << " within "
                                           << env::format_bytes(s.workspace_limit));
    d_->fwd = best->algo;
    d_->fwd_ws = best->memory;
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    COHORT_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
        hd, d_->w, ws.raw(), d_->y, ys.raw(), d_->conv, d_->x, xs.raw(), kMax, &found, perf,
        scratch->ptr, s.workspace_limit));
    auto* best = std::find_if(perf, perf + found, [&](const auto& p) {
      return p.status == CUDNN_STATUS_SUCCESS && p.memory <= s.workspace_limit;
    });
    COHORT_CHECK(best != perf + found,
                 "cuDNN has no backward-data algorithm for " << tensor::shape_string(x));
    d_->bwd_data = best->algo;
    d_->data_ws = best->memory;
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
    COHORT_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        hd, d_->x, xs.raw(), d_->y, ys.raw(), d_->conv, d_->w, ws.raw(), kMax, &found, perf,
        scratch->ptr, s.workspace_limit));
    auto* best = std::find_if(perf, perf + found, [&](const auto& p) {
      return p.status == CUDNN_STATUS_SUCCESS && p.memory <= s.workspace_limit;
    });
    COHORT_CHECK(best != perf + found,
                 "cuDNN has no backward-filter algorithm for " << tensor::shape_string(x));
    d_->bwd_filter = best->algo;
    d_->filter_ws = best->memory;
  }
  workspace_ = std::max({d_->fwd_ws, d_->data_ws, d_->filter_ws});
}

CudnnConv::~CudnnConv() {
  delete d_;
}

namespace {
// The workspace of one call, from the caching allocator (a step asks for the same sizes, so
// after the first these are cache hits), counted as workspace in the memory report.
std::shared_ptr<tensor::Block> workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  return tensor::DeviceAllocator::cuda().allocate(bytes, cuda::Stream::compute().id(),
                                                  tensor::MemoryUse::workspace);
}
void* ptr(const std::shared_ptr<tensor::Block>& b) {
  return b ? b->ptr : nullptr;
}
}  // namespace

void CudnnConv::forward(const Tensor& x, const Tensor& w, Tensor& y) const {
  check_on_device("input", x, x_shape_, s_.type);
  check_on_device("weight", w, w_shape_, s_.type);
  check_on_device("output", y, y_shape_, s_.type);
  const float one = 1, zero = 0;
  auto ws = workspace(d_->fwd_ws);
  COHORT_CUDNN(cudnnConvolutionForward(cudnn_handle(), &one, d_->x, x.raw(), d_->w, w.raw(),
                                       d_->conv, d_->fwd, ptr(ws), d_->fwd_ws, &zero, d_->y,
                                       y.raw()));
}

void CudnnConv::backward_data(const Tensor& dy, const Tensor& w, Tensor& dx) const {
  check_on_device("output gradient", dy, y_shape_, s_.type);
  check_on_device("weight", w, w_shape_, s_.type);
  check_on_device("input gradient", dx, x_shape_, s_.type);
  const float one = 1, zero = 0;
  auto ws = workspace(d_->data_ws);
  COHORT_CUDNN(cudnnConvolutionBackwardData(cudnn_handle(), &one, d_->w, w.raw(), d_->y, dy.raw(),
                                            d_->conv, d_->bwd_data, ptr(ws), d_->data_ws, &zero,
                                            d_->x, dx.raw()));
}

void CudnnConv::backward_filter(const Tensor& x, const Tensor& dy, Tensor& dw,
                                bool accumulate) const {
  check_on_device("input", x, x_shape_, s_.type);
  check_on_device("output gradient", dy, y_shape_, s_.type);
  check_on_device("weight gradient", dw, w_shape_, s_.type);
  const float one = 1, beta = accumulate ? 1.0f : 0.0f;
  auto ws = workspace(d_->filter_ws);
  COHORT_CUDNN(cudnnConvolutionBackwardFilter(cudnn_handle(), &one, d_->x, x.raw(), d_->y, dy.raw(),
                                              d_->conv, d_->bwd_filter, ptr(ws), d_->filter_ws,
                                              &beta, d_->w, dw.raw()));
}

std::string CudnnConv::describe() const {
  std::ostringstream o;
  o << "fwd " << static_cast<int>(d_->fwd) << ", bwd-data " << static_cast<int>(d_->bwd_data)
    << ", bwd-filter " << static_cast<int>(d_->bwd_filter) << "; workspace "
    << env::format_bytes(workspace_);
  return o.str();
}

}  // namespace cohort::nn::gpu
