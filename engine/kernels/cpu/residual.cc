// Residual add and the in-place accumulate that serves as its backward (and as gradient
// accumulation everywhere else).
#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void Accumulate(T* dst, const T* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

template void ResidualForward<float>(float*, const float*, const float*, int64_t);
template void ResidualForward<double>(double*, const double*, const double*, int64_t);
template void Accumulate<float>(float*, const float*, int64_t);
template void Accumulate<double>(double*, const double*, int64_t);

}  // namespace meshrun::cpu
