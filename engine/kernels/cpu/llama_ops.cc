// The ops of the Llama family (RMSNorm, SwiGLU, rotary embeddings) and the vocab-parallel pieces
// of the embedding and the head (Megatron's parallel cross-entropy), forward and backward.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {
namespace {
constexpr int64_t kRowsPerBlock = 32;  // rows per block of the dweight reduction (fixed order)
}  // namespace

template <typename T>
void RMSNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                    double eps) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(x[c]) * x[c];
    const T s = static_cast<T>(1.0 / std::sqrt(sq / C + eps));
    T* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = weight[c] * (x[c] * s);
    rstd[i] = s;
  }
}

template <typename T>
void RMSNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int64_t N, int64_t C) {
  const int64_t n_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  thread_local std::vector<T> partial;
  if (static_cast<int64_t>(partial.size()) < n_blocks * C) partial.resize(n_blocks * C);
  T* const partials = partial.data();
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t b = 0; b < n_blocks; ++b) {
    T* pw = partials + b * C;
    std::fill(pw, pw + C, T(0));
    const int64_t i_end = std::min(N, (b + 1) * kRowsPerBlock);
    for (int64_t i = b * kRowsPerBlock; i < i_end; ++i) {
      const T* x = inp + i * C;
      const T* dy = dout + i * C;
      const T s = rstd[i];
      // y = w·x·s, s = (mean(x²) + eps)^(-1/2): dx = s·(w·dy) − x·s³·mean(w·dy·x).
      T dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += weight[c] * dy[c] * x[c];
      const T k = dot * s * s * s / static_cast<T>(C);
      T* dx = dinp + i * C;
      for (int64_t c = 0; c < C; ++c) {
        dx[c] += s * weight[c] * dy[c] - x[c] * k;
        pw[c] += dy[c] * x[c] * s;
      }
    }
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const T* pw = partials + b * C;
    for (int64_t c = 0; c < C; ++c) dweight[c] += pw[c];
  }
}

template <typename T>
void SwiGLUForward(T* out, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * F))
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    T* o = out + i * F;
    for (int64_t j = 0; j < F; ++j) {
      const T x = g[j];
      const T sig = T(1) / (T(1) + std::exp(-x));
      o[j] = x * sig * u[j];
    }
  }
}

template <typename T>
void SwiGLUBackward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * F))
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    const T* dy = dout + i * F;
    T* dg = dgate_up + i * 2 * F;
    T* du = dg + F;
    for (int64_t j = 0; j < F; ++j) {
      const T x = g[j];
      const T sig = T(1) / (T(1) + std::exp(-x));
      const T silu = x * sig;
      du[j] += dy[j] * silu;
      dg[j] += dy[j] * u[j] * sig * (T(1) + x * (T(1) - sig));
    }
  }
}

// gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))) and its derivative, in double.
inline double GeluTanh(double x, double* derivative) {
  constexpr double kA = 0.7978845608028654, kB = 0.044715;
  const double t = std::tanh(kA * (x + kB * x * x * x));
  *derivative = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kA * (1 + 3 * kB * x * x);
  return 0.5 * x * (1 + t);
}

template <typename T>
void GeGLUForward(T* out, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * F))
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    T* o = out + i * F;
    for (int64_t j = 0; j < F; ++j) {
      double d;
      o[j] = static_cast<T>(GeluTanh(g[j], &d)) * u[j];
    }
  }
}

template <typename T>
void GeGLUBackward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * F))
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    const T* dy = dout + i * F;
    T* dg = dgate_up + i * 2 * F;
    T* du = dg + F;
    for (int64_t j = 0; j < F; ++j) {
      double d;
      const T act = static_cast<T>(GeluTanh(g[j], &d));
      du[j] += dy[j] * act;
      dg[j] += dy[j] * u[j] * static_cast<T>(d);
    }
  }
}

template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int64_t BH, int64_t Tn, int64_t D) {
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(BH * Tn * D))
  for (int64_t r = 0; r < BH * Tn; ++r) {
    T* v = x + r * D;
    const int64_t t = r % Tn;
    const T* c = cos + t * half;
    const T* s = sin + t * half;
    for (int64_t i = 0; i < half; ++i) {
      const T a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int64_t BH, int64_t Tn, int64_t D) {
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(BH * Tn * D))
  for (int64_t r = 0; r < BH * Tn; ++r) {
    T* v = dx + r * D;
    const int64_t t = r % Tn;
    const T* c = cos + t * half;
    const T* s = sin + t * half;
    for (int64_t i = 0; i < half; ++i) {
      const T a = v[i], b = v[i + half];  // the gradients of the rotated pair
      v[i] = a * c[i] + b * s[i];
      v[i + half] = b * c[i] - a * s[i];
    }
  }
}

template <typename T>
void EmbeddingRowsForward(T* out, const int32_t* tokens, const T* table, int64_t first,
                          int64_t rows, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = static_cast<int64_t>(tokens[i]) - first;
    T* o = out + i * C;
    if (r >= 0 && r < rows) {
      std::copy(table + r * C, table + (r + 1) * C, o);
    } else {
      std::fill(o, o + C, T(0));
    }
  }
}

template <typename T>
void EmbeddingRowsBackward(T* dtable, const T* dout, const int32_t* tokens, int64_t first,
                           int64_t rows, int64_t N, int64_t C) {
  // Columns split over threads: every row of dtable is written by one thread per column block,
  // in token order (deterministic).
  constexpr int64_t kCols = 64;
  const int64_t n_col_blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t cb = 0; cb < n_col_blocks; ++cb) {
    const int64_t c0 = cb * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t r = static_cast<int64_t>(tokens[i]) - first;
      if (r < 0 || r >= rows) continue;
      T* d = dtable + r * C;
      const T* g = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

template <typename T>
void VocabShardStats(T* stats, const T* logits, const int32_t* targets, int64_t first, int64_t N,
                     int64_t V) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * V))
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, l[j]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(l[j] - m));
    stats[2 * i] = V > 0 ? static_cast<T>(m + std::log(sum)) : m;
    const int64_t t = static_cast<int64_t>(targets[i]) - first;
    stats[2 * i + 1] = (t >= 0 && t < V) ? l[t] : T(0);
  }
}

template <typename T>
void VocabShardLoss(T* losses, T* lse, const T* all_stats, const int32_t* targets, int64_t shards,
                    int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t s = 0; s < shards; ++s) m = std::max(m, all_stats[(s * N + i) * 2]);
    double sum = 0, target = 0;
    for (int64_t s = 0; s < shards; ++s) {
      const T l = all_stats[(s * N + i) * 2];
      if (l != -std::numeric_limits<T>::infinity()) sum += std::exp(static_cast<double>(l - m));
      target += static_cast<double>(all_stats[(s * N + i) * 2 + 1]);
    }
    const double total = static_cast<double>(m) + std::log(sum);
    lse[i] = static_cast<T>(total);
    losses[i] = targets[i] < 0 ? T(0) : static_cast<T>(total - target);
  }
}

template <typename T>
void VocabShardGrad(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                    int64_t first, int64_t N, int64_t V, double grad_scale_arg) {
  const T grad_scale = static_cast<T>(grad_scale_arg);
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * V))
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    T* d = dlogits + i * V;
    const T z = lse[i];
    if (targets[i] < 0) {  // ignored: no gradient
      for (int64_t j = 0; j < V; ++j) d[j] = T(0);
      continue;
    }
    for (int64_t j = 0; j < V; ++j) d[j] = grad_scale * std::exp(l[j] - z);
    const int64_t t = static_cast<int64_t>(targets[i]) - first;
    if (t >= 0 && t < V) d[t] -= grad_scale;
  }
}

MESHRUN_INSTANTIATE_CPU_KERNELS(RMSNormForward, RMSNormBackward, SwiGLUForward, SwiGLUBackward,
                                GeGLUForward, GeGLUBackward, RopeForward, RopeBackward,
                                EmbeddingRowsForward, EmbeddingRowsBackward, VocabShardStats,
                                VocabShardLoss, VocabShardGrad)

}  // namespace meshrun::cpu
