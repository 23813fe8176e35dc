// Checkpoints: the model's parameters and buffers, the optimiser's state, and where the run is
// (step, epoch, global sample position in the epoch), in one safetensors file whose data
// section carries a CRC-32C in its metadata. A new checkpoint is written to a temporary name,
// fsynced, read back and checked, and only then renamed over the previous one: a crash or a
// full disk at any point leaves the previous checkpoint whole. Randomness needs no state:
// every draw is keyed on (seed, epoch, sample), so position and seed restore it.
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
};

// Writes DIR/checkpoint.safetensors (DIR is created).
void save_checkpoint(const std::string& dir, const nn::Model& m, nn::Optimizer& opt,
                     const RunPosition& pos);
// Restores into m and opt; errors name the file and what does not match (model, shapes, CRC).
RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt);
std::string checkpoint_path(const std::string& dir);
// Resume on every rank of `world` (null: this process alone): rank 0 reads the checkpoint (no
// shared file system needed) and broadcasts the position, parameters, buffers and optimiser
// state, so that every rank starts as rank 0 left off.
RunPosition resume_from_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt,
                                   comm::Communicator* world);

}  // namespace cohort::dist
