// Fused softmax + cross-entropy over the vocabulary, with its gradient written in place.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/kernels/cpu/simd.h"

namespace meshrun::cpu {

template <typename T>
void SoftmaxCrossEntropy(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                         int64_t V, double grad_scale_arg) {
  const T grad_scale = static_cast<T>(grad_scale_arg);
  // No __restrict anywhere: dlogits may be logits. Each element is read before it is written
  // at the same index, which is safe for the vectorized loops too.
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * V))
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * V;
    const int64_t target = targets[i];
    if (target < 0) {
      // An ignored target (kIgnoreTarget, as transformers' -100): no loss and no gradient.
      losses[i] = T(0);
      if (dlogits != nullptr) std::fill(dlogits + i * V, dlogits + (i + 1) * V, T(0));
      continue;
    }
    if constexpr (sizeof(T) == sizeof(float)) {
      // simd.h (AVX2 when the CPU has it). The row (200 KB at V = 50,257) stays in L2 across
      // the three passes, so memory sees one read and one write of it.
      const float mx = simd::RowMax(x, V);
      const float x_target = x[target];
      float sum;
      if (dlogits == nullptr) {
        thread_local std::vector<float> row;
        row.resize(V);
        sum = simd::ExpShiftSum(row.data(), x, V, mx);
      } else {
        T* d = dlogits + i * V;
        sum = simd::ExpShiftSum(d, x, V, mx);
        simd::ScaleRow(d, V, grad_scale / sum);
        d[target] -= grad_scale;
      }
      losses[i] = std::log(sum) + mx - x_target;
      continue;
    }
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    const T x_target = x[target];
    T sum = 0;
    if (dlogits == nullptr) {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += internal::Exp(x[j] - mx);
    } else {
      T* d = dlogits + i * V;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        const T e = internal::Exp(x[j] - mx);
        d[j] = e;
        sum += e;
      }
      const T s = grad_scale / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] *= s;
      d[target] -= grad_scale;
    }
    // −log softmax = log Σ e^{x−max} + max − x_target.
    losses[i] = static_cast<T>(std::log(sum)) + mx - x_target;
  }
}

MESHRUN_INSTANTIATE_CPU_KERNELS(SoftmaxCrossEntropy)

}  // namespace meshrun::cpu
