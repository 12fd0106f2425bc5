// Token + position embedding lookup and its scatter-add backward.
#include <algorithm>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {
namespace {
// Columns per task of the backward: tasks own disjoint column ranges of dwte/dwpe, so rows that
// share a token need no atomics and are added in row order (deterministic for any thread count).
constexpr int64_t kCols = 64;
}  // namespace

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                      const T* wpe, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t i = 0; i < N; ++i) {
    const T* te = wte + static_cast<int64_t>(tokens[i]) * C;
    const T* pe = wpe + static_cast<int64_t>(positions[i]) * C;
    T* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = te[c] + pe[c];
  }
}

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                       const int32_t* positions, int64_t N, int64_t C) {
  const int64_t n_tasks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t t = 0; t < n_tasks; ++t) {
    const int64_t c0 = t * kCols;
    const int64_t nc = std::min(kCols, C - c0);
    for (int64_t i = 0; i < N; ++i) {
      const T* d = dout + i * C + c0;
      T* gt = dwte + static_cast<int64_t>(tokens[i]) * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) gt[c] += d[c];
      if (dwpe != nullptr) {
        T* gp = dwpe + static_cast<int64_t>(positions[i]) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) gp[c] += d[c];
      }
    }
  }
}

#define MESHRUN_INSTANTIATE(T)                                                                  \
  template void EmbeddingForward<T>(T*, const int32_t*, const int32_t*, const T*, const T*,     \
                                    int64_t, int64_t);                                          \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, const int32_t*, int64_t, \
                                     int64_t);
MESHRUN_INSTANTIATE(MESHRUN_ELEMENT_TYPE)  // float; double in the float64 twin (element_type.h)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::cpu
