#include "cohort/tensor/onednn.h"

#include <map>
#include <mutex>
#include <tuple>

namespace cohort::tensor::onednn {

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

memory::data_type dt(DType t) {
  switch (t) {
    case DType::f32:
      return memory::data_type::f32;
    case DType::bf16:
      return memory::data_type::bf16;
    case DType::f16:
      return memory::data_type::f16;
    case DType::u8:
      return memory::data_type::u8;
    case DType::i64:
      break;
  }
  COHORT_THROW("oneDNN has no " << dtype_name(t) << " data type");
}

memory::dims dims(const Shape& s) {
  return memory::dims(s.begin(), s.end());
}

memory::desc desc(const Tensor& t) {
  return memory::desc(dims(t.shape()), dt(t.dtype()), dims(t.strides()));
}

memory mem(const Tensor& t) {
  return memory(desc(t), engine(), t.raw());
}

Tensor empty_like(const memory::desc& d) {
  const size_t bytes = d.get_size();
  const size_t floats = (bytes + 3) / 4;
  return Tensor::empty({static_cast<int64_t>(floats)}, DType::f32);
}

memory mem(const Tensor& t, const memory::desc& d) {
  return memory(d, engine(), t.raw());
}

void reorder(const memory& src, const memory& dst, bool accumulate) {
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  auto pd = COHORT_DNNL(dnnl::reorder::primitive_desc(src, dst, attr), "reorder");
  dnnl::reorder(pd).execute(stream(), {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
}

}  // namespace cohort::tensor::onednn

namespace cohort::tensor {

using dnnl::memory;

// Primitives are cached per shape and transposition: creating one costs far more than a
// small product, and a training step repeats the same few shapes.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float beta) {
  COHORT_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "matmul needs 2-d tensors");
  COHORT_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(),
               "matmul needs contiguous tensors");
  COHORT_CHECK(a.dtype() == b.dtype() && c.dtype() == DType::f32,
               "matmul: " << dtype_name(a.dtype()) << " x " << dtype_name(b.dtype()) << " -> "
                          << dtype_name(c.dtype()) << " (inputs of one type, f32 out)");
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  COHORT_CHECK(k == kb && c.size(0) == m && c.size(1) == n,
               "matmul shapes " << shape_string(a.shape()) << (trans_a ? "^T" : "") << " x "
                                << shape_string(b.shape()) << (trans_b ? "^T" : "") << " -> "
                                << shape_string(c.shape()));
  using key_t = std::tuple<int64_t, int64_t, int64_t, bool, bool, float, int>;
  static std::mutex mu;
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
  };
  static std::map<key_t, Entry> cache;
  const key_t key{m, n, k, trans_a, trans_b, beta, static_cast<int>(a.dtype())};
  Entry e;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) {
      const auto in_t = onednn::dt(a.dtype());
      memory::desc ad({m, k}, in_t, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
      memory::desc bd({k, n}, in_t, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
      memory::desc cd({m, n}, memory::data_type::f32, memory::dims{n, 1});
      dnnl::primitive_attr attr;
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
      }
      auto pd = COHORT_DNNL(
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, onednn::engine()),
          "matmul " << m << "x" << k << " by " << k << "x" << n);
      it = cache.emplace(key, Entry{pd, dnnl::matmul(pd)}).first;
    }
    e = it->second;
  }
  const auto& pd = e.pd;
  memory am(pd.src_desc(), onednn::engine(), a.raw());
  memory bm(pd.weights_desc(), onednn::engine(), b.raw());
  memory cm(pd.dst_desc(), onednn::engine(), c.raw());
  e.prim.execute(onednn::stream(),
                 {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
}

}  // namespace cohort::tensor
