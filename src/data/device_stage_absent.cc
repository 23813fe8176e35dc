// make_device_stage in a build without the GPU parts (or the CPU-only link of a CUDA build).
#include "cohort/core/cuda.h"
#include "device_stage.h"

namespace cohort::data {

std::unique_ptr<DeviceStage> make_device_stage(const PipelineOptions& o, int) {
  COHORT_THROW("--decode " << placement_name(o.decode) << " --augment-on "
                           << placement_name(o.augment) << ": " << cuda::unavailable_reason());
}

}  // namespace cohort::data
