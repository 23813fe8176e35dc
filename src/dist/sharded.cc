// The sharded engine (see sharded.h): set-up, the residency of zero3's units, the reductions
// as backward finishes units, the step's end, and the accounting.
#include "sharded.h"

#include <cstring>
#include <sstream>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/hash.h"
#include "cohort/tensor/onednn.h"

namespace cohort::dist {

namespace {

// A chunk's grain: 64 bytes, so that every rank's chunk of every unit starts cache-line aligned.
// (Whole pages per chunk cost resnet50's zero1 0.5 MiB more model state than PyTorch's ZeRO-1
// for nothing: the engine gives pages back only where it frees a whole unit.)
constexpr size_t kChunkGrain = 16;

tensor::DType tensor_type(comm::DataType t) {
  return t == comm::DataType::bf16 ? tensor::DType::bf16 : tensor::DType::f16;
}

// dst (f32) = src (bf16/f16), or dst += src when add.
void from_wire(const nn::Tensor& src, float* dst, size_t n, bool add) {
  nn::Tensor out = nn::Tensor::wrap(dst, {static_cast<int64_t>(n)}, tensor::DType::f32);
  if (!add) {
    tensor::onednn::reorder(tensor::onednn::mem(src), tensor::onednn::mem(out));
    return;
  }
  nn::Tensor tmp = nn::Tensor::empty({static_cast<int64_t>(n)});
  tensor::onednn::reorder(tensor::onednn::mem(src), tensor::onednn::mem(tmp));
  tensor::add_(out, tmp);
}

}  // namespace

UnitPool::~UnitPool() {
  for (float* b : all_) std::free(b);
}

float* UnitPool::take() {
  if (free_.empty()) {
    const size_t bytes = (floats_ * sizeof(float) + 4095) & ~size_t{4095};
    auto* b = static_cast<float*>(std::aligned_alloc(4096, bytes));
    COHORT_CHECK(b, "out of memory allocating a unit buffer of " << bytes << " bytes");
    all_.push_back(b);
    free_.push_back(b);
  }
  float* b = free_.back();
  free_.pop_back();
  peak_ = std::max(peak_, ++live_);
  return b;
}

void UnitPool::give(float* b) {
  free_.push_back(b);
  --live_;
}

Sharded::Sharded(nn::Model& m, std::shared_ptr<comm::Communicator> world, const DdpOptions& o)
    : m_(m), world_(std::move(world)), o_(o) {
  COHORT_CHECK(o_.shard != Shard::none, "the sharded engine needs a sharded mode");
  COHORT_CHECK(o_.max_prefetch >= 0, "max prefetch " << o_.max_prefetch);
  if (o_.shard == Shard::hybrid) {
    // Shard inside a host, replicate across hosts: the host's ranks, then the ranks of the same
    // local rank on every host.
    const int host = static_cast<int>(fnv1a64(world_->host()) & 0x3fffffff);
    shard_ = world_->split(host, world_->rank());
    replicas_ = world_->split(world_->local_rank(), world_->rank());
  } else {
    shard_ = world_;
  }
  n_ = shard_->size();
  r_ = shard_->rank();
  if (o_.compression != Compression::none) {
    wire_ = o_.compression == Compression::bf16 ? comm::DataType::bf16 : comm::DataType::f16;
  }

  // Every rank starts from rank 0's parameters; then each unit is padded to N equal chunks.
  broadcast_parameters(m_, *world_);
  dist::broadcast_buffers(m_, *world_);
  m_.align_units(static_cast<size_t>(n_) * kChunkGrain);
  // zero1 on one host keeps the flat values and gradients in memory the ranks map from each
  // other: its reduce-scatters and allgathers then read the peers' units where they lie
  // (`shared`, docs/comm.md). Not zero2/3: they hand gradient pages back to the kernel, which
  // shared memory does not take.
  if (o_.shard == Shard::zero1 && n_ > 1 && shard_->num_hosts() == 1 &&
      o_.compression == Compression::none) {
    shared_values_ = shard_->alloc_shared(m_.flat_values().bytes());
    shared_grads_ = shard_->alloc_shared(m_.flat_grads().bytes());
    m_.place_values(shared_values_.data());
    m_.place_grads(shared_grads_.data());
  }
  tensor::Allocator::cpu().trim();  // the buffers of the old layout, back to the system

  const auto& params = m_.params();
  unit_of_.assign(params.size(), -1);
  size_t shard_elems = 0;
  for (const nn::Unit& u : m_.units()) {
    UnitState s;
    s.begin = u.begin;
    s.len = u.end - u.begin;
    s.chunk = s.len / static_cast<size_t>(n_);
    s.shard_at = shard_elems;
    s.first = u.first;
    s.last = u.last;
    shard_elems += s.chunk;
    for (int i = u.first; i < u.last; ++i)
      unit_of_[static_cast<size_t>(i)] = static_cast<int>(units_.size());
    units_.push_back(s);
  }
  size_t largest = 0;
  for (const UnitState& s : units_) largest = std::max(largest, s.len);
  pool_.resize(largest);
  const int st = stage();
  if (st >= 2) shard_grads_ = nn::Tensor::zeros({static_cast<int64_t>(shard_elems)});
  float* values = m_.flat_values().data<float>();
  float* grads = m_.flat_grads().data<float>();
  if (st == 3) {
    shard_values_ = nn::Tensor::empty({static_cast<int64_t>(shard_elems)});
    for (const UnitState& s : units_) {
      std::memcpy(shard_values_.data<float>() + s.shard_at,
                  values + s.begin + static_cast<size_t>(r_) * s.chunk, s.chunk * sizeof(float));
    }
  }

  // The optimiser's ranges: this rank's chunk of every unit, and the parameters' pieces in it.
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitState& s = units_[u];
    const size_t lo = s.begin + static_cast<size_t>(r_) * s.chunk, hi = lo + s.chunk;
    nn::FlatRange range;
    range.w = st == 3 ? shard_values_.data<float>() + s.shard_at : values + lo;
    range.g = st >= 2 ? shard_grads_.data<float>() + s.shard_at : grads + lo;
    range.n = s.chunk;
    target_.ranges.push_back(range);
    for (int i = s.first; i < s.last; ++i) {
      const nn::Param* p = params[static_cast<size_t>(i)];
      const size_t plo = p->offset, phi = p->offset + static_cast<size_t>(p->value.numel());
      const size_t a = std::max(lo, plo), b = std::min(hi, phi);
      if (a >= b) continue;
      target_.pieces.push_back({i, a - plo, b - plo, u, a - lo, p->decay});
    }
  }
  target_.num_params = static_cast<int>(params.size());
  target_.sum_across = [this](double* v, size_t n) {
    shard_->allreduce(v, v, n, comm::DataType::f64, comm::RedOp::sum).wait();
  };

  // What stays resident: zero2/3 return the full gradient buffer's pages; zero3 the values'.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (st >= 2) tensor::drop_pages(grads + units_[u].begin, units_[u].len * sizeof(float));
    if (st == 3) {
      tensor::drop_pages(values + units_[u].begin, units_[u].len * sizeof(float));
      units_[u].resident = false;
    }
  }
  for (nn::Param* p : params) p->residency = this;
  if (st == 3) issue_gather(0);  // the first forward's first unit
}

Sharded::~Sharded() {
  for (nn::Param* p : m_.params()) p->residency = nullptr;
  // The Params must not view pool buffers once the pools are gone.
  for (size_t u = 0; u < units_.size(); ++u) {
    bind_values(u, nullptr);
    bind_grads(u, nullptr);
  }
  // Nothing may still write into the model's buffers once the engine is gone.
  for (UnitState& s : units_) {
    try {
      if (s.gathering) s.gather.wait();
      if (s.reducing) s.reduce.wait();
      s.across.wait();
    } catch (...) {  // the communicator's failure was reported where it happened
    }
  }
}

int Sharded::stage() const {
  switch (o_.shard) {
    case Shard::zero1:
      return 1;
    case Shard::zero2:
      return 2;
    default:
      return 3;
  }
}

float* Sharded::shard_grad(size_t u) {
  return shard_grads_.data<float>() + units_[u].shard_at;
}

std::string Sharded::describe() const {
  std::ostringstream os;
  os << shard_name(o_.shard) << " over " << n_ << " rank(s)";
  if (replicas_) os << " per host, replicated over " << replicas_->size() << " host(s)";
  os << " (" << world_->describe() << "); " << units_.size() << " units";
  if (stage() == 3) {
    os << ", gathered per unit with " << o_.max_prefetch << " prefetch"
       << (o_.reshard_after_forward ? ", freed after forward" : ", kept from forward to backward");
  }
  os << "; gradients reduced in " << compression_name(o_.compression);
  if (shared_grads_.shared()) os << "; values and gradients in the host's shared memory";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Residency (zero3: gathered when read, freed after use; zero1/2: waited for after the step)

void Sharded::bind_values(size_t u, float* base) {
  UnitState& s = units_[u];
  s.values_in = base;
  nn::Tensor& flat = m_.flat_values();
  for (int i = s.first; i < s.last; ++i) {
    nn::Param* p = m_.params()[static_cast<size_t>(i)];
    p->value = base ? nn::Tensor::wrap(base + (p->offset - s.begin), p->shape, tensor::DType::f32)
                    : nn::Tensor::view_of(flat, p->offset * sizeof(float), p->shape);
  }
}

void Sharded::bind_grads(size_t u, float* base) {
  UnitState& s = units_[u];
  s.grads_in = base;
  nn::Tensor& flat = m_.flat_grads();
  for (int i = s.first; i < s.last; ++i) {
    nn::Param* p = m_.params()[static_cast<size_t>(i)];
    p->grad = base ? nn::Tensor::wrap(base + (p->offset - s.begin), p->shape, tensor::DType::f32)
                   : nn::Tensor::view_of(flat, p->offset * sizeof(float), p->shape);
  }
}

// zero3 gathers a unit into a pool buffer for use (flat: into the flat buffer, to keep);
// zero1/2 gather the chunks back into the flat buffer after the step.
void Sharded::issue_gather(size_t u, bool flat) {
  UnitState& s = units_[u];
  if (s.resident || s.gathering) return;
  float* dst = m_.flat_values().data<float>() + s.begin;
  if (stage() == 3 && !flat) {
    dst = pool_.take();
    bind_values(u, dst);
  }
  const float* src = stage() == 3 ? shard_values_.data<float>() + s.shard_at
                                  : dst + static_cast<size_t>(r_) * s.chunk;
  s.gather = shard_->allgather(src, dst, s.chunk, comm::DataType::f32);
  s.gathering = true;
  traffic_.allgather += static_cast<double>((n_ - 1) * s.chunk * sizeof(float));
  if (stage() == 3) ++in_flight_;
}

void Sharded::wait_gather(size_t u) {
  UnitState& s = units_[u];
  if (!s.gathering) return;
  auto t0 = Clock::now();
  s.gather.wait();
  waited_s_ += seconds_since(t0);
  s.gathering = false;
  s.resident = true;
  if (stage() == 3) --in_flight_;
}

void Sharded::release_values(size_t u) {
  UnitState& s = units_[u];
  if (!s.resident || stage() != 3) return;
  if (s.values_in) {
    pool_.give(s.values_in);
    bind_values(u, nullptr);
  } else {
    tensor::drop_pages(m_.flat_values().data<float>() + s.begin, s.len * sizeof(float));
  }
  s.resident = false;
}

void Sharded::flush_releases(int keep) {
  std::vector<int> left;
  for (int u : to_release_) {
    if (u == keep) {
      left.push_back(u);
    } else {
      release_values(static_cast<size_t>(u));
    }
  }
  to_release_ = std::move(left);
}

void Sharded::need(nn::Param& p) {
  const int u = unit_of_[static_cast<size_t>(p.index)];
  UnitState& s = units_[static_cast<size_t>(u)];
  // The common case, every read after a unit's first: in place, and in backward its gradient
  // buffer bound.
  const bool grads_ready = !backward_phase_ || s.grads_in || !pooled_grads();
  if (u == current_ && s.resident && grads_ready) return;
  // What the layers are done with goes first, so that its buffer serves this unit: reductions
  // that have landed, units backward has finished, and in forward the unit just left (backward
  // gathers it again).
  poll();
  if (stage() == 3) {
    flush_releases(u);
    if (!backward_phase_ && o_.reshard_after_forward && current_ >= 0 && current_ != u) {
      release_values(static_cast<size_t>(current_));
    }
  }
  if (!s.resident) {
    issue_gather(static_cast<size_t>(u));
    wait_gather(static_cast<size_t>(u));
  }
  // Backward is about to write the unit's gradients: into a zeroed pool buffer.
  if (backward_phase_ && communicate_ && pooled_grads() && !s.grads_in) {
    float* g = pool_.take();
    std::memset(g, 0, s.len * sizeof(float));
    bind_grads(static_cast<size_t>(u), g);
  }
  if (stage() == 3) {
    const int next = backward_phase_ ? u - 1 : u + 1;
    if (next >= 0 && next < static_cast<int>(units_.size()) && in_flight_ < o_.max_prefetch) {
      issue_gather(static_cast<size_t>(next));
    }
  }
  current_ = u;
}

// ---------------------------------------------------------------------------------------------
// Gradients

void Sharded::zero_grad() {
  step_memory_.begin();
  traffic_ = Traffic();
  waited_s_ = 0;
  first_reduce_ = true;
  // zero2/3 need not clear the shard: the step's first reduction of each unit lands in it
  // whole (first_reduce_), every unit's reduction going out in every communicating micro-batch.
  if (stage() == 1) m_.zero_grad();
}

void Sharded::backward(nn::Tape& tape, const nn::Var& loss, float loss_scale, bool sync) {
  drain();  // the previous micro-batch's reductions read the gradient buffer
  sync_ = sync;
  communicate_ = sync || (stage() >= 2 && !o_.accumulate_locally);
  launched_.clear();
  completed_ = 0;
  next_launch_ = 0;
  for (UnitState& s : units_) s.pending = s.last - s.first;
  tape.on_grad_ready([this](nn::Param& p) { on_ready(p); });
  backward_phase_ = true;
  current_ = -1;  // so that the first unit backward reads prefetches the one before it
  tape.backward(loss, loss_scale / static_cast<float>(world_->size()));
  backward_phase_ = false;
}

void Sharded::on_ready(nn::Param& p) {
  const size_t u = static_cast<size_t>(unit_of_[static_cast<size_t>(p.index)]);
  UnitState& s = units_[u];
  COHORT_CHECK(s.pending > 0, "parameter " << p.name << " reported ready twice in one step");
  if (stage() >= 2 && !s.grads_live && !s.grads_in) {
    s.grads_live = true;  // in the flat buffer's pages (accumulate_locally)
    live_grads_now_ += s.len * sizeof(float);
    live_grads_peak_ = std::max(live_grads_peak_, live_grads_now_);
  }
  if (--s.pending > 0) return;
  // Backward is done with the unit: its parameters go once the layer reading them is done.
  if (stage() == 3) to_release_.push_back(static_cast<int>(u));
  if (!communicate_) return;
  // Units go out in reverse order on every rank, so that all ranks issue the same sequence.
  while (next_launch_ < units_.size() && units_[units_.size() - 1 - next_launch_].pending == 0) {
    launch(units_.size() - 1 - next_launch_++);
  }
  poll();
}

void Sharded::launch(size_t u) {
  UnitState& s = units_[u];
  if (pooled_grads() && !s.grads_in && !s.grads_live) {  // no layer wrote it: zeros
    float* z = pool_.take();
    std::memset(z, 0, s.len * sizeof(float));
    bind_grads(u, z);
  }
  float* g = s.grads_in ? s.grads_in : m_.flat_grads().data<float>() + s.begin;
  const size_t mine = static_cast<size_t>(r_) * s.chunk;
  const void* send = g;
  void* recv = nullptr;
  size_t esize = sizeof(float);
  if (wire_ != comm::DataType::f32) {
    s.wire = nn::Tensor::empty({static_cast<int64_t>(s.len)}, tensor_type(wire_));
    nn::Tensor flat = nn::Tensor::wrap(g, {static_cast<int64_t>(s.len)}, tensor::DType::f32);
    tensor::onednn::reorder(tensor::onednn::mem(flat), tensor::onednn::mem(s.wire));
    send = s.wire.raw();
    recv = s.wire.data<uint16_t>() + mine;  // in place: the reduced chunk lands in our block
    esize = 2;
    comm_now_ += s.wire.bytes();
  } else if (stage() == 1) {
    recv = g + mine;  // in place
  } else if (first_reduce_) {
    recv = shard_grad(u);
  } else {
    s.staging = nn::Tensor::empty({static_cast<int64_t>(s.chunk)});
    recv = s.staging.raw();
    comm_now_ += s.staging.bytes();
  }
  comm_peak_ = std::max(comm_peak_, comm_now_);
  s.reduce = shard_->reduce_scatter(send, recv, s.chunk, wire_, comm::RedOp::sum);
  s.reducing = true;
  traffic_.reduce_scatter += static_cast<double>((n_ - 1) * s.chunk * esize);
  launched_.push_back(u);
}

void Sharded::complete(size_t u) {
  UnitState& s = units_[u];
  s.reducing = false;
  const size_t mine = static_cast<size_t>(r_) * s.chunk;
  if (s.wire.defined()) {
    nn::Tensor chunk = nn::Tensor::view_of(s.wire, mine * 2, {static_cast<int64_t>(s.chunk)});
    if (stage() == 1) {
      from_wire(chunk, m_.flat_grads().data<float>() + s.begin + mine, s.chunk, false);
    } else {
      from_wire(chunk, shard_grad(u), s.chunk, !first_reduce_);
    }
    comm_now_ -= s.wire.bytes();
    s.wire = nn::Tensor();
  } else if (s.staging.defined()) {
    nn::Tensor dst =
        nn::Tensor::wrap(shard_grad(u), {static_cast<int64_t>(s.chunk)}, tensor::DType::f32);
    tensor::add_(dst, s.staging);
    comm_now_ -= s.staging.bytes();
    s.staging = nn::Tensor();
  }
  if (s.grads_in) {
    pool_.give(s.grads_in);
    bind_grads(u, nullptr);
  }
  if (stage() >= 2 && s.grads_live) release_grads(u);
  if (replicas_ && sync_ && replicas_->size() > 1) {
    float* g = shard_grad(u);
    s.across = replicas_->allreduce(g, g, s.chunk, comm::DataType::f32, comm::RedOp::sum);
    const double h = replicas_->size();
    const double bytes = 2 * (h - 1) / h * static_cast<double>(s.chunk * sizeof(float));
    traffic_.allreduce += bytes;
    traffic_.across_hosts += bytes;
  }
}

void Sharded::release_grads(size_t u) {
  UnitState& s = units_[u];
  tensor::drop_pages(m_.flat_grads().data<float>() + s.begin, s.len * sizeof(float));
  s.grads_live = false;
  live_grads_now_ -= s.len * sizeof(float);
}

void Sharded::poll() {
  while (completed_ < launched_.size() && units_[launched_[completed_]].reduce.test()) {
    units_[launched_[completed_]].reduce.wait();  // rethrows a failure
    complete(launched_[completed_++]);
  }
}

void Sharded::drain() {
  while (completed_ < launched_.size()) {
    units_[launched_[completed_]].reduce.wait();
    complete(launched_[completed_++]);
  }
  if (!launched_.empty()) first_reduce_ = false;
  launched_.clear();
  completed_ = 0;
}

double Sharded::finish() {
  auto t0 = Clock::now();
  if (communicate_) {
    // A unit whose parameters got no gradient in this graph still goes out, in order.
    while (next_launch_ < units_.size()) launch(units_.size() - 1 - next_launch_++);
  }
  drain();
  for (UnitState& s : units_) s.across.wait();
  flush_releases(-1);
  current_ = -1;
  step_memory_.end();
  return waited_s_ + seconds_since(t0);
}

void Sharded::after_step() {
  if (stage() == 3) {
    for (size_t u = 0; u < units_.size(); ++u) {
      wait_gather(u);
      release_values(u);
    }
    current_ = -1;
    issue_gather(0);  // overlaps whatever comes before the next forward
    return;
  }
  // zero1/2: every rank's updated chunk to every rank; forward waits per unit.
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].resident = false;
    issue_gather(u);
  }
}

void Sharded::gather_parameters() {
  for (size_t u = 0; u < units_.size(); ++u) {
    wait_gather(u);
    if (units_[u].values_in) release_values(u);  // kept in the flat buffer instead
    issue_gather(u, true);
    wait_gather(u);
  }
  current_ = -1;
}

void Sharded::broadcast_buffers() {
  dist::broadcast_buffers(m_, *world_);
}

MemoryReport Sharded::held() const {
  MemoryReport r;
  r.mode = o_.shard;
  r.ranks = n_;
  r.psi = m_.num_parameters();
  const size_t flat = static_cast<size_t>(m_.flat_values().numel()) * sizeof(float);
  r.parameters = stage() == 3 ? shard_values_.bytes() : flat;
  r.gradients = stage() == 1 ? flat : shard_grads_.bytes();
  // The pool serves gathered units and in-flight gradients alike: its peak is reported as the
  // gathered working set (zero3), or as gradients in flight (zero2).
  if (stage() == 3) {
    r.gathered = pool_.peak_bytes();
    r.gradients_in_flight = live_grads_peak_;
  } else {
    r.gradients_in_flight = std::max(live_grads_peak_, pool_.peak_bytes());
  }
  size_t largest = 0;
  for (const UnitState& s : units_) largest = std::max(largest, s.len);
  // Ours (wire and staging) and the ring reduce-scatter's scratch, which holds one unit.
  r.comm_buffers = comm_peak_ + largest * (wire_ == comm::DataType::f32 ? 4 : 2);
  return r;
}

}  // namespace cohort::dist
