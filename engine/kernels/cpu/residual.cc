// Fill, the residual add and the in-place accumulate that serves as its backward (and as gradient
// accumulation everywhere else).
#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {

template <typename T>
void Fill(T* dst, double value, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(value);
}

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

MESHRUN_INSTANTIATE_CPU_KERNELS(Fill, ResidualForward, Accumulate)

}  // namespace meshrun::cpu
