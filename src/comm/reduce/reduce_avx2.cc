// Compiled with -mavx2 -mfma -mf16c; only called after a runtime CPU check.
#include <immintrin.h>

#define COHORT_KERNEL_NS avx2
#include "kernels.inl"

namespace cohort::comm::avx2 {

namespace {
template <template <typename> class Op>
__m256 apply8(__m256 a, __m256 b);
template <>
__m256 apply8<Sum>(__m256 a, __m256 b) {
  return _mm256_add_ps(a, b);
}
template <>
__m256 apply8<Prod>(__m256 a, __m256 b) {
  return _mm256_mul_ps(a, b);
}
template <>
__m256 apply8<Min>(__m256 a, __m256 b) {
  return _mm256_min_ps(b, a);
}
template <>
__m256 apply8<Max>(__m256 a, __m256 b) {
  return _mm256_max_ps(b, a);
}
}  // namespace

template <template <typename> class Op>
void loop_f16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(apply8<Op>(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = f32_to_f16(Op<float>::apply(h2f(a[i]), h2f(b[i])));
}

template void loop_f16<Sum>(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template void loop_f16<Prod>(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template void loop_f16<Min>(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template void loop_f16<Max>(uint16_t*, const uint16_t*, const uint16_t*, size_t);

}  // namespace cohort::comm::avx2
