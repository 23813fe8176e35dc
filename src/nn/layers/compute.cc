// The compute type of convolutions and matmuls (f32, or bf16/f16 where oneDNN runs them on this
// CPU), and the per-op profile (cohort bench train --profile).
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

void set_compute_type(DType t) {
  COHORT_CHECK(compute_type_supported(t),
               tensor::dtype_name(t) << " convolutions are not available in oneDNN on this CPU");
  g_compute = t;
}

DType compute_type() {
  return g_compute;
}

bool compute_type_supported(DType t) {
  if (t == DType::f32) return true;
  if (t != DType::bf16 && t != DType::f16) return false;
  // Ask oneDNN for a small training convolution in that type.
  try {
    const auto dt = dn::dt(t);
    memory::desc src({2, 16, 8, 8}, dt, memory::format_tag::nhwc);
    memory::desc dst({2, 16, 8, 8}, kF32, memory::format_tag::nhwc);
    memory::desc wei({16, 16, 3, 3}, dt, memory::format_tag::any);
    auto d = dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                             dnnl::algorithm::convolution_direct, src, wei, dst,
                                             {1, 1}, {1, 1}, {1, 1});
    dnnl::convolution_forward::primitive_desc pd(d, dn::engine());
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Profile

namespace profile {
namespace {
bool g_on = false;
std::mutex g_mu;
std::map<const char*, Entry>& table() {
  static std::map<const char*, Entry> t;
  return t;
}
}  // namespace

void enable(bool on) {
  g_on = on;
}
bool enabled() {
  return g_on;
}
void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  table().clear();
}
std::vector<Entry> entries() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Entry> out;
  // Equal literals in different files may have different addresses: merge by name.
  std::map<std::string, Entry> by_name;
  for (auto& [k, e] : table()) {
    Entry& m = by_name[e.op];
    m.op = e.op;
    m.seconds += e.seconds;
    m.calls += e.calls;
  }
  for (auto& [k, e] : by_name) out.push_back(e);
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}
Scope::Scope(const char* op) : op_(op), on_(g_on), outer_(timeline::open_scope(op)) {
  if (on_ || timeline::enabled()) t0_ = Clock::now();
}
Scope::~Scope() {
  const long recorded = timeline::close_scope(outer_);
  if (!on_ && !timeline::enabled()) return;
  const double dt = seconds_since(t0_);
  timeline::add_forward(recorded, dt);
  if (!on_) return;
  std::lock_guard<std::mutex> lock(g_mu);
  Entry& e = table()[op_];
  e.op = op_;
  e.seconds += dt;
  e.calls++;
}
}  // namespace profile

}  // namespace cohort::nn
