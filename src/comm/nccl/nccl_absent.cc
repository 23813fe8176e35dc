// COHORT_BACKEND=nccl in a build without NCCL (no CUDA, or the CPU-only link of a CUDA build).
#include "cohort/comm/communicator.h"
#include "cohort/core/error.h"
#include "settings.h"

namespace cohort::comm {

std::shared_ptr<Communicator> make_nccl_communicator(const JobEnv& env, const detail::Settings&) {
  COHORT_THROW_AS(CommError, "COHORT_BACKEND=nccl: rank "
                                 << env.rank
                                 << ": this build of Cohort has no NCCL (it is built with the GPU "
                                    "parts, where CUDA and NCCL are found)");
}

}  // namespace cohort::comm
