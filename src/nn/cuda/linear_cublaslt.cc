// cuBLASLt Linear (see linear_cublaslt.h). cuBLASLt is column-major: a row-major [r, c] matrix
// is its column-major [c, r], so each product below is written on the transposes:
//   forward        y^T [out, N]  = op_T(W as [in, out]) * (x as [in, N]),  bias per row of D
//   backward-data  dx^T [in, N]  = (W as [in, out])     * (dy as [out, N])
//   backward-filt  dW^T [in, out] = (x as [in, N])      * op_T(dy as [out, N]), BGRADB: the sums
//                                   of B's columns over k = N, one per column of D (out)
#include "linear_cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <mutex>

#include "cohort/core/cuda.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/tensor/device_allocator.h"

namespace cohort::nn::gpu {

using tensor::DType;
using tensor::Tensor;

namespace {

#define COHORT_CUBLAS(call)                                               \
  do {                                                                    \
    const cublasStatus_t st_ = (call);                                    \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                   \
      COHORT_THROW(#call << " failed: " << cublasLtGetStatusString(st_)); \
    }                                                                     \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      COHORT_THROW("cuBLASLt Linear takes f32, bf16 or f16, not " << tensor::dtype_name(t));
  }
}

cublasLtHandle_t lt_handle() {
  static std::once_flag once;
  static cublasLtHandle_t h = nullptr;
  std::call_once(once, [] { COHORT_CUBLAS(cublasLtCreate(&h)); });
  return h;
}

}  // namespace

// One product D [m, n] = op(A) op(B), column-major, with its descriptors and chosen algorithm.
struct LtProduct {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;

  LtProduct(const char* what, cublasOperation_t ta, cublasOperation_t tb, uint64_t m, uint64_t n,
            uint64_t k, uint64_t lda, uint64_t ldb, uint64_t ldd, cublasLtEpilogue_t ep,
            const LinearSettings& s) {
    epilogue = ep;
    const cudaDataType_t t = cuda_type(s.type);
    const cublasComputeType_t compute =
        s.type == DType::f32 && s.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    COHORT_CUBLAS(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    COHORT_CUBLAS(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    COHORT_CUBLAS(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    COHORT_CUBLAS(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    COHORT_CUBLAS(cublasLtMatrixLayoutCreate(&a, t, ta == CUBLAS_OP_N ? m : k,
                                             ta == CUBLAS_OP_N ? k : m, lda));
    COHORT_CUBLAS(cublasLtMatrixLayoutCreate(&b, t, tb == CUBLAS_OP_N ? k : n,
                                             tb == CUBLAS_OP_N ? n : k, ldb));
    COHORT_CUBLAS(cublasLtMatrixLayoutCreate(&d, t, m, n, ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    COHORT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    COHORT_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &s.workspace_limit, sizeof(s.workspace_limit)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc, a, b, d, d, pref, 1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    COHORT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                 "cuBLASLt has no algorithm for the Linear "
                     << what << " (m " << m << ", n " << n << ", k " << k << ", "
                     << tensor::dtype_name(s.type) << "): " << cublasLtGetStatusString(st));
    algo = r.algo;
    workspace = r.workspaceSize;
  }
  ~LtProduct() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;

  void run(const void* pa, const void* pb, void* pd, void* bias, float beta) const {
    if (bias) {
      COHORT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));
    }
    const cuda::Stream s = cuda::Stream::compute();
    std::shared_ptr<tensor::Block> ws;
    if (workspace > 0) {
      ws =
          tensor::DeviceAllocator::cuda().allocate(workspace, s.id(), tensor::MemoryUse::workspace);
    }
    const float one = 1;
    COHORT_CUBLAS(cublasLtMatmul(lt_handle(), desc, &one, pa, a, pb, b, &beta, pd, d, pd, d, &algo,
                                 ws ? ws->ptr : nullptr, workspace,
                                 static_cast<cudaStream_t>(s.handle())));
  }
};

namespace {

void check(const char* what, const Tensor& t, const tensor::Shape& shape, DType type) {
  COHORT_CHECK(t.device() == tensor::Device::cuda,
               "cuBLASLt Linear: the " << what << " is on " << tensor::device_string(t.device()));
  COHORT_CHECK(t.shape() == shape && t.dtype() == type && t.is_contiguous(),
               "cuBLASLt Linear: the " << what << " is " << tensor::shape_string(t.shape()) << " "
                                       << tensor::dtype_name(t.dtype()) << ", planned a dense "
                                       << tensor::shape_string(shape) << " "
                                       << tensor::dtype_name(type));
}

}  // namespace

struct CublasLtLinear::Plans {
  std::unique_ptr<LtProduct> forward, data, filter;
};

CublasLtLinear::CublasLtLinear(int64_t batch, int in, int out, bool bias, const LinearSettings& s)
    : p_(new Plans()), n_(batch), in_(in), out_(out), bias_(bias), s_(s) {
  const uint64_t N = static_cast<uint64_t>(batch), I = in, O = out;
  p_->forward =
      std::make_unique<LtProduct>("forward", CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, I, I, O,
                                  bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, s);
  p_->data = std::make_unique<LtProduct>("backward-data", CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, I, O,
                                         I, CUBLASLT_EPILOGUE_DEFAULT, s);
  p_->filter =
      std::make_unique<LtProduct>("backward-filter", CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, I, O, I,
                                  bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT, s);
}

CublasLtLinear::~CublasLtLinear() {
  delete p_;
}

void CublasLtLinear::forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) const {
  check("input", x, {n_, in_}, s_.type);
  check("weight", w, {out_, in_}, s_.type);
  check("output", y, {n_, out_}, s_.type);
  COHORT_CHECK((b != nullptr) == bias_,
               "cuBLASLt Linear: planned " << (bias_ ? "with" : "without") << " a bias");
  if (b) check("bias", *b, {out_}, s_.type);
  p_->forward->run(w.raw(), x.raw(), y.raw(), b ? b->raw() : nullptr, 0.0f);
}

void CublasLtLinear::backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                              Tensor& dw, Tensor* db) const {
  check("input", x, {n_, in_}, s_.type);
  check("weight", w, {out_, in_}, s_.type);
  check("output gradient", dy, {n_, out_}, s_.type);
  check("weight gradient", dw, {out_, in_}, s_.type);
  COHORT_CHECK((db != nullptr) == bias_,
               "cuBLASLt Linear: planned " << (bias_ ? "with" : "without") << " a bias");
  if (db) check("bias gradient", *db, {out_}, s_.type);
  if (dx) {
    check("input gradient", *dx, {n_, in_}, s_.type);
    p_->data->run(w.raw(), dy.raw(), dx->raw(), nullptr, 0.0f);
  }
  p_->filter->run(x.raw(), dy.raw(), dw.raw(), db ? db->raw() : nullptr, 0.0f);
}

}  // namespace cohort::nn::gpu
