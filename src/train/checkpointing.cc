// Checkpointing from the training loop: where the run stands after a step, and writing it
// (every rank its shard; dist's checkpoint code makes the write crash-safe).
#include "cohort/core/clock.h"
#include "run.h"

namespace cohort::train {

dist::RunPosition position_after(const Run& r, int64_t step, int64_t epoch, int64_t in_epoch) {
  dist::RunPosition at = r.pos;
  at.step = step;
  const bool epoch_done = in_epoch == r.per_epoch;
  at.epoch = epoch_done ? epoch + 1 : epoch;
  at.position = epoch_done ? 0 : static_cast<uint64_t>(in_epoch * r.global_batch);
  return at;
}

void write_checkpoint(const Run& r, const dist::RunPosition& at) {
  if (r.c.checkpoint_dir.empty()) return;
  auto t0 = Clock::now();
  if (r.pipe) {
    // Every stage of replica 0 writes its parameters and their state (sharded over the
    // replicas, every rank its chunk); rank 0 every stage's BatchNorm statistics (gathered
    // first). Replicas that hold copies write nothing.
    r.pipe->gather_buffers();
    const nn::OptimTarget none;
    const bool writes = r.pipe->replica() == 0 || r.c.shard != dist::Shard::none;
    dist::save_checkpoint(r.c.checkpoint_dir, *r.model, *r.opt, writes ? r.target : none, at,
                          r.world.get(), false);
  } else {
    dist::save_checkpoint(r.c.checkpoint_dir, *r.model, *r.opt, r.target, at, r.world.get(),
                          !r.dp || r.dp->replicated());
  }
  r.say("train: checkpoint at step %lld written to %s (%.2f s)\n", static_cast<long long>(at.step),
        dist::checkpoint_index(r.c.checkpoint_dir).c_str(), seconds_since(t0));
}

}  // namespace cohort::train
