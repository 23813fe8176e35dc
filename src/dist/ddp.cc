#include "cohort/dist/ddp.h"

#include <sstream>

#include "cohort/comm/types.h"
#include "cohort/core/clock.h"
#include "cohort/nn/layers.h"
#include "cohort/tensor/onednn.h"

namespace cohort::dist {

Ddp::Ddp(nn::Model& m, std::shared_ptr<comm::Communicator> c, DdpOptions o)
    : m_(m), comm_(std::move(c)), o_(std::move(o)), target_(nn::whole_model(m)) {
  COHORT_CHECK(o_.first_bucket_mb > 0 && o_.bucket_mb > 0,
               "bucket sizes " << o_.first_bucket_mb << " and " << o_.bucket_mb << " MB");
  const auto& params = m_.params();
  bucket_of_.assign(params.size(), -1);
  const double first_cap = o_.first_bucket_mb * (1 << 20);
  // The parameters registered first finish last in backward, and whatever bucket holds them
  // goes out when nothing is left to overlap it with: like the first bucket, it is kept small.
  size_t tail_end = 0, tail_bytes = 0;  // parameters [0, tail_end) form the last bucket
  while (tail_end < params.size() && static_cast<double>(tail_bytes) < first_cap) {
    tail_bytes += static_cast<size_t>(params[tail_end++]->value.numel()) * sizeof(float);
  }
  if (tail_end == params.size()) tail_end = 0;  // a small model: the ordinary split below
  auto range_of = [&](Bucket& b, size_t i) {
    const nn::Param* p = params[i];
    const size_t n = static_cast<size_t>(p->value.numel());
    if (b.params.empty()) b.end = p->offset + nn::flat_slot(n);
    b.begin = p->offset;
    b.params.push_back(static_cast<int>(i));
    bucket_of_[i] = static_cast<int>(buckets_.size());
    return n * sizeof(float);
  };
  // Reverse registration order; a bucket closes once it holds at least its cap.
  Bucket cur;
  double cap = first_cap;
  size_t bytes = 0;
  for (size_t i = params.size(); i-- > tail_end;) {
    bytes += range_of(cur, i);
    if (static_cast<double>(bytes) >= cap || i == tail_end) {
      buckets_.push_back(cur);
      cur = Bucket();
      bytes = 0;
      cap = o_.bucket_mb * (1 << 20);
    }
  }
  for (size_t i = tail_end; i-- > 0;) range_of(cur, i);
  if (!cur.params.empty()) buckets_.push_back(cur);
  // On one host, the gradients live in memory every rank maps (alloc_shared): the buckets'
  // allreduce then reads and writes the peers' gradients where they lie instead of copying
  // them through rings (docs/comm.md). Collective, as constructing Ddp is.
  if (comm_->size() > 1 && comm_->num_hosts() == 1 && o_.compression == Compression::none) {
    grads_ = comm_->alloc_shared(m_.flat_grads().bytes());
    m_.place_grads(grads_.data());
    target_ = nn::whole_model(m_);  // the optimizer reads the gradients where they now lie
  }
  if (o_.compression != Compression::none) {
    const bool bf = o_.compression == Compression::bf16;
    wire_ = bf ? comm::DataType::bf16 : comm::DataType::f16;
    for (Bucket& b : buckets_) {
      b.wire = nn::Tensor::empty({static_cast<int64_t>(b.end - b.begin)},
                                 bf ? tensor::DType::bf16 : tensor::DType::f16);
    }
  }
}

void broadcast_parameters(nn::Model& m, comm::Communicator& c, int root) {
  nn::Tensor& v = m.flat_values();
  c.broadcast(v.raw(), v.raw(), static_cast<size_t>(v.numel()), comm::DataType::f32, root).wait();
}

void broadcast_buffers(nn::Model& m, comm::Communicator& c, int root) {
  for (nn::Buffer* b : m.buffers()) {
    const comm::DataType t =
        b->value.dtype() == tensor::DType::i64 ? comm::DataType::i64 : comm::DataType::f32;
    c.broadcast(b->value.raw(), b->value.raw(), static_cast<size_t>(b->value.numel()), t, root)
        .wait();
  }
}

std::string Ddp::describe() const {
  std::ostringstream os;
  os << "DDP over " << comm_->describe() << "; " << buckets_.size() << " buckets (first "
     << o_.first_bucket_mb << " MiB, then " << o_.bucket_mb << " MiB), reduced in "
     << compression_name(o_.compression);
  if (grads_.shared()) os << "; gradients in the host's shared memory";
  return os.str();
}

void Ddp::zero_grad() {
  step_memory_.begin();
  m_.zero_grad();
}

MemoryReport Ddp::held() const {
  MemoryReport r;
  r.ranks = comm_->size();
  r.psi = m_.num_parameters();
  const size_t flat = static_cast<size_t>(m_.flat_values().numel()) * sizeof(float);
  r.parameters = flat;
  r.gradients = flat;
  size_t wire = 0, largest = 0;
  for (const Bucket& b : buckets_) {
    if (b.wire.defined()) wire += b.wire.bytes();
    largest = std::max(largest, (b.end - b.begin) * sizeof(float));
  }
  r.comm_buffers = wire + largest;  // the ring's scratch holds one bucket
  return r;
}

Traffic Ddp::traffic() const {
  Traffic t;
  if (!synced_) return t;
  const double n = comm_->size();
  const double esize = o_.compression == Compression::none ? 4 : 2;
  for (const Bucket& b : buckets_) {
    t.allreduce += 2 * (n - 1) / n * static_cast<double>(b.end - b.begin) * esize;
  }
  return t;
}

void Ddp::broadcast_from_rank0() {
  broadcast_parameters(m_, *comm_);
  dist::broadcast_buffers(m_, *comm_);
}

void Ddp::broadcast_buffers() {
  dist::broadcast_buffers(m_, *comm_);
}

double Ddp::since_prepare() const {
  return static_cast<double>(now_us() - prepared_at_us_) / 1e6;
}

void Ddp::backward(nn::Tape& tape, const nn::Var& loss, float loss_scale, bool sync) {
  prepare(tape, sync);
  tape.backward(loss, loss_scale / static_cast<float>(comm_->size()));
}

void Ddp::prepare(nn::Tape& tape, bool sync) {
  sync_ = sync;
  next_launch_ = 0;
  prepared_at_us_ = now_us();
  backward_end_s_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.work = comm::Work();
    b.launched_at = 0;
  }
  if (sync) tape.on_grad_ready([this](nn::Param& p) { on_ready(p); });
}

void Ddp::on_ready(nn::Param& p) {
  Bucket& b = buckets_[static_cast<size_t>(bucket_of_[static_cast<size_t>(p.index)])];
  COHORT_CHECK(b.pending > 0, "parameter " << p.name << " reported ready twice in one step");
  --b.pending;
  // Buckets go out in index order on every rank, so that all ranks issue the same sequence.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_++]);
  }
}

void Ddp::launch(Bucket& b) {
  float* g = m_.flat_grads().data<float>() + b.begin;
  const size_t n = b.end - b.begin;
  b.launched_at = since_prepare();
  if (wire_ == comm::DataType::f32) {
    b.work = comm_->allreduce(g, g, n, wire_, comm::RedOp::sum);
    return;
  }
  uint16_t* w = b.wire.data<uint16_t>();
  nn::Tensor flat = nn::Tensor::wrap(g, {static_cast<int64_t>(n)}, tensor::DType::f32);
  tensor::onednn::reorder(tensor::onednn::mem(flat), tensor::onednn::mem(b.wire));  // vectorised
  b.work = comm_->allreduce(w, w, n, wire_, comm::RedOp::sum);
}

double Ddp::finish() {
  backward_end_s_ = since_prepare();
  synced_ = sync_;
  if (!sync_) {
    step_memory_.end();
    return 0;
  }
  auto t0 = Clock::now();
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  for (Bucket& b : buckets_) {
    b.work.wait();
    if (wire_ != comm::DataType::f32) {
      nn::Tensor flat =
          nn::Tensor::wrap(m_.flat_grads().data<float>() + b.begin,
                           {static_cast<int64_t>(b.end - b.begin)}, tensor::DType::f32);
      tensor::onednn::reorder(tensor::onednn::mem(b.wire), tensor::onednn::mem(flat));
    }
  }
  step_memory_.end();
  return seconds_since(t0);
}

void sync_batch_norm(nn::Model& m, const std::shared_ptr<comm::Communicator>& c) {
  std::shared_ptr<comm::Communicator> own = c->split(0, c->rank());
  std::vector<std::pair<std::string, nn::Module*>> mods;
  m.root().modules("", &mods);
  for (auto& [name, mod] : mods) {
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(mod)) {
      bn->set_cross_rank_sum([own](double* v, size_t n) {
        own->allreduce(v, v, n, comm::DataType::f64, comm::RedOp::sum).wait();
      });
    }
  }
}

}  // namespace cohort::dist
