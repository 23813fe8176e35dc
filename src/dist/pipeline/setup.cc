// A pipeline's set-up (see pipeline.h): the model cut into stages, stages and replicas placed
// on the ranks, the channels to the neighbours opened and their shapes checked, and the
// description of it all.
#include "internal.h"

namespace cohort::dist {

using nn::Tensor;
using nn::Var;
using pipeline_impl::stage_pieces;
using tensor::Shape;

Pipeline::Pipeline(nn::Model& m, std::shared_ptr<comm::Communicator> world,
                   const PipelineOptions& o, const Shape& micro_input)
    : m_(m), world_(std::move(world)), o_(o) {
  const auto& pieces = m_.pieces();
  const int S = o_.stages, W = world_->size();
  COHORT_CHECK(!pieces.empty(), "model " << m_.name() << " cannot be cut into pipeline stages");
  COHORT_CHECK(S >= 1 && W % S == 0,
               "--pipeline-stages " << S << " does not divide the " << W << " ranks");
  COHORT_CHECK(o_.micro_batches >= 1, "--micro-batches " << o_.micro_batches);
  COHORT_CHECK(micro_input.size() == 4 && micro_input[0] >= 1,
               "pipeline: micro-batch input " << tensor::shape_string(micro_input));
  stage_ = world_->rank() % S;
  replica_ = world_->rank() / S;
  replicas_ = W / S;
  const int n = static_cast<int>(pieces.size());

  // Every piece's output shape and multiply-adds, from a forward of one sample (no tape, the
  // running statistics untouched): every rank finds the same.
  std::vector<Shape> shapes(static_cast<size_t>(n));
  costs_.assign(static_cast<size_t>(n), 0.0);
  {
    nn::NoGrad off;
    nn::FrozenBatchNormStatistics frozen;
    Shape one = micro_input;
    one[0] = 1;
    Var h = nn::constant(Tensor::zeros(one, tensor::DType::f32, tensor::Order::channels_last));
    for (int i = 0; i < n; ++i) {
      const uint64_t before = nn::forward_macs();
      h = pieces[static_cast<size_t>(i)].forward(h);
      costs_[static_cast<size_t>(i)] = static_cast<double>(nn::forward_macs() - before);
      shapes[static_cast<size_t>(i)] = h->value.shape();
      shapes[static_cast<size_t>(i)][0] = micro_input[0];
    }
  }
  if (o_.balance == "time" && o_.cuts.empty()) {
    // Measured on rank 0: each piece's forward and backward on one micro-batch, the faster of
    // two rounds (the first also builds the kernels); sent to every rank.
    if (world_->rank() == 0) {
      nn::FrozenBatchNormStatistics frozen;
      std::fill(costs_.begin(), costs_.end(), std::numeric_limits<double>::infinity());
      for (int rep = 0; rep < 2; ++rep) {
        Tensor h = Tensor::zeros(micro_input, tensor::DType::f32, tensor::Order::channels_last);
        for (int i = 0; i < n; ++i) {
          Var in = nn::constant(h);
          in->requires_grad = i > 0;
          nn::Tape tape;
          tape.track_uses(false);
          auto t0 = Clock::now();
          Var out;
          {
            nn::Tape::Recording rec(tape);
            out = pieces[static_cast<size_t>(i)].forward(in);
          }
          tape.backward_from(out, Tensor::full(out->value.shape(), 1e-3f, out->value.order()));
          double& c = costs_[static_cast<size_t>(i)];
          c = std::min(c, seconds_since(t0));
          h = out->value;
        }
      }
      m_.zero_grad();
    }
    world_->broadcast(costs_.data(), costs_.data(), costs_.size(), comm::DataType::f64, 0).wait();
  } else {
    COHORT_CHECK(o_.balance == "flops" || o_.balance == "time",
                 "--pipeline-balance '" << o_.balance << "' (choices: flops, time)");
  }
  if (o_.cuts.empty()) {
    cuts_ = balance_cuts(costs_, S);
  } else {
    cuts_ = o_.cuts;
    COHORT_CHECK(static_cast<int>(cuts_.size()) == S - 1, "--pipeline-cuts has "
                                                              << cuts_.size() << " cuts; " << S
                                                              << " stages need " << S - 1);
    for (int i = 0; i < S - 1; ++i) {
      const int lo = i == 0 ? 1 : cuts_[static_cast<size_t>(i) - 1] + 1;
      COHORT_CHECK(cuts_[static_cast<size_t>(i)] >= lo && cuts_[static_cast<size_t>(i)] < n,
                   "--pipeline-cuts: cut " << i + 1 << " at piece " << cuts_[static_cast<size_t>(i)]
                                           << " must be in [" << lo << ", " << n - 1
                                           << "] (the model has " << n << " pieces)");
    }
  }
  first_piece_ = stage_ == 0 ? 0 : cuts_[static_cast<size_t>(stage_) - 1];
  last_piece_ = stage_ == S - 1 ? n : cuts_[static_cast<size_t>(stage_)];
  in_shape_ = stage_ == 0 ? micro_input : shapes[static_cast<size_t>(first_piece_) - 1];
  out_shape_ = shapes[static_cast<size_t>(last_piece_) - 1];
  if (stage_ < S - 1) {
    COHORT_CHECK(out_shape_.size() == 4, "pipeline: stage " << stage_ << " would send "
                                                            << tensor::shape_string(out_shape_)
                                                            << "; cuts go between 4-d blocks");
  }

  // The communicators: this replica's stages, this stage's replicas, and (sharded) the
  // replicas a unit is split over: all of them, or under hybrid those on this host, each chunk
  // then all-reduced with the ranks that hold it on the other hosts.
  pipe_ = world_->split(replica_, stage_);
  replicas_comm_ = world_->split(stage_, replica_);
  shard_comm_ = replicas_comm_;
  if (o_.shard == Shard::hybrid && replicas_ > 1) {
    const int host = static_cast<int>(fnv1a64(world_->host()) & 0x3fffffff);
    shard_comm_ = replicas_comm_->split(host, replica_);
    across_ = replicas_comm_->split(shard_comm_->rank(), replica_);
    // Every stage on every host must split alike, or the ranks would disagree on the layout.
    int64_t n[2] = {shard_comm_->size(), -shard_comm_->size()};
    world_->allreduce(n, n, 2, comm::DataType::i64, comm::RedOp::min).wait();
    COHORT_CHECK(n[0] == -n[1],
                 "pipeline: --shard hybrid: every host must hold as many replicas of every stage "
                 "(rank "
                     << world_->rank() << ", stage " << stage_ << ", has " << shard_comm_->size()
                     << " on host " << world_->host() << "; another host has "
                     << (n[0] != shard_comm_->size() ? n[0] : -n[1])
                     << "): give each host a multiple of " << S << " ranks, whole replicas");
    if (across_->size() == 1) across_.reset();
  }
  // Sharded, every unit of the model is laid out again on a multiple of N x 16 elements (as
  // the sharded engine does), so that each unit splits into N equal chunks, each 64-byte
  // aligned, with nothing past the stage's range.
  const bool sharded = o_.shard != Shard::none && shard_comm_->size() > 1;
  const size_t align = sharded ? static_cast<size_t>(shard_comm_->size()) * 16 : 1;
  own_ = static_cast<size_t>(shard_comm_->rank());
  const size_t own = own_;
  if (sharded) m_.align_units(align);

  // This stage's parameters: one range of the flat buffers, the rest returned to the kernel.
  const auto& params = m_.params();
  const int pfirst = pieces[static_cast<size_t>(first_piece_)].first;
  const int plast = pieces[static_cast<size_t>(last_piece_) - 1].last;
  begin_ = pfirst < plast ? params[static_cast<size_t>(pfirst)]->offset : 0;
  end_ = pfirst < plast ? params[static_cast<size_t>(plast) - 1]->offset +
                              nn::flat_slot(static_cast<size_t>(
                                  params[static_cast<size_t>(plast) - 1]->value.numel()))
                        : 0;
  end_ = (end_ + align - 1) / align * align;  // the last unit's padding
  float* values = m_.flat_values().data<float>();
  float* grads = m_.flat_grads().data<float>();
  const size_t total = static_cast<size_t>(m_.flat_values().numel());
  COHORT_CHECK(begin_ % align == 0 && end_ <= total,
               "pipeline: stage " << stage_ << "'s parameters [" << begin_ << ", " << end_
                                  << ") do not start on a unit of the " << total
                                  << "-element layout aligned to " << align);
  tensor::drop_pages(values, begin_ * sizeof(float));
  tensor::drop_pages(values + end_, (total - end_) * sizeof(float));
  tensor::drop_pages(grads, total * sizeof(float));
  // What the optimiser updates: the stage's range, or (sharded) this replica's chunk of each
  // of the stage's units, and the parameters' pieces that lie there.
  const size_t length = end_ - begin_;
  if (sharded) {
    size_t at = begin_;
    for (const nn::Unit& u : m_.units()) {
      if (u.begin < begin_ || u.end > end_) continue;
      COHORT_CHECK(u.begin == at, "pipeline: stage " << stage_ << "'s unit " << u.name
                                                     << " starts at " << u.begin << ", not " << at);
      units_.push_back({u.begin, u.end - u.begin, (u.end - u.begin) / (align / 16), shard_elems_});
      shard_elems_ += units_.back().chunk;
      at = u.end;
    }
    COHORT_CHECK(at == end_, "pipeline: stage " << stage_ << "'s units end at " << at
                                                << ", its parameters at " << end_);
    shard_grad_ = Tensor::zeros({static_cast<int64_t>(shard_elems_)});
    if (shards_parameters()) shard_values_ = Tensor::zeros({static_cast<int64_t>(shard_elems_)});
    for (const ShardUnit& u : units_) {
      const size_t lo = u.begin + own * u.chunk;
      float* w = shards_parameters() ? shard_values_.data<float>() + u.at : values + lo;
      target_.ranges.push_back({w, shard_grad_.data<float>() + u.at, u.chunk});
    }
  } else {
    target_.ranges.push_back({values + begin_, grads + begin_, length});
  }
  for (int i = pfirst; i < plast; ++i) {
    const nn::Param* p = params[static_cast<size_t>(i)];
    const size_t a = p->offset, b = a + static_cast<size_t>(p->value.numel());
    if (!sharded) {
      target_.pieces.push_back({p->index, 0, b - a, 0, a - begin_, p->decay});
      continue;
    }
    for (size_t k = 0; k < units_.size(); ++k) {
      const size_t lo = units_[k].begin + own * units_[k].chunk;
      const size_t hi = lo + units_[k].chunk;
      if (std::max(a, lo) < std::min(b, hi)) {
        target_.pieces.push_back({p->index, std::max(a, lo) - a, std::min(b, hi) - a, k,
                                  std::max(a, lo) - lo, p->decay});
      }
    }
  }
  target_.num_params = static_cast<int>(params.size());
  // Where each of the stage's pieces ends in the flat buffers (the first forward of a zero3
  // step waits for the gathers of the units before it).
  for (int i = first_piece_; i < last_piece_; ++i) {
    const auto& pc = pieces[static_cast<size_t>(i)];
    const nn::Param* last = pc.first < pc.last ? params[static_cast<size_t>(pc.last) - 1] : nullptr;
    piece_end_.push_back(last ? last->offset + static_cast<size_t>(last->value.numel()) : 0);
  }

  // Clipping's and LARS's sums: over the stages, and (sharded) over the replicas' chunks,
  // each chunk once (hybrid: one host's copy of each, the world's ranks of one host index).
  sums_ = !sharded ? pipe_ : across_ ? world_->split(across_->rank(), world_->rank()) : world_;
  target_.sum_across = [c = sums_.get()](double* v, size_t k) {
    c->allreduce(v, v, k, comm::DataType::f64, comm::RedOp::sum).wait();
  };
  if (o_.sync_batch_norm) {
    COHORT_CHECK(!o_.deferred_batch_norm,
                 "pipeline: SyncBatchNorm and deferred BatchNorm statistics are exclusive");
    sync_batch_norm(m_, replicas_comm_);
  }
  // Pairs (s, s+1) with s even, then with s odd; activations, then gradients. A rank outside
  // any pair of a split (the ends) takes no communicator (colour -1).
  std::shared_ptr<comm::Communicator> pairs[2][2];  // [activations|gradients][even|odd]
  for (int kind = 0; kind < 2; ++kind)
    for (int parity = 0; parity < 2; ++parity) {
      const int low = (stage_ - parity) % 2 == 0 ? stage_ : stage_ - 1;  // the pair's first
      const bool paired = low >= 0 && low + 1 < S;
      pairs[kind][parity] = pipe_->split(paired ? low : -1, stage_);
    }
  auto channel = [&](int kind, int low, int peer, const Shape& shape, const std::string& what,
                     int other) {
    auto c = std::make_unique<Channel>();
    c->comm = pairs[kind][low % 2];
    c->peer = peer;
    c->shape = shape;
    c->what = "stage " + std::to_string(stage_) + " (rank " + std::to_string(world_->rank()) +
              "): " + what + " stage " + std::to_string(other) + " (rank " +
              std::to_string(replica_ * S + other) + ")";
    return c;
  };
  if (stage_ > 0) {
    act_in_ = channel(0, stage_ - 1, 0, in_shape_, "activations from", stage_ - 1);
    grad_out_ = channel(1, stage_ - 1, 0, in_shape_, "gradients to", stage_ - 1);
  }
  if (stage_ < S - 1) {
    act_out_ = channel(0, stage_, 1, out_shape_, "activations to", stage_ + 1);
    grad_in_ = channel(1, stage_, 1, out_shape_, "gradients from", stage_ + 1);
  }
  check_shapes();

  actions_ = schedule_actions(o_.schedule, S, stage_, o_.micro_batches);
  // Receive buffers: one per micro-batch held at once, and one posted ahead.
  if (act_in_) act_in_->preallocate(peak_in_flight(actions_) + 1);
  if (grad_in_) grad_in_->preallocate(2);
  for (int i = 0; i < o_.micro_batches; ++i) {
    micro_.push_back(std::make_unique<Micro>());
    micro_.back()->tape.track_uses(false);
  }
  if (o_.deferred_batch_norm) nn::defer_batch_norm_statistics(m_.root(), true);
  // Every replica starts from replica 0's values and statistics.
  if (replicas_ > 1) {
    replicas_comm_
        ->broadcast(values + begin_, values + begin_, end_ - begin_, comm::DataType::f32, 0)
        .wait();
    for (nn::Buffer* b : m_.buffers()) {
      const comm::DataType t =
          b->value.dtype() == tensor::DType::i64 ? comm::DataType::i64 : comm::DataType::f32;
      replicas_comm_
          ->broadcast(b->value.raw(), b->value.raw(), static_cast<size_t>(b->value.numel()), t, 0)
          .wait();
    }
  }
  if (sharded && o_.shard != Shard::zero1) {
    // zero2 and zero3 give the stage's full-size gradients (zero3: parameters) back every step
    // and fault them in again in the next.
    tensor::prefer_huge_pages(grads + begin_, length * sizeof(float));
    if (shards_parameters()) tensor::prefer_huge_pages(values + begin_, length * sizeof(float));
  }
  if (sharded && shards_parameters()) {
    // The stage's parameters as this replica's chunks; the full range goes back to the kernel
    // until the first forward gathers it.
    for (const ShardUnit& u : units_) {
      const float* from = values + u.begin + own * u.chunk;
      std::copy(from, from + u.chunk, shard_values_.data<float>() + u.at);
    }
    tensor::drop_pages(values + begin_, length * sizeof(float));
    gathered_ = false;
  }
}

Pipeline::~Pipeline() = default;

// Each stage tells the next the shape it will send; the next compares it with what it expects
// to receive, and both fail naming the two sides when they differ.
void Pipeline::check_shapes() {
  std::vector<int64_t> sent(5, 0), expected(5, 0);
  if (act_out_) {
    sent[0] = static_cast<int64_t>(out_shape_.size());
    for (size_t i = 0; i < out_shape_.size() && i < 4; ++i) sent[i + 1] = out_shape_[i];
    act_out_->comm->send(sent.data(), sent.size(), comm::DataType::i64, act_out_->peer).wait();
  }
  if (act_in_) {
    std::vector<int64_t> got(5, 0);
    act_in_->comm->recv(got.data(), got.size(), comm::DataType::i64, act_in_->peer).wait();
    expected[0] = static_cast<int64_t>(in_shape_.size());
    for (size_t i = 0; i < in_shape_.size() && i < 4; ++i) expected[i + 1] = in_shape_[i];
    if (got != expected) {
      Shape g(got.begin() + 1, got.begin() + 1 + std::clamp<int64_t>(got[0], 0, 4));
      COHORT_THROW("pipeline: stage " << stage_ - 1 << " sends activations of shape "
                                      << tensor::shape_string(g) << " but stage " << stage_
                                      << " expects " << tensor::shape_string(in_shape_)
                                      << " (do both run the same model, cut and batch?)");
    }
  }
}

std::string Pipeline::describe() const {
  const auto& pieces = m_.pieces();
  double total = 0;
  for (double c : costs_) total += c;
  std::ostringstream os;
  os << o_.stages << " stages x " << replicas_ << " replicas";
  if (replicas_ > 1) {
    const char* how = !sharded()                 ? "allreduce"
                      : o_.shard == Shard::zero1 ? "ZeRO-1"
                      : o_.shard == Shard::zero2
                          ? "ZeRO-2: gradients reduce-scattered once per step, then freed"
                          : "ZeRO-3: parameters gathered once per step, freed with the "
                            "gradients after its last backward";
    os << " (" << how << " over a stage's replicas";
    if (o_.shard == Shard::hybrid) {
      os << (sharded() ? " on one host" : " on different hosts") << " (hybrid";
      if (sharded()) os << ": " << shard_comm_->size() << " per host";
      if (across_ || !sharded()) os << ", allreduced across hosts";
      os << ")";
    }
    os << (o_.sync_batch_norm ? ", SyncBatchNorm" : "") << ")";
  }
  os << ", " << o_.micro_batches << " micro-batches, " << schedule_name(o_.schedule)
     << " (bubble by the formula " << std::lround(100 * bubble_formula(o_.stages, o_.micro_batches))
     << "%), cut by " << (o_.cuts.empty() ? o_.balance : std::string("hand")) << ":";
  for (int s = 0; s < o_.stages; ++s) {
    const auto [a, b] = stage_pieces(cuts_, o_.stages, s, static_cast<int>(pieces.size()));
    double c = 0;
    int64_t params = 0;
    for (int i = a; i < b; ++i) {
      c += costs_[static_cast<size_t>(i)];
      for (int p = pieces[static_cast<size_t>(i)].first; p < pieces[static_cast<size_t>(i)].last;
           ++p)
        params += m_.params()[static_cast<size_t>(p)]->value.numel();
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "\n  stage %d: %s .. %s (%d pieces, %.2fM parameters, %.0f%% of the cost)", s,
                  pieces[static_cast<size_t>(a)].name.c_str(),
                  pieces[static_cast<size_t>(b) - 1].name.c_str(), b - a,
                  static_cast<double>(params) / 1e6, total > 0 ? 100 * c / total : 0.0);
    os << line;
  }
  return os.str();
}

}  // namespace cohort::dist
