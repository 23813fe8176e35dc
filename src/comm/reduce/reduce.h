// Elementwise reduction kernels, vectorised for AVX2 (runtime dispatch) with a scalar fallback.
// f16 and bf16 are computed in f32 and rounded once per call.
#pragma once

#include <cstddef>

#include "cohort/comm/types.h"

namespace cohort::comm {

// dst[i] = a[i] op b[i]; dst may alias a or b. avg reduces as sum: finish with divide().
void reduce(void* dst, const void* a, const void* b, size_t count, DataType t, RedOp op);

// x[i] /= divisor (the last step of avg).
void divide(void* x, size_t count, DataType t, int divisor);

// Which kernel set runs: "avx2" or "scalar". COHORT_NO_AVX2=1 forces scalar.
const char* reduce_isa();

}  // namespace cohort::comm
