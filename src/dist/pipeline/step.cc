// A pipeline stage's step (see pipeline.h), which reads top to bottom: zero, the schedule's
// actions (receive, compute, send), the replicas' allreduce, the mean loss to every stage.
#include "internal.h"

namespace cohort::dist {

using nn::Tensor;
using nn::Var;
using pipeline_impl::stage_pieces;
using tensor::Shape;

void Pipeline::run_forward(int i, const Tensor& x, const LossFn& loss) {
  Micro& mb = *micro_[static_cast<size_t>(i)];
  if (first()) {
    const int64_t n = in_shape_[0];
    mb.input = nn::constant(x.narrow0(i * n, (i + 1) * n));
  } else {
    auto t0 = Clock::now();
    mb.received = act_in_->take();
    stats_.idle_s += seconds_since(t0);
    mb.input = nn::constant(mb.received);
    mb.input->requires_grad = true;
  }
  auto t0 = Clock::now();
  const auto& pieces = m_.pieces();
  auto run = [&]() {
    Var h = mb.input;
    for (int p = first_piece_; p < last_piece_; ++p) {
      // zero3's first forward of the step: each piece waits for its own units' gathers only,
      // so that the later units arrive while the first ones compute.
      if (gathering_) {
        const auto t_wait = Clock::now();
        wait_gather(piece_end_[static_cast<size_t>(p - first_piece_)]);
        t0 += Clock::now() - t_wait;  // not compute
      }
      h = pieces[static_cast<size_t>(p)].forward(h);
    }
    return h;
  };
  if (o_.recompute) {
    nn::NoGrad off;  // only the input is kept; backward runs the forward again
    mb.output = run();
    if (last()) mb.loss = loss(mb.output, i);
  } else {
    nn::Tape::Recording rec(mb.tape);
    mb.output = run();
    if (last()) mb.loss = loss(mb.output, i);
  }
  if (last()) loss_sum_ += mb.loss->value.data<float>()[0];
  stats_.compute_s += seconds_since(t0);
  if (!last()) {
    act_out_->send(mb.output->value);
    if (o_.recompute) mb.output.reset();
  }
}

void Pipeline::run_backward(int i, const LossFn& loss, float seed) {
  Micro& mb = *micro_[static_cast<size_t>(i)];
  if (gathering_) wait_gather();  // (forward waited for every unit with parameters already)
  Tensor grad;
  if (!last()) {
    auto t0 = Clock::now();
    grad = grad_in_->take();
    stats_.idle_s += seconds_since(t0);
  }
  auto t0 = Clock::now();
  if (o_.recompute) {
    nn::FrozenBatchNormStatistics frozen;  // counted in the first forward
    nn::Tape::Recording rec(mb.tape);
    Var h = mb.input;
    for (int p = first_piece_; p < last_piece_; ++p)
      h = m_.pieces()[static_cast<size_t>(p)].forward(h);
    mb.output = h;
    if (last()) mb.loss = loss(mb.output, i);
  }
  if (last()) {
    mb.tape.backward(mb.loss, seed);
  } else {
    mb.tape.backward_from(mb.output, grad);
  }
  stats_.compute_s += seconds_since(t0);
  if (!last()) grad_in_->give_back(std::move(grad));
  if (!first()) {
    COHORT_CHECK(mb.input->grad.defined(),
                 "pipeline: stage " << stage_ << " got no gradient for its input");
    grad_out_->send(mb.input->grad);
    mb.input.reset();
    act_in_->give_back(std::move(mb.received));
  }
  mb.input.reset();
  mb.output.reset();
  mb.loss.reset();
}

void Pipeline::start_gather() {
  float* v = m_.flat_values().data<float>();
  for (const ShardUnit& u : units_) {  // in forward order
    gathers_.push_back(shard_comm_->allgather(shard_values_.data<float>() + u.at, v + u.begin,
                                              u.chunk, comm::DataType::f32));
  }
  waited_ = 0;
  gathering_ = true;
}

void Pipeline::wait_gather(size_t through) {
  auto t0 = Clock::now();
  while (waited_ < units_.size() && units_[waited_].begin < through) gathers_[waited_++].wait();
  if (waited_ == units_.size()) {
    gathers_.clear();
    gathering_ = false;
    gathered_ = true;
  }
  stats_.gather_s += seconds_since(t0);
}

void Pipeline::after_step() {
  if (!sharded()) return;
  if (shards_parameters()) {
    // The flat values (gathered for evaluation, say) are older than the chunk now.
    if (gathered_)
      tensor::drop_pages(m_.flat_values().data<float>() + begin_, (end_ - begin_) * sizeof(float));
    gathered_ = false;
    return;
  }
  // Every replica's updated chunks to every replica, in place.
  float* v = m_.flat_values().data<float>();
  std::vector<comm::Work> works;
  for (const ShardUnit& u : units_) {
    float* unit = v + u.begin;
    works.push_back(
        shard_comm_->allgather(unit + own_ * u.chunk, unit, u.chunk, comm::DataType::f32));
  }
  for (comm::Work& w : works) w.wait();
}

void Pipeline::zero_grad() {
  if (grads_zero_) return;
  float* g = m_.flat_grads().data<float>();
  std::fill(g + begin_, g + end_, 0.0f);
  grads_zero_ = true;
}

float Pipeline::run(const Tensor& x, const LossFn& loss, float loss_scale) {
  const int M = o_.micro_batches;
  if (first()) {
    Shape want = in_shape_;
    want[0] = x.size(0);
    COHORT_CHECK(x.shape() == want, "pipeline: the mini-batch "
                                        << tensor::shape_string(x.shape()) << " is not " << M
                                        << " micro-batches of " << tensor::shape_string(in_shape_));
  }
  StepMemory mem;
  mem.begin();
  loss_sum_ = 0;
  grads_zero_ = false;
  if (!gathered_ && !gathering_) start_gather();
  const float seed = loss_scale / static_cast<float>(M * replicas_);
  if (act_in_) act_in_->start(M);
  if (grad_in_) grad_in_->start(M);
  auto t_step = Clock::now();
  int held = 0;
  const size_t base = tensor::Allocator::cpu().stats().in_use;
  for (const Action& a : actions_) {
    if (a.forward) {
      run_forward(a.micro, x, loss);
      stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++held);
      const size_t now = tensor::Allocator::cpu().stats().in_use;
      stats_.peak_activations = std::max(stats_.peak_activations, now > base ? now - base : 0);
    } else {
      run_backward(a.micro, loss, seed);
      --held;
    }
  }
  stats_.step_s += seconds_since(t_step);
  auto t_send = Clock::now();
  if (act_out_) act_out_->drain();
  if (grad_out_) grad_out_->drain();
  stats_.send_s += seconds_since(t_send);
  mem.end();
  stats_.peak_step = std::max(stats_.peak_step, mem.peak());
  ++stats_.steps;
  float mean = loss_sum_ / static_cast<float>(M);
  pipe_->broadcast(&mean, &mean, 1, comm::DataType::f32, o_.stages - 1).wait();
  return mean;
}

double Pipeline::finish() {
  if (gathering_) wait_gather();  // (a step without a run)
  if (o_.deferred_batch_norm) nn::commit_batch_norm_statistics(m_.root());
  // The replicas' average of this stage's gradients, in pieces of 25 MB; sharded, each
  // replica's chunk of their sum.
  float* g = m_.flat_grads().data<float>();
  auto t_red = Clock::now();
  if (sharded()) {
    std::vector<comm::Work> works;
    for (const ShardUnit& u : units_) {
      works.push_back(shard_comm_->reduce_scatter(g + u.begin, shard_grad_.data<float>() + u.at,
                                                  u.chunk, comm::DataType::f32, comm::RedOp::sum));
    }
    for (comm::Work& w : works) w.wait();
    if (across_) {  // hybrid: the same chunk on the other hosts
      across_
          ->allreduce(shard_grad_.data<float>(), shard_grad_.data<float>(), shard_elems_,
                      comm::DataType::f32, comm::RedOp::sum)
          .wait();
    }
    if (o_.shard != Shard::zero1) {
      // Reduced: the full-size gradients (and zero3's parameters) back to the kernel, each
      // replica keeping its chunk. Dropped pages read as zero, so zero_grad has nothing to do.
      tensor::drop_pages(g + begin_, (end_ - begin_) * sizeof(float));
      grads_zero_ = true;
      if (shards_parameters()) {
        tensor::drop_pages(m_.flat_values().data<float>() + begin_,
                           (end_ - begin_) * sizeof(float));
        gathered_ = false;
      }
    }
  } else if (replicas_ > 1) {
    const size_t chunk = 25u << 18;  // elements
    std::vector<comm::Work> works;
    for (size_t a = begin_; a < end_; a += chunk) {
      const size_t k = std::min(chunk, end_ - a);
      works.push_back(
          replicas_comm_->allreduce(g + a, g + a, k, comm::DataType::f32, comm::RedOp::sum));
    }
    for (comm::Work& w : works) w.wait();
  }
  const double waited = seconds_since(t_red);
  stats_.reduce_s += waited;
  return waited;
}

}  // namespace cohort::dist
