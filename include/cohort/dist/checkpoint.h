// Checkpoints that survive crashes and reshard. A checkpoint is a directory:
//   DIR/checkpoint.json                   the index, written last
//   DIR/step-<step>-<id>/rank-<r>.safetensors   each writing rank's pieces
// A rank's file holds the pieces of the parameters its optimiser updates and their optimiser
// state, named "model.<param>[lo:hi]" and "optim.<state>.<param>[lo:hi]" (elements lo..hi of the
// flattened parameter), and rank 0's also the buffers ("buffer.<name>"); under DDP rank 0 alone
// writes, everything. Each file is written to a temporary name, fsynced, read back and checked
// against its CRC-32C, then renamed; once every rank has written, rank 0 replaces the index
// (atomically, with each file's CRC) and only then removes the older step directories. A crash
// or a full disk at any point leaves the previous checkpoint whole. No shared file system is
// assumed: when the ranks span hosts, each file is also kept on the next host (unless that host
// already sees it), and each host's first rank writes the index into its own DIR; before a
// resume, share_checkpoint gives every host the files it lacks. Loading reads the index and
// every file and copies the overlap of each saved piece with each piece this rank needs, so a
// checkpoint loads at any world size and under any mode. Randomness needs no state: every draw
// is keyed on (seed, epoch, sample), so position and seed restore it.
#pragma once

#include <cstdint>
#include <string>

#include "cohort/comm/communicator.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"

namespace cohort::dist {

struct RunPosition {
  int64_t step = 0;       // optimiser steps taken
  int64_t epoch = 0;      // the epoch the next step belongs to
  uint64_t position = 0;  // global samples of that epoch already consumed (all ranks)
  uint64_t seed = 0;
  int world = 1;
  std::string mode = "none";  // the --shard mode that wrote it
  int64_t global_batch = 0;   // samples per step of the run that wrote it (0: not recorded)
};

// Collective over `world` (null: this process alone). `t` is what this rank's optimiser
// updates; replicated: every rank holds all of it (DDP), so rank 0 alone writes.
void save_checkpoint(const std::string& dir, const nn::Model& m, nn::Optimizer& opt,
                     const nn::OptimTarget& t, const RunPosition& pos, comm::Communicator* world,
                     bool replicated);
// Restores the pieces of `t` (values and, with opt, its state), the buffers and the optimiser's
// step count. Errors name the file and what does not match (model, piece, CRC).
RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer* opt,
                            const nn::OptimTarget& t);
// One process, the whole model.
void save_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt,
                     const RunPosition& pos);
RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt);

std::string checkpoint_index(const std::string& dir);  // DIR/checkpoint.json

// Collective over `world` (null: this process alone): makes this host's DIR hold the newest
// checkpoint any rank's DIR holds, fetching from other hosts the files it lacks (a host that
// came back with an empty disk, or one whose peer host is gone), checked against the index's
// CRCs. A file that no host holds is an error naming it.
struct SharedCheckpoint {
  bool found = false;  // DIR now holds a checkpoint
  int64_t step = 0;
  int files_passed = 0;  // files some host lacked, passed between hosts
  uint64_t bytes_passed = 0;
};
SharedCheckpoint share_checkpoint(const std::string& dir, comm::Communicator* world);
// The position alone, from the index (a restarted run decides its accumulation from it).
RunPosition read_checkpoint_position(const std::string& dir);
// `cohort checkpoint inspect`: step, world, mode, files, and every tensor with its size.
std::string describe_checkpoint(const std::string& dir);
// `cohort checkpoint consolidate`: the whole model's weights under torchvision's names.
void consolidate_checkpoint(const std::string& dir, const std::string& out);

}  // namespace cohort::dist
