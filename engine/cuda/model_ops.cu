// The CUDA kernels the one model needs beyond the GPT-2 set: RMSNorm, SwiGLU, rotary
// embeddings, vocab-parallel embedding rows and cross-entropy, bias rows, the position rows, and
// the attention layouts (head split/merge, context-parallel blocks). float32 only, simple
// grid-stride kernels: light to compile, the same semantics as engine/kernels/cpu.
#include <cmath>

#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::GridFor;

constexpr int kThreads = 256;

#define MESHRUN_GRID_LOOP(i, n)                                             \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

__global__ void RMSNormForwardKernel(float* out, float* rstd, const float* inp, const float* weight,
                                     int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  const float* x = inp + i * C;
  float sq = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sq += x[c] * x[c];
  sq = BlockSum(sq, shared);
  const float s = rsqrtf(sq / static_cast<float>(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[i * C + c] = weight[c] * (x[c] * s);
  if (threadIdx.x == 0) rstd[i] = s;
}

__global__ void RMSNormBackwardKernel(float* dinp, const float* dout, const float* inp,
                                      const float* weight, const float* rstd, int64_t C) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  const float* x = inp + i * C;
  const float* dy = dout + i * C;
  const float s = rstd[i];
  float dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += weight[c] * dy[c] * x[c];
  dot = BlockSum(dot, shared);
  const float k = dot * s * s * s / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dinp[i * C + c] += s * weight[c] * dy[c] - x[c] * k;
  }
}

// dweight[c] += Σ_i dout[i,c]·x[i,c]·rstd[i], one thread per column, rows in order.
__global__ void RMSNormWeightGradKernel(float* dweight, const float* dout, const float* inp,
                                        const float* rstd, int64_t N, int64_t C) {
  MESHRUN_GRID_LOOP(c, C) {
    float sum = 0;
    for (int64_t i = 0; i < N; ++i) sum += dout[i * C + c] * inp[i * C + c] * rstd[i];
    dweight[c] += sum;
  }
}

__global__ void SwiGLUForwardKernel(float* out, const float* gate_up, int64_t N, int64_t F) {
  MESHRUN_GRID_LOOP(idx, N * F) {
    const int64_t i = idx / F, j = idx % F;
    const float x = gate_up[i * 2 * F + j], u = gate_up[i * 2 * F + F + j];
    out[idx] = x / (1.0f + expf(-x)) * u;
  }
}

__global__ void SwiGLUBackwardKernel(float* dgate_up, const float* gate_up, const float* dout,
                                     int64_t N, int64_t F) {
  MESHRUN_GRID_LOOP(idx, N * F) {
    const int64_t i = idx / F, j = idx % F;
    const float x = gate_up[i * 2 * F + j], u = gate_up[i * 2 * F + F + j];
    const float sig = 1.0f / (1.0f + expf(-x));
    const float dy = dout[idx];
    dgate_up[i * 2 * F + F + j] += dy * x * sig;
    dgate_up[i * 2 * F + j] += dy * u * sig * (1.0f + x * (1.0f - sig));
  }
}

__device__ float GeluTanhF(float x, float* derivative) {
  const float a = 0.7978845608028654f, b = 0.044715f;
  const float t = tanhf(a * (x + b * x * x * x));
  *derivative = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * a * (1.0f + 3.0f * b * x * x);
  return 0.5f * x * (1.0f + t);
}

__global__ void GeGLUForwardKernel(float* out, const float* gate_up, int64_t N, int64_t F) {
  MESHRUN_GRID_LOOP(idx, N * F) {
    const int64_t i = idx / F, j = idx % F;
    float d;
    out[idx] = GeluTanhF(gate_up[i * 2 * F + j], &d) * gate_up[i * 2 * F + F + j];
  }
}

__global__ void GeGLUBackwardKernel(float* dgate_up, const float* gate_up, const float* dout,
                                    int64_t N, int64_t F) {
  MESHRUN_GRID_LOOP(idx, N * F) {
    const int64_t i = idx / F, j = idx % F;
    const float u = gate_up[i * 2 * F + F + j];
    float d;
    const float act = GeluTanhF(gate_up[i * 2 * F + j], &d);
    const float dy = dout[idx];
    dgate_up[i * 2 * F + F + j] += dy * act;
    dgate_up[i * 2 * F + j] += dy * u * d;
  }
}

__global__ void RopeKernel(float* x, const float* cos, const float* sin, int64_t BH, int64_t Tn,
                           int64_t D, bool backward) {
  const int64_t half = D / 2;
  MESHRUN_GRID_LOOP(idx, BH * Tn * half) {
    const int64_t r = idx / half, i = idx % half, t = r % Tn;
    float* v = x + r * D;
    const float c = cos[t * half + i], s = sin[t * half + i];
    const float a = v[i], b = v[i + half];
    if (!backward) {
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    } else {
      v[i] = a * c + b * s;
      v[i + half] = b * c - a * s;
    }
  }
}

__global__ void EmbeddingRowsForwardKernel(float* out, const int32_t* idx, const float* table,
                                           int64_t first, int64_t rows, int64_t N, int64_t C) {
  MESHRUN_GRID_LOOP(e, N * C) {
    const int64_t i = e / C, c = e % C;
    const int64_t r = static_cast<int64_t>(idx[i]) - first;
    out[e] = (r >= 0 && r < rows) ? table[r * C + c] : 0.0f;
  }
}

__global__ void EmbeddingRowsBackwardKernel(float* dtable, const float* dout, const int32_t* idx,
                                            int64_t first, int64_t rows, int64_t N, int64_t C) {
  MESHRUN_GRID_LOOP(e, N * C) {
    const int64_t i = e / C, c = e % C;
    const int64_t r = static_cast<int64_t>(idx[i]) - first;
    if (r >= 0 && r < rows) atomicAdd(dtable + r * C + c, dout[e]);
  }
}

__global__ void AddRowsKernel(float* x, const float* table, const int32_t* idx, int64_t N,
                              int64_t C) {
  MESHRUN_GRID_LOOP(e, N * C) {
    const int64_t i = e / C, c = e % C;
    x[e] += table[static_cast<int64_t>(idx[i]) * C + c];
  }
}

__global__ void AddBiasKernel(float* out, const float* bias, int64_t N, int64_t C) {
  MESHRUN_GRID_LOOP(e, N * C) {
    out[e] += bias[e % C];
  }
}

// One block per row: {log-sum-exp of the row, the target's logit or 0}.
__global__ void VocabShardStatsKernel(float* stats, const float* logits, const int32_t* targets,
                                      int64_t first, int64_t V) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  const float* l = logits + i * V;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
  m = BlockMax(m, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - m);
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) {
    stats[2 * i] = V > 0 ? m + logf(sum) : m;
    const int64_t t = static_cast<int64_t>(targets[i]) - first;
    stats[2 * i + 1] = (t >= 0 && t < V) ? l[t] : 0.0f;
  }
}

__global__ void VocabShardLossKernel(float* losses, float* lse, const float* all_stats,
                                     const int32_t* targets, int64_t shards, int64_t N) {
  MESHRUN_GRID_LOOP(i, N) {
    float m = -INFINITY;
    for (int64_t s = 0; s < shards; ++s) m = fmaxf(m, all_stats[(s * N + i) * 2]);
    double sum = 0, target = 0;
    for (int64_t s = 0; s < shards; ++s) {
      const float l = all_stats[(s * N + i) * 2];
      if (l != -INFINITY) sum += exp(static_cast<double>(l - m));
      target += static_cast<double>(all_stats[(s * N + i) * 2 + 1]);
    }
    const double total = static_cast<double>(m) + log(sum);
    lse[i] = static_cast<float>(total);
    // A negative target (kIgnoreTarget) is ignored: no loss (and VocabShardGrad: no gradient).
    losses[i] = targets[i] < 0 ? 0.0f : static_cast<float>(total - target);
  }
}

__global__ void VocabShardGradKernel(float* dlogits, const float* logits, const float* lse,
                                     const int32_t* targets, int64_t first, int64_t N, int64_t V,
                                     float grad_scale) {
  MESHRUN_GRID_LOOP(e, N * V) {
    const int64_t i = e / V, j = e % V;
    if (targets[i] < 0) {
      dlogits[e] = 0.0f;
      continue;
    }
    float d = grad_scale * expf(logits[e] - lse[i]);
    if (static_cast<int64_t>(targets[i]) - first == j) d -= grad_scale;
    dlogits[e] = d;
  }
}

// One thread per (b, t, h, d) of the query heads: q[b,h,t,d] and the kv head it reads.
__global__ void SplitHeadsKernel(float* q, float* k, float* v, const float* qkv, int64_t B,
                                 int64_t Tn, int64_t H, int64_t K, int64_t D) {
  const int64_t W = (H + 2 * K) * D, group = H / K;
  MESHRUN_GRID_LOOP(e, B * Tn * H * D) {
    const int64_t d = e % D, h = (e / D) % H, t = (e / (D * H)) % Tn, b = e / (D * H * Tn);
    const float* row = qkv + (b * Tn + t) * W;
    const int64_t dst = ((b * H + h) * Tn + t) * D + d, kv = h / group;
    q[dst] = row[h * D + d];
    k[dst] = row[(H + kv) * D + d];
    v[dst] = row[(H + K + kv) * D + d];
  }
}

// One thread per element of the dqkv row: q part copied, k/v parts summed over the query
// heads of their group (in head order).
__global__ void MergeQkvGradsKernel(float* dqkv, const float* dq, const float* dk, const float* dv,
                                    int64_t B, int64_t Tn, int64_t H, int64_t K, int64_t D) {
  const int64_t W = (H + 2 * K) * D, group = H / K;
  MESHRUN_GRID_LOOP(e, B * Tn * W) {
    const int64_t w = e % W, bt = e / W, t = bt % Tn, b = bt / Tn;
    const int64_t col = w / D, d = w % D;
    auto at = [&](int64_t h) { return ((b * H + h) * Tn + t) * D + d; };
    float out = 0;
    if (col < H) {
      out = dq[at(col)];
    } else {
      const bool is_k = col < H + K;
      const int64_t kv = is_k ? col - H : col - H - K;
      const float* src = is_k ? dk : dv;
      for (int64_t h = kv * group; h < (kv + 1) * group; ++h) out += src[at(h)];
    }
    dqkv[e] = out;
  }
}

__global__ void TransposeHeadsKernel(float* rows, float* heads, int64_t B, int64_t Tn, int64_t H,
                                     int64_t D, bool to_rows) {
  MESHRUN_GRID_LOOP(e, B * Tn * H * D) {
    const int64_t d = e % D, h = (e / D) % H, t = (e / (D * H)) % Tn, b = e / (D * H * Tn);
    const int64_t x = ((b * H + h) * Tn + t) * D + d;
    if (to_rows) {
      rows[e] = heads[x];
    } else {
      heads[x] = rows[e];
    }
  }
}

__global__ void BlocksKernel(float* blocks, float* seq, int64_t n, int64_t BH, int64_t Tl,
                             int64_t D, bool to_seq) {
  MESHRUN_GRID_LOOP(e, n * BH * Tl * D) {
    const int64_t within = e % (Tl * D), bh = (e / (Tl * D)) % BH, j = e / (Tl * D * BH);
    const int64_t s = (bh * n * Tl + j * Tl) * D + within;
    if (to_seq) {
      seq[s] = blocks[e];
    } else {
      blocks[e] = seq[s];
    }
  }
}

unsigned Grid(int64_t n) {
  return GridFor(n, kThreads);
}

}  // namespace

template <>
Status RMSNormForward<float>(CudaContext& ctx, float* out, float* rstd, const float* inp,
                             const float* weight, int64_t N, int64_t C, double eps) {
  if (N == 0) return OkStatus();
  RMSNormForwardKernel<<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(
      out, rstd, inp, weight, C, static_cast<float>(eps));
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status RMSNormBackward<float>(CudaContext& ctx, float* dinp, float* dweight, const float* dout,
                              const float* inp, const float* weight, const float* rstd, int64_t N,
                              int64_t C) {
  if (N == 0) return OkStatus();
  RMSNormBackwardKernel<<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(dinp, dout, inp,
                                                                                 weight, rstd, C);
  MESHRUN_GPU_TRY_LAUNCH();
  RMSNormWeightGradKernel<<<Grid(C), kThreads, 0, ctx.stream()>>>(dweight, dout, inp, rstd, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status SwiGLUForward<float>(CudaContext& ctx, float* out, const float* gate_up, int64_t N,
                            int64_t F) {
  if (N * F == 0) return OkStatus();
  SwiGLUForwardKernel<<<Grid(N * F), kThreads, 0, ctx.stream()>>>(out, gate_up, N, F);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status SwiGLUBackward<float>(CudaContext& ctx, float* dgate_up, const float* gate_up,
                             const float* dout, int64_t N, int64_t F) {
  if (N * F == 0) return OkStatus();
  SwiGLUBackwardKernel<<<Grid(N * F), kThreads, 0, ctx.stream()>>>(dgate_up, gate_up, dout, N, F);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status GeGLUForward<float>(CudaContext& ctx, float* out, const float* gate_up, int64_t N,
                           int64_t F) {
  if (N * F == 0) return OkStatus();
  GeGLUForwardKernel<<<Grid(N * F), kThreads, 0, ctx.stream()>>>(out, gate_up, N, F);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status GeGLUBackward<float>(CudaContext& ctx, float* dgate_up, const float* gate_up,
                            const float* dout, int64_t N, int64_t F) {
  if (N * F == 0) return OkStatus();
  GeGLUBackwardKernel<<<Grid(N * F), kThreads, 0, ctx.stream()>>>(dgate_up, gate_up, dout, N, F);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status RopeForward<float>(CudaContext& ctx, float* x, const float* cos, const float* sin,
                          int64_t BH, int64_t Tn, int64_t D) {
  if (BH * Tn * D == 0) return OkStatus();
  RopeKernel<<<Grid(BH * Tn * (D / 2)), kThreads, 0, ctx.stream()>>>(x, cos, sin, BH, Tn, D, false);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status RopeBackward<float>(CudaContext& ctx, float* dx, const float* cos, const float* sin,
                           int64_t BH, int64_t Tn, int64_t D) {
  if (BH * Tn * D == 0) return OkStatus();
  RopeKernel<<<Grid(BH * Tn * (D / 2)), kThreads, 0, ctx.stream()>>>(dx, cos, sin, BH, Tn, D, true);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status EmbeddingRowsForward<float>(CudaContext& ctx, float* out, const int32_t* idx,
                                   const float* table, int64_t first, int64_t rows, int64_t N,
                                   int64_t C) {
  if (N * C == 0) return OkStatus();
  EmbeddingRowsForwardKernel<<<Grid(N * C), kThreads, 0, ctx.stream()>>>(out, idx, table, first,
                                                                         rows, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status EmbeddingRowsBackward<float>(CudaContext& ctx, float* dtable, const float* dout,
                                    const int32_t* idx, int64_t first, int64_t rows, int64_t N,
                                    int64_t C) {
  if (N * C == 0) return OkStatus();
  EmbeddingRowsBackwardKernel<<<Grid(N * C), kThreads, 0, ctx.stream()>>>(dtable, dout, idx, first,
                                                                          rows, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status AddRows<float>(CudaContext& ctx, float* x, const float* table, const int32_t* idx, int64_t N,
                      int64_t C) {
  if (N * C == 0) return OkStatus();
  AddRowsKernel<<<Grid(N * C), kThreads, 0, ctx.stream()>>>(x, table, idx, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status AddBias<float>(CudaContext& ctx, float* out, const float* bias, int64_t N, int64_t C) {
  if (N * C == 0) return OkStatus();
  AddBiasKernel<<<Grid(N * C), kThreads, 0, ctx.stream()>>>(out, bias, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status VocabShardStats<float>(CudaContext& ctx, float* stats, const float* logits,
                              const int32_t* targets, int64_t first, int64_t N, int64_t V) {
  if (N == 0) return OkStatus();
  VocabShardStatsKernel<<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(stats, logits,
                                                                                 targets, first, V);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status VocabShardLoss<float>(CudaContext& ctx, float* losses, float* lse, const float* all_stats,
                             const int32_t* targets, int64_t shards, int64_t N) {
  if (N == 0) return OkStatus();
  VocabShardLossKernel<<<Grid(N), kThreads, 0, ctx.stream()>>>(losses, lse, all_stats, targets,
                                                               shards, N);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status VocabShardGrad<float>(CudaContext& ctx, float* dlogits, const float* logits,
                             const float* lse, const int32_t* targets, int64_t first, int64_t N,
                             int64_t V, float grad_scale) {
  if (N * V == 0) return OkStatus();
  VocabShardGradKernel<<<Grid(N * V), kThreads, 0, ctx.stream()>>>(dlogits, logits, lse, targets,
                                                                   first, N, V, grad_scale);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status SplitHeads<float>(CudaContext& ctx, float* q, float* k, float* v, const float* qkv,
                         int64_t B, int64_t Tn, int64_t H, int64_t K, int64_t D) {
  const int64_t n = B * Tn * H * D;
  if (n == 0) return OkStatus();
  SplitHeadsKernel<<<Grid(n), kThreads, 0, ctx.stream()>>>(q, k, v, qkv, B, Tn, H, K, D);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status MergeQkvGrads<float>(CudaContext& ctx, float* dqkv, const float* dq, const float* dk,
                            const float* dv, int64_t B, int64_t Tn, int64_t H, int64_t K,
                            int64_t D) {
  const int64_t n = B * Tn * (H + 2 * K) * D;
  if (n == 0) return OkStatus();
  MergeQkvGradsKernel<<<Grid(n), kThreads, 0, ctx.stream()>>>(dqkv, dq, dk, dv, B, Tn, H, K, D);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status HeadsToRows<float>(CudaContext& ctx, float* rows, const float* heads, int64_t B, int64_t Tn,
                          int64_t H, int64_t D) {
  const int64_t n = B * Tn * H * D;
  if (n == 0) return OkStatus();
  TransposeHeadsKernel<<<Grid(n), kThreads, 0, ctx.stream()>>>(rows, const_cast<float*>(heads), B,
                                                               Tn, H, D, true);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status RowsToHeads<float>(CudaContext& ctx, float* heads, const float* rows, int64_t B, int64_t Tn,
                          int64_t H, int64_t D) {
  const int64_t n = B * Tn * H * D;
  if (n == 0) return OkStatus();
  TransposeHeadsKernel<<<Grid(n), kThreads, 0, ctx.stream()>>>(const_cast<float*>(rows), heads, B,
                                                               Tn, H, D, false);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status BlocksToSequence<float>(CudaContext& ctx, float* seq, const float* blocks, int64_t n,
                               int64_t BH, int64_t Tl, int64_t D) {
  const int64_t total = n * BH * Tl * D;
  if (total == 0) return OkStatus();
  BlocksKernel<<<Grid(total), kThreads, 0, ctx.stream()>>>(const_cast<float*>(blocks), seq, n, BH,
                                                           Tl, D, true);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <>
Status SequenceToBlocks<float>(CudaContext& ctx, float* blocks, const float* seq, int64_t n,
                               int64_t BH, int64_t Tl, int64_t D) {
  const int64_t total = n * BH * Tl * D;
  if (total == 0) return OkStatus();
  BlocksKernel<<<Grid(total), kThreads, 0, ctx.stream()>>>(blocks, const_cast<float*>(seq), n, BH,
                                                           Tl, D, false);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

}  // namespace meshrun::gpu
