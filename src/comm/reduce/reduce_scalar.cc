#define COHORT_KERNEL_NS scalar
#include "kernels.inl"

namespace cohort::comm::scalar {

template <template <typename> class Op>
void loop_f16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(Op<float>::apply(h2f(a[i]), h2f(b[i])));
}

template void loop_f16<Sum>(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template void loop_f16<Prod>(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template void loop_f16<Min>(uint16_t*, const uint16_t*, const uint16_t*, size_t);
template void loop_f16<Max>(uint16_t*, const uint16_t*, const uint16_t*, size_t);

}  // namespace cohort::comm::scalar
