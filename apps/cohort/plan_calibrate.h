// `cohort plan --calibrate`: this machine's compute, memory bandwidth, shared-memory link and
// decode rate, measured, as a cluster of one node with one "accelerator" per core.
#pragma once

#include "cohort/plan/plan.h"

namespace cohort::cli {

plan::Cluster calibrate_this_machine();

}  // namespace cohort::cli
