// What is gathered from a pipeline's stages (see pipeline.h): the whole model and its buffers,
// the memory report and every stage's statistics.
#include "internal.h"

namespace cohort::dist {

using nn::Tensor;
using nn::Var;
using pipeline_impl::stage_pieces;
using tensor::Shape;

void Pipeline::gather_model() {
  if (!gathered_) {
    if (!gathering_) start_gather();
    wait_gather();
  }
  const auto& pieces = m_.pieces();
  const auto& params = m_.params();
  float* values = m_.flat_values().data<float>();
  for (int s = 0; s < o_.stages; ++s) {
    const auto [a, b] = stage_pieces(cuts_, o_.stages, s, static_cast<int>(pieces.size()));
    const int pfirst = pieces[static_cast<size_t>(a)].first;
    const int plast = pieces[static_cast<size_t>(b) - 1].last;
    if (pfirst >= plast) continue;
    const nn::Param* end = params[static_cast<size_t>(plast) - 1];
    const size_t lo = params[static_cast<size_t>(pfirst)]->offset;
    const size_t hi = end->offset + nn::flat_slot(static_cast<size_t>(end->value.numel()));
    pipe_->broadcast(values + lo, values + lo, hi - lo, comm::DataType::f32, s).wait();
  }
  gather_buffers();
}

void Pipeline::gather_buffers() {
  const auto& pieces = m_.pieces();
  for (int s = 0; s < o_.stages; ++s) {
    const auto [a, b] = stage_pieces(cuts_, o_.stages, s, static_cast<int>(pieces.size()));
    for (nn::Buffer* buf : m_.buffers()) {
      bool mine = false;
      for (int i = a; i < b && !mine; ++i)
        for (const std::string& mod : pieces[static_cast<size_t>(i)].modules)
          if (buf->name.compare(0, mod.size() + 1, mod + ".") == 0) mine = true;
      if (!mine) continue;
      const comm::DataType t =
          buf->value.dtype() == tensor::DType::i64 ? comm::DataType::i64 : comm::DataType::f32;
      pipe_
          ->broadcast(buf->value.raw(), buf->value.raw(), static_cast<size_t>(buf->value.numel()),
                      t, s)
          .wait();
    }
  }
}

MemoryReport Pipeline::memory(const nn::Optimizer& opt) const {
  MemoryReport r;
  r.mode = sharded() ? o_.shard : Shard::none;
  r.ranks = sharded() ? shard_comm_->size() : 1;
  const auto& pieces = m_.pieces();
  for (int p = pieces[static_cast<size_t>(first_piece_)].first;
       p < pieces[static_cast<size_t>(last_piece_) - 1].last; ++p)
    r.psi += m_.params()[static_cast<size_t>(p)]->value.numel();
  // zero2/3: the chunk between steps, the full range during the schedule.
  const size_t full = (end_ - begin_) * sizeof(float), chunk = shard_elems_ * sizeof(float);
  const bool zero23 = sharded() && o_.shard != Shard::zero1;
  r.parameters = shards_parameters() && sharded() ? chunk : full;
  r.gradients = zero23 ? chunk : full;
  if (zero23) r.gradients_in_flight = full;
  if (shards_parameters() && sharded()) r.gathered = full;
  add_optimizer_state(r, opt);
  r.activations = stats_.peak_step;
  if (sharded() && !zero23) r.comm_buffers += shard_grad_.bytes();
  for (const Channel* c : {act_in_.get(), grad_in_.get()})
    if (c) r.comm_buffers += (c->free.size() + c->posted.size()) * c->count() * sizeof(float);
  return r;
}

std::vector<StageStats> Pipeline::gather_stats() {
  const int W = world_->size();
  std::vector<double> mine = {static_cast<double>(stats_.steps),
                              stats_.step_s,
                              stats_.compute_s,
                              stats_.idle_s,
                              stats_.send_s,
                              stats_.reduce_s,
                              static_cast<double>(stats_.peak_activations),
                              static_cast<double>(stats_.peak_in_flight),
                              static_cast<double>(stats_.peak_step),
                              stats_.gather_s};
  std::vector<double> all(mine.size() * static_cast<size_t>(W));
  world_->allgather(mine.data(), all.data(), mine.size(), comm::DataType::f64).wait();
  std::vector<StageStats> out(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    const double* v = all.data() + mine.size() * static_cast<size_t>(r);
    StageStats& s = out[static_cast<size_t>(r)];
    s.steps = static_cast<int>(v[0]);
    s.step_s = v[1];
    s.compute_s = v[2];
    s.idle_s = v[3];
    s.send_s = v[4];
    s.reduce_s = v[5];
    s.peak_activations = static_cast<size_t>(v[6]);
    s.peak_in_flight = static_cast<int>(v[7]);
    s.peak_step = static_cast<size_t>(v[8]);
    s.gather_s = v[9];
  }
  return out;
}

}  // namespace cohort::dist
