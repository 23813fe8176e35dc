// Pipeline parallelism (see pipeline.h): the schedules, the balanced cut, the channels between
// neighbouring stages, and a stage's step, which reads top to bottom: zero, the schedule's
// actions (receive, compute, send), the replicas' allreduce, the mean loss to every stage.
#include "cohort/dist/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <sstream>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/hash.h"
#include "cohort/dist/step_memory.h"
#include "cohort/nn/layers.h"

namespace cohort::dist {

using nn::Tensor;
using nn::Var;
using tensor::Shape;

namespace {

// Stage s's pieces: [a, b).
std::pair<int, int> stage_pieces(const std::vector<int>& cuts, int stages, int s, int n) {
  return {s == 0 ? 0 : cuts[static_cast<size_t>(s) - 1],
          s == stages - 1 ? n : cuts[static_cast<size_t>(s)]};
}

}  // namespace

const char* schedule_name(Schedule s) {
  return s == Schedule::gpipe ? "gpipe" : "1f1b";
}

Schedule parse_schedule(const std::string& s) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  COHORT_THROW("unknown pipeline schedule '" << s << "' (choices: gpipe, 1f1b)");
}

std::vector<Action> schedule_actions(Schedule s, int stages, int stage, int micro_batches) {
  COHORT_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
               "schedule of stage " << stage << " of " << stages << " with " << micro_batches
                                    << " micro-batches");
  std::vector<Action> a;
  const int m = micro_batches;
  if (s == Schedule::gpipe) {
    for (int i = 0; i < m; ++i) a.push_back({true, i});
    // Backwards in micro-batch order, as 1F1B's: every schedule then adds the micro-batches'
    // gradients in one order, and ends with the same bits.
    for (int i = 0; i < m; ++i) a.push_back({false, i});
    return a;
  }
  // 1F1B: enough forwards to fill the stages after this one, then one forward and one
  // backward in turn, then the backwards left.
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) a.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    a.push_back({true, warmup + i});
    a.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) a.push_back({false, i});
  return a;
}

int peak_in_flight(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    held += a.forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

double bubble_formula(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::vector<int> balance_cuts(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  COHORT_CHECK(stages >= 1 && stages <= n,
               "cannot cut " << n << " pieces into " << stages << " stages (each needs one)");
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[i] + costs[i];
  auto cost = [&](int a, int b) { return prefix[static_cast<size_t>(b)] - prefix[a]; };
  // best[s][i]: the least possible costliest stage when pieces [0, i) form s stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(best[0].size(), 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n; ++i)
      for (int j = s - 1; j < i; ++j) {
        const double v = std::max(best[s - 1][j], cost(j, i));
        if (v < best[s][i]) {
          best[s][i] = v;
          from[s][i] = j;
        }
      }
  std::vector<int> cuts(static_cast<size_t>(stages) - 1);
  for (int s = stages, i = n; s > 1; --s) {
    i = from[s][i];
    cuts[static_cast<size_t>(s) - 2] = i;
  }
  return cuts;
}

// One direction of traffic with one neighbour: a two-rank communicator on which this rank only
// sends, or only receives, so that its queue never mixes the two.
struct Pipeline::Channel {
  std::shared_ptr<comm::Communicator> comm;
  int peer = 0;
  Shape shape;       // what travels, per micro-batch (channels-last activations or gradients)
  std::string what;  // for errors: "activations from stage 1"
  // Receiving: the free buffers, and the receives posted (one ahead of the one taken).
  std::vector<Tensor> free;
  std::deque<std::pair<Tensor, comm::Work>> posted;
  int to_post = 0;  // receives still to post in this step
  // Sending: what is in flight, kept alive until taken.
  std::deque<std::pair<Tensor, comm::Work>> sending;

  size_t count() const { return static_cast<size_t>(tensor::shape_numel(shape)); }
  void preallocate(int n) {
    for (int i = 0; i < n; ++i)
      free.push_back(Tensor::empty(shape, tensor::DType::f32, tensor::Order::channels_last));
  }
  void post() {
    Tensor t;
    if (!free.empty()) {
      t = std::move(free.back());
      free.pop_back();
    } else {
      t = Tensor::empty(shape, tensor::DType::f32, tensor::Order::channels_last);
    }
    comm::Work w = comm->recv(t.raw(), count(), comm::DataType::f32, peer);
    posted.emplace_back(std::move(t), std::move(w));
    --to_post;
  }
  void start(int n) {
    to_post = n;
    if (to_post > 0) post();
  }
  // The next message (posting the one after it first, so that it arrives during compute).
  Tensor take() {
    COHORT_CHECK(!posted.empty(), "pipeline: " << what << ": nothing posted to receive");
    if (to_post > 0) post();
    auto [t, w] = std::move(posted.front());
    posted.pop_front();
    wait(w, "receiving");
    return t;
  }
  void give_back(Tensor t) {
    if (t.defined() && t.block().use_count() == 1) free.push_back(std::move(t));
  }
  // A failed transfer names both stages and their ranks (the communicator's own message says
  // rank 0 or 1 of the pair).
  void wait(comm::Work& w, const char* doing) {
    try {
      w.wait();
    } catch (const std::exception& e) {
      COHORT_THROW_AS(CommError, "pipeline: " << doing << " " << what << " failed: " << e.what());
    }
  }
  void send(const Tensor& t) {
    COHORT_CHECK(t.shape() == shape,
                 "pipeline: " << what << " has shape " << tensor::shape_string(t.shape())
                              << ", the neighbour expects " << tensor::shape_string(shape));
    Tensor dense = t.is_channels_last() ? t : t.channels_last();
    comm::Work w = comm->send(dense.raw(), count(), comm::DataType::f32, peer);
    sending.emplace_back(std::move(dense), std::move(w));
    while (!sending.empty() && sending.front().second.test()) {
      wait(sending.front().second, "sending");  // rethrows a failure
      sending.pop_front();
    }
  }
  void drain() {
    while (!sending.empty()) {
      wait(sending.front().second, "sending");
      sending.pop_front();
    }
  }
};

// A micro-batch in flight on this stage.
struct Pipeline::Micro {
  nn::Tape tape;
  Var input, output, loss;
  Tensor received;  // the activation buffer input reads (returned to the channel after backward)
};

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
