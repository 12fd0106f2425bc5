// Optimizer-side kernels: AdamW (torch.optim.AdamW, single-tensor path, op for op), the squared
// L2 norm used by gradient clipping, and the in-place scale that applies the clip.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {
namespace {
// Fixed chunks for SumOfSquares: partial sums per chunk, added in chunk order, so the result
// does not depend on the thread count.
constexpr int64_t kChunk = 8192;
}  // namespace

template <typename T>
void AdamW(T* param, const T* grad, T* m, T* v, int64_t n, double lr, double beta1, double beta2,
           double eps, double weight_decay, int64_t step) {
  // Scalars are formed in double, as Python does for torch, then used in T like torch's kernels.
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T w1 = static_cast<T>(1.0 - beta1);  // lerp weight of exp_avg.lerp_(grad, 1 − β1)
  const T b2 = static_cast<T>(beta2);
  const T w2 = static_cast<T>(1.0 - beta2);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const T neg_step_size = static_cast<T>(-(lr / bias_correction1));
  const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T eps_t = static_cast<T>(eps);
  const bool lerp_from_start = w1 < T(0.5);  // torch's lerp picks its formula by the weight
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    T p = param[i];
    if (weight_decay != 0.0) p *= decay;
    T mi = m[i];
    mi = lerp_from_start ? mi + w1 * (g - mi) : g - (g - mi) * (T(1) - w1);
    const T vi = v[i] * b2 + w2 * g * g;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps_t;
    param[i] = p + neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

template <typename T>
double Sum(const T* x, int64_t n) {
  double sum = 0;  // serial, in order: the loss sum every rank computes alike
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
  return sum;
}

template <typename T>
double SumOfSquares(const T* x, int64_t n) {
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  thread_local std::vector<double> partial;
  partial.resize(n_chunks);
  double* const partials =
      partial.data();  // the caller's buffer (thread_local names differ per thread)
#pragma omp parallel for schedule(static) if (internal::WorthParallel(n))
  for (int64_t c = 0; c < n_chunks; ++c) {
    const T* p = x + c * kChunk;
    const int64_t len = std::min(kChunk, n - c * kChunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    partials[c] = s;
  }
  double total = 0;
  for (int64_t c = 0; c < n_chunks; ++c) total += partials[c];
  return total;
}

template <typename T>
void Scale(T* x, int64_t n, double s) {
  const T st = static_cast<T>(s);
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
  for (int64_t i = 0; i < n; ++i) x[i] *= st;
}

MESHRUN_INSTANTIATE_CPU_KERNELS(AdamW, Sum, SumOfSquares, Scale)

}  // namespace meshrun::cpu
