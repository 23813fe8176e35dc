// The sharded data-parallel engine (ZeRO-1/2/3 and hybrid), internal to dist: build it through
// make_data_parallel (data_parallel.h).
//
// The grain is the model's unit (nn::Unit: a block, the stem, the head). The flat buffers are
// laid out again so that each unit spans a multiple of N x 16 elements; rank r owns chunk r of
// every unit (len / N elements, 64-byte aligned), as FSDP's flat parameter per wrapped module.
// - Gradients: when backward has finished a unit (every parameter of it reported by the tape),
//   its slice of the flat gradient buffer is reduce-scattered (units go out in backward order on
//   every rank). zero1 keeps the full gradient buffer and reduces into its own chunk of it, once
//   per step; zero2/3 reduce into a compact shard buffer and return the unit's gradient pages
//   to the kernel (madvise), every micro-batch unless accumulate_locally.
// - Optimiser: one range per unit, this rank's chunk (optim_target()).
// - Parameters: zero1/2 keep them whole and all-gather the chunks after the step (forward
//   waits per unit, so the gathers overlap the next step's first units). zero3 keeps the f32
//   master chunk apart, and each unit is gathered when a layer first reads it (nn::Residency),
//   with the next unit prefetched in the direction of travel, and given up after its forward
//   (reshard_after_forward) and after its backward.
// - Where a gathered unit and a unit's gradients live: buffers of the largest unit's size, kept
//   in a pool and reused step after step (FSDP's unsharded flat parameter); the unit's Params
//   are views into one while it is in use, into the (page-less) flat buffers otherwise. Taking
//   pages from the kernel for each use instead (page faults, madvise) measured zero2 at 1.21x and
//   zero3 at 1.24x DDP's resnet50 step here; with the pool 1.08x and 1.12x (bench/compare-zero).
// - Hybrid: zero3 over the ranks of one host, then the reduced shard is all-reduced with the
//   ranks that hold the same chunk on the other hosts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/dist/data_parallel.h"

namespace cohort::dist {

// Buffers of one size, reused: what a unit is gathered into, or its gradients written into.
class UnitPool {
 public:
  UnitPool() = default;
  ~UnitPool();
  void resize(size_t floats) { floats_ = floats; }  // before the first take()
  UnitPool(const UnitPool&) = delete;
  UnitPool& operator=(const UnitPool&) = delete;
  float* take();
  void give(float* b);
  size_t peak_bytes() const { return peak_ * floats_ * sizeof(float); }

 private:
  size_t floats_ = 0;
  std::vector<float*> all_, free_;
  size_t live_ = 0, peak_ = 0;
};

class Sharded : public DataParallel, private nn::Residency {
 public:
  Sharded(nn::Model& m, std::shared_ptr<comm::Communicator> world, const DdpOptions& o);
  ~Sharded() override;

  Shard mode() const override { return o_.shard; }
  std::string describe() const override;
  void zero_grad() override;
  void backward(nn::Tape& tape, const nn::Var& loss, float loss_scale, bool sync) override;
  double finish() override;
  const nn::OptimTarget& optim_target() const override { return target_; }
  void after_step() override;
  void gather_parameters() override;
  void broadcast_buffers() override;
  bool replicated() const override { return false; }
  MemoryReport held() const override;
  Traffic traffic() const override { return traffic_; }
  comm::Communicator& communicator() override { return *world_; }

 private:
  struct UnitState {
    size_t begin = 0, len = 0;   // the unit in the flat buffers
    size_t chunk = 0;            // len / N: what each rank owns
    size_t shard_at = 0;         // this rank's chunk in the compact shard buffers
    int first = 0, last = 0;     // parameters
    int pending = 0;             // parameters backward has not finished this micro-batch
    bool resident = true;        // the flat value buffer holds the unit's current values
    bool gathering = false;      // an allgather into it is in flight
    bool grads_live = false;     // its full-size gradients exist (a pool buffer or pages)
    float* values_in = nullptr;  // zero3: the pool buffer it is gathered into (null: flat)
    float* grads_in = nullptr;   // zero2/3: the pool buffer backward writes its gradients to
    bool reducing = false;       // a reduce-scatter is in flight
    comm::Work gather, reduce, across;
    nn::Tensor wire, staging;  // reduction in bf16/f16; a micro-batch's result to add
  };

  void need(nn::Param& p) override;
  void on_ready(nn::Param& p);
  void launch(size_t u);
  void complete(size_t u);  // its reduce-scatter finished
  void poll();              // completes the finished reductions, in launch order
  void drain();             // waits for every reduction in flight
  void issue_gather(size_t u, bool flat = false);
  void wait_gather(size_t u);
  void release_values(size_t u);
  void release_grads(size_t u);
  void flush_releases(int keep);
  void bind_values(size_t u, float* base);  // the unit's Params view base (null: flat buffer)
  void bind_grads(size_t u, float* base);
  bool pooled_grads() const { return stage() >= 2 && !o_.accumulate_locally; }
  int stage() const;  // 1, 2 or 3 (hybrid: 3)
  float* shard_grad(size_t u);

  nn::Model& m_;
  std::shared_ptr<comm::Communicator> world_;
  std::shared_ptr<comm::Communicator> shard_;     // the ranks a unit is split over
  std::shared_ptr<comm::Communicator> replicas_;  // hybrid: the same chunk on other hosts
  DdpOptions o_;
  int n_ = 1, r_ = 0;
  comm::DataType wire_ = comm::DataType::f32;
  std::vector<UnitState> units_;
  std::vector<int> unit_of_;  // param index -> unit
  nn::Tensor shard_values_, shard_grads_;
  // zero1 on one host: the model's flat values and gradients, where the host's ranks read them.
  comm::SharedBuffer shared_values_, shared_grads_;
  nn::OptimTarget target_;

  // The step.
  bool backward_phase_ = false;
  bool sync_ = true;
  bool communicate_ = true;       // this micro-batch reduces
  bool first_reduce_ = true;      // no reduction has landed in the shard yet this step
  std::vector<size_t> launched_;  // units whose reduction went out, in order
  size_t completed_ = 0;          // of launched_
  size_t next_launch_ = 0;        // into the reverse unit order
  int current_ = -1;              // the unit layers are reading
  int in_flight_ = 0;             // prefetched gathers not yet waited for
  std::vector<int> to_release_;   // units backward is done with
  double waited_s_ = 0;           // exposed: gathers waited for and finish()

  UnitPool pool_;  // gathered units and units' gradients

  // Accounting.
  size_t live_grads_now_ = 0, live_grads_peak_ = 0;
  size_t comm_now_ = 0, comm_peak_ = 0;
  Traffic traffic_;
};

}  // namespace cohort::dist
