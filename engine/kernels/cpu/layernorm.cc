// LayerNorm over the last dim (eps given by the caller, 1e-5 for GPT-2) and its backward.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {
namespace {
// Rows per block of the dweight/dbias reduction. Blocks are fixed (not per thread), and their
// partial sums are added in block order, so the result is the same for any thread count.
constexpr int64_t kRowsPerBlock = 32;
constexpr int64_t kCols = 64;  // columns per task when the partials are summed
}  // namespace

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const T m = sum / static_cast<T>(C);
    // Two passes (mean, then centred squares): no cancellation when |mean| >> std.
    T sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) sq += (x[c] - m) * (x[c] - m);
    const T s = static_cast<T>(1.0 / std::sqrt(static_cast<double>(sq) / C + eps));
    T* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t N, int64_t C) {
  const int64_t n_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  // partial[b] = [dweight (C) | dbias (C)] of row block b. Kernels are called from one thread
  // per rank, so one scratch buffer per calling thread is enough.
  thread_local std::vector<T> partial;
  if (static_cast<int64_t>(partial.size()) < n_blocks * 2 * C) partial.resize(n_blocks * 2 * C);
  T* const partials = partial.data();  // the caller's buffer (thread_local names differ per thread)
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t b = 0; b < n_blocks; ++b) {
    T* pw = partials + b * 2 * C;
    T* pb = pw + C;
    std::fill(pw, pw + 2 * C, T(0));
    const int64_t i_end = std::min(N, (b + 1) * kRowsPerBlock);
    for (int64_t i = b * kRowsPerBlock; i < i_end; ++i) {
      const T* x = inp + i * C;
      const T* dy = dout + i * C;
      const T m = mean[i];
      const T s = rstd[i];
      // dnorm = dy·w; dx = s·(dnorm − mean(dnorm) − norm·mean(dnorm·norm)).
      T sum_dnorm = 0, sum_dnorm_norm = 0;
#pragma omp simd reduction(+ : sum_dnorm, sum_dnorm_norm)
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (x[c] - m) * s;
        const T dnorm = dy[c] * weight[c];
        sum_dnorm += dnorm;
        sum_dnorm_norm += dnorm * norm;
      }
      const T mean_dnorm = sum_dnorm / static_cast<T>(C);
      const T mean_dnorm_norm = sum_dnorm_norm / static_cast<T>(C);
      T* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (x[c] - m) * s;
        const T dnorm = dy[c] * weight[c];
        dx[c] += (dnorm - mean_dnorm - norm * mean_dnorm_norm) * s;
        pw[c] += norm * dy[c];
        pb[c] += dy[c];
      }
    }
  }
  // Sum the block partials in block order, parallel over column ranges.
  const int64_t n_tasks = (2 * C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(n_blocks * 2 * C))
  for (int64_t t = 0; t < n_tasks; ++t) {
    const int64_t c0 = t * kCols;
    const int64_t nc = std::min(kCols, 2 * C - c0);
    T acc[kCols] = {};
    for (int64_t b = 0; b < n_blocks; ++b) {
      const T* p = partials + b * 2 * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) acc[c] += p[c];
    }
    for (int64_t c = 0; c < nc; ++c) {
      if (c0 + c < C) {
        dweight[c0 + c] += acc[c];
      } else {
        dbias[c0 + c - C] += acc[c];
      }
    }
  }
}

MESHRUN_INSTANTIATE_CPU_KERNELS(LayerNormForward, LayerNormBackward)

}  // namespace meshrun::cpu
