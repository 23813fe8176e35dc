// What the files of src/dist/pipeline/ share: a stage's channels to its neighbours and its
// micro-batches in flight. The jobs, a file each:
//   schedule.cc  the schedules (GPipe, 1F1B), their bubble, and the balanced cut
//   setup.cc     cutting the model, placing the stages and replicas, opening the channels
//   step.cc      a stage's step, which reads top to bottom: zero, the schedule's actions
//                (receive, compute, send), the replicas' allreduce, the mean loss to every stage
//   gather.cc    the whole model, buffers, memory and statistics gathered from the stages
#pragma once

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

namespace pipeline_impl {
// Stage s's pieces: [a, b).
inline std::pair<int, int> stage_pieces(const std::vector<int>& cuts, int stages, int s, int n) {
  return {s == 0 ? 0 : cuts[static_cast<size_t>(s) - 1],
          s == stages - 1 ? n : cuts[static_cast<size_t>(s)]};
}
}  // namespace pipeline_impl

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

}  // namespace cohort::dist
