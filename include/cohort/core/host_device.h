// COHORT_HD marks arithmetic written once for the host and the GPU: `__host__ __device__` under
// nvcc, a plain inline function elsewhere. Kernels call such functions for all their maths, and
// host tests check the same functions against the CPU code.
#pragma once

#if defined(__CUDACC__)
#define COHORT_HD __host__ __device__ __forceinline__
#define COHORT_HD_STATIC static __host__ __device__ __forceinline__
#else
#define COHORT_HD inline
// For headers included by files compiled for other instruction sets (-mavx2): a copy per file.
#define COHORT_HD_STATIC static inline
#endif
