// Data parallelism as the training loop sees it, whatever is sharded: DDP (every rank holds
// everything), ZeRO-1/2/3 (optimizer state, then gradients, then parameters split over the
// ranks, FSDP's FULL_SHARD being ZeRO-3) and hybrid sharding (ZeRO-3 inside a host, replicas
// across hosts). One interface, so that the step reads the same in every mode: zero the
// gradients, forward and backward (the gradients go out as backward finishes them), finish,
// the optimiser on optim_target(), after_step(). Built by make_data_parallel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/dist/step_memory.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"

namespace cohort::dist {

enum class Shard { none, zero1, zero2, zero3, hybrid };
const char* shard_name(Shard s);
Shard parse_shard(const std::string& s);  // throws naming the value and the choices

// What the gradients travel as: f32 (none), or converted to bf16 or f16 for the reduction.
enum class Compression { none, bf16, f16 };
const char* compression_name(Compression c);  // "f32", "bf16", "f16"
Compression parse_compression(const std::string& s);

struct DdpOptions {
  Shard shard = Shard::none;
  // DDP's buckets (the sharded modes communicate per unit instead).
  double first_bucket_mb = 1.0;
  double bucket_mb = 25.0;
  Compression compression = Compression::none;
  // zero3 and hybrid: free a unit's gathered parameters after its forward (gather them again
  // for backward); false keeps them until backward is done with them (ZeRO-2 memory for
  // parameters, one gather fewer).
  bool reshard_after_forward = true;
  // zero3 and hybrid: at most this many units' gathers in flight beyond the one being waited
  // for (PyTorch FSDP's limit_all_gathers), so that prefetch cannot spike memory.
  int max_prefetch = 1;
  // zero2, zero3, hybrid under accumulation: false reduce-scatters every micro-batch into the
  // shard (no full-size gradient buffer is kept); true keeps full local gradients over the
  // micro-batches and communicates once (less traffic, the full buffer's memory).
  bool accumulate_locally = false;
};

// The ZeRO paper's model-state bytes per rank for a mode: f32 values and gradients, K bytes of
// optimiser state per element, Psi elements, the state sharded over n ranks (the host's ranks
// for hybrid). DDP (4, 4, K) Psi; zero1 (4, 4, K/n) Psi; zero2 (4, 4/n, K/n) Psi; zero3 and
// hybrid (4/n, 4/n, K/n) Psi.
struct ModelState {
  double parameters = 0, gradients = 0, optimizer = 0;
  double total() const { return parameters + gradients + optimizer; }
};
ModelState zero_model_state(Shard mode, double psi, double k, double n);

// Bytes per rank, by category, for the memory report (peaks over the steps run).
struct MemoryReport {
  Shard mode = Shard::none;
  int ranks = 1;        // over which the state is sharded (the host's ranks for hybrid)
  int64_t psi = 0;      // parameter elements
  int state_bytes = 0;  // optimiser state bytes per parameter element (K: 8 for AdamW)
  size_t parameters = 0, gradients = 0, optimizer = 0;  // the model state, resident
  size_t gathered = 0;             // zero3/hybrid: the peak of gathered units' parameters
  size_t gradients_in_flight = 0;  // peak of full-size unit gradients not yet reduced
  size_t activations = 0;          // peak of what a step allocates beyond the above
  size_t comm_buffers = 0;         // staging and wire buffers and the collectives' scratch
  size_t allocator_cache = 0;      // blocks the tensor allocator keeps for reuse
  size_t peak_rss = 0;             // what the kernel saw, for comparison

  size_t model_state() const { return parameters + gradients + optimizer; }
  size_t total() const {
    return model_state() + gathered + gradients_in_flight + activations + comm_buffers +
           allocator_cache;
  }
  // zero_model_state's total for this report's mode, Psi, K and ranks.
  double formula() const;
};

// Bytes this rank sent in the last step, by collective (the algorithms' own counts: a ring
// reduce-scatter of B bytes sends (N-1)/N B).
struct Traffic {
  double allreduce = 0, reduce_scatter = 0, allgather = 0;
  double across_hosts = 0;  // hybrid: the allreduce of shards between hosts
  double total() const { return allreduce + reduce_scatter + allgather; }
};

class DataParallel {
 public:
  virtual ~DataParallel() = default;
  virtual Shard mode() const = 0;
  virtual std::string describe() const = 0;  // a line for the log

  // Before a step's first micro-batch.
  virtual void zero_grad() = 0;
  // Backward of one micro-batch: arms the hooks on its tape and runs it with the loss gradient
  // scaled by loss_scale / world (the reductions sum, which leaves the average). sync = false
  // for all but the last micro-batch of an accumulation.
  virtual void backward(nn::Tape& tape, const nn::Var& loss, float loss_scale, bool sync) = 0;
  // Waits for the step's gradient reductions; returns the seconds spent waiting (the exposed
  // communication).
  virtual double finish() = 0;
  // What the optimiser updates on this rank, and the gradients for clipping and loss scaling.
  virtual const nn::OptimTarget& optim_target() const = 0;
  // After the optimiser step (or a checkpoint load): the updated values go where forward reads
  // them (zero1/2: the chunks are all-gathered; zero3: the gathered units are stale).
  virtual void after_step() = 0;
  // The whole parameters in the model's flat buffer on every rank (to save weights, to test).
  virtual void gather_parameters() = 0;
  // Rank 0's BatchNorm statistics to every rank (before evaluation and checkpoints).
  virtual void broadcast_buffers() = 0;
  // True when every rank holds all of optim_target()'s pieces (DDP): checkpoints are written by
  // rank 0 alone.
  virtual bool replicated() const = 0;

  // This rank's figures: what the engine holds, the optimiser's state (from opt), and what the
  // steps allocated (step_memory_).
  MemoryReport memory(const nn::Optimizer& opt) const;
  virtual Traffic traffic() const = 0;
  virtual comm::Communicator& communicator() = 0;

 protected:
  // Mode, ranks, Psi, and the parameters, gradients, gathered units, gradients in flight and
  // communication buffers the engine holds.
  virtual MemoryReport held() const = 0;
  StepMemory step_memory_;  // begun by zero_grad, ended by finish
};

// DDP for Shard::none, the sharded engine otherwise. Collective: every rank of c, with the same
// options and model, or an error naming the rank that differs before anything is trained.
// Starts every rank from rank 0's parameters and buffers.
std::unique_ptr<DataParallel> make_data_parallel(nn::Model& m,
                                                 std::shared_ptr<comm::Communicator> c,
                                                 const DdpOptions& o);

// Every rank takes `root`'s parameters (the flat value buffer) and buffers (BatchNorm's running
// statistics).
void broadcast_parameters(nn::Model& m, comm::Communicator& c, int root = 0);
void broadcast_buffers(nn::Model& m, comm::Communicator& c, int root = 0);

// SyncBatchNorm: every BatchNorm2d of the model takes its batch statistics over all ranks, on
// a communicator of its own (split from c) so that its small reductions never queue behind
// the gradients'.
void sync_batch_norm(nn::Model& m, const std::shared_ptr<comm::Communicator>& c);

// Adds the optimiser's state to a report: its bytes, and K (bytes per element).
void add_optimizer_state(MemoryReport& r, const nn::Optimizer& opt);

// The memory report as a table (one column per rank).
std::string memory_table(const std::vector<MemoryReport>& per_rank);
// Before training: the model-state, gathered and communication bytes each mode would need per
// rank (activations are measured at run time); throws, naming the modes that fit, when `mode`
// does not fit in max_bytes.
void check_fits(const nn::Model& m, int world, int local_world, Shard mode, int state_bytes,
                const DdpOptions& o, size_t max_bytes);

}  // namespace cohort::dist
