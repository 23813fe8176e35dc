#include "cohort/nn/autograd.h"

namespace cohort::nn {

namespace {
thread_local Tape* g_tape = nullptr;
thread_local timeline::Scope g_scope;
bool g_timeline = false;
int g_steps = 0;
std::vector<timeline::OpTime>& ops_timeline() {
  static std::vector<timeline::OpTime> t;
  return t;
}
timeline::OpTime& timeline_entry(size_t k) {
  auto& t = ops_timeline();
  if (t.size() <= k) t.resize(k + 1);
  return t[k];
}
}  // namespace

namespace timeline {
void enable(bool on) {
  g_timeline = on;
}
void reset() {
  ops_timeline().clear();
  g_steps = 0;
}
bool enabled() {
  return g_timeline;
}
std::vector<OpTime> entries() {
  return ops_timeline();
}
int steps() {
  return g_steps;
}
Scope open_scope(const char* kind) {
  Scope outer = g_scope;
  g_scope = {kind, -1};
  return outer;
}
long close_scope(const Scope& outer) {
  const long inside = g_scope.recorded;
  g_scope = outer;
  return inside;
}
void add_forward(long op, double seconds) {
  if (g_timeline && op >= 0) timeline_entry(static_cast<size_t>(op)).forward += seconds;
}
}  // namespace timeline

Var constant(Tensor t) {
  auto n = std::make_shared<Node>();
  n->value = std::move(t);
  return n;
}

Tape::Recording::Recording(Tape& t) : prev_(g_tape) {
  g_tape = &t;
}
Tape::Recording::~Recording() {
  g_tape = prev_;
}

Tape* Tape::current() {
  return g_tape;
}

NoGrad::NoGrad() : prev_(g_tape) {
  g_tape = nullptr;
}
NoGrad::~NoGrad() {
  g_tape = prev_;
}

bool recording(const Var& x) {
  return g_tape != nullptr && x->requires_grad;
}

void Tape::push(const Var& out, std::function<void()> backward) {
  out->requires_grad = true;
  if (g_timeline) {
    timeline::OpTime& e = timeline_entry(ops_.size());
    if (e.kind.empty() && g_scope.kind) e.kind = g_scope.kind;
    g_scope.recorded = static_cast<long>(ops_.size());
  }
  ops_.push_back({out, std::move(backward)});
}

void Tape::use(Param& p) {
  if (track_ && p.pending++ == 0) used_.push_back(&p);
}

void Tape::param_done(Param& p) {
  if (!track_) return;
  COHORT_CHECK(p.pending > 0, "parameter " << p.name << " back-propagated more often than used");
  if (--p.pending == 0) {
    for (auto& h : hooks_) h(p);
  }
}

void Tape::backward(const Var& loss, float seed) {
  COHORT_CHECK(loss->value.numel() == 1,
               "backward needs a scalar loss, got " << tensor::shape_string(loss->value.shape()));
  COHORT_CHECK(!ops_.empty() && loss->requires_grad,
               "backward: nothing was recorded for this loss (was the forward run under a "
               "recording tape, and does the loss depend on parameters?)");
  Tensor g = Tensor::full(loss->value.shape(), seed);
  accumulate(*loss, g);
  run_backward();
}

void Tape::backward_from(const Var& out, Tensor grad) {
  COHORT_CHECK(grad.shape() == out->value.shape(), "backward_from: the gradient's shape "
                                                       << tensor::shape_string(grad.shape())
                                                       << " is not the output's "
                                                       << tensor::shape_string(out->value.shape()));
  COHORT_CHECK(!ops_.empty() && out->requires_grad,
               "backward_from: nothing was recorded for this output");
  accumulate(*out, std::move(grad));
  run_backward();
}

void Tape::run_backward() {
  const bool timed = g_timeline;
  for (size_t i = ops_.size(); i-- > 0;) {
    Op op = std::move(ops_[i]);
    ops_.pop_back();
    const auto t0 = timed ? Clock::now() : Clock::time_point{};
    if (op.out->grad.defined()) op.backward();
    op.out->grad = Tensor();
    if (timed)
      timeline_entry(i).backward += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (timed) ++g_steps;
  for (Param* p : used_) {
    if (p->pending > 0) {
      p->pending = 1;
      param_done(*p);
    }
  }
  clear();
}

void Tape::clear() {
  ops_.clear();
  for (Param* p : used_) p->pending = 0;
  used_.clear();
}

void accumulate(Node& n, Tensor g) {
  if (!n.grad.defined()) {
    n.grad = std::move(g);
    return;
  }
  if (n.grad.block().use_count() > 1) {
    // Shared with another node (the two inputs of a sum): add out of place, in one pass, or
    // into g when g is ours alone.
    if (g.block().use_count() == 1 && g.strides() == n.grad.strides()) {
      tensor::add_(g, n.grad);
      n.grad = std::move(g);
      return;
    }
    Tensor sum = Tensor::empty(n.grad.shape(), n.grad.dtype(), n.grad.order());
    tensor::add_into(sum, n.grad, g);
    n.grad = std::move(sum);
    return;
  }
  tensor::add_(n.grad, g);
}

}  // namespace cohort::nn
