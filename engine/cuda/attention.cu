// Causal attention with online softmax (flash-attention style): the entry points, the float32
// CUDA-core kernels that serve any head size (and float32 training), the backward's row
// dot-products and the log-sum-exp merge. The bf16 tensor-core kernels are in attention_tc.cu.
//
// Generic kernels: one thread per query row (forward, dq) or key row (dk/dv); the row and its
// accumulator live in shared memory, K/V (or Q/dO) tiles are staged through shared memory and
// every score block lives in registers. A tile nobody in the block can see (by position, and by
// the queries' lower bounds q_lo: sliding windows, documents) is skipped, so a causal sequence
// does about half the work and a windowed one only the tiles near the diagonal.
#include <climits>
#include <cmath>
#include <string>
#include <type_traits>

#include "engine/cuda/attention_internal.h"
#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::AttentionShape;
using internal::CeilDiv;
using internal::FromFloat;
using internal::Strides;
using internal::ToFloat;
using internal::WarpSum;

constexpr int kTile = 32;  // keys (forward, dq) or queries (dk/dv) per staged tile
constexpr int64_t kMaxGenericD = 256;

int RowsPerBlock(int64_t D) {
  return D <= 64 ? 64 : 32;
}

__device__ __forceinline__ int64_t At(const Strides& s, int64_t b, int64_t h, int64_t t) {
  return b * s.batch + h * s.head + t * s.token;
}

template <typename T>
__global__ void ForwardKernel(T* out, float* lse, const T* q, const T* k, const T* v,
                              const int32_t* q_pos, const int32_t* k_pos, AttentionShape s) {
  extern __shared__ float smem[];
  const int R = blockDim.x;
  const int64_t D = s.D, Dp = D + 1;
  float* qs = smem;                                  // [R][D+1]
  float* os = qs + R * Dp;                           // [R][D+1]
  float* ks = os + R * Dp;                           // [kTile][D]
  float* vs = ks + kTile * D;                        // [kTile][D]
  int* kp = reinterpret_cast<int*>(vs + kTile * D);  // [kTile]
  __shared__ int q_max, lo_min;

  const int64_t bh = blockIdx.y, b = bh / s.H, h = bh % s.H;
  const int tid = threadIdx.x;
  const int64_t i = blockIdx.x * int64_t{R} + tid;
  const bool valid = i < s.Tq;
  const int qp = valid ? q_pos[i] : INT_MIN;
  const int lo = valid ? QueryLow(s, b, i) : INT_MAX;
  if (tid == 0) {
    q_max = INT_MIN;
    lo_min = INT_MAX;
  }
  float* qrow = qs + tid * Dp;
  float* orow = os + tid * Dp;
  for (int64_t d = 0; d < D; ++d) {
    qrow[d] = valid ? ToFloat(q[At(s.q, b, h, i) + d]) : 0.0f;
    orow[d] = 0.0f;
  }
  __syncthreads();
  atomicMax(&q_max, qp);
  atomicMin(&lo_min, lo);

  float m = -INFINITY, l = 0.0f;
  for (int64_t k0 = 0; k0 < s.Tk; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed; q_max is final
    bool seen = false;
    if (tid < kTile) {
      const int64_t kj = k0 + tid;
      kp[tid] = kj < s.Tk ? k_pos[kj] : INT_MAX;
      seen = kj < s.Tk && kp[tid] <= q_max && kp[tid] >= lo_min;
    }
    if (!__syncthreads_or(seen)) continue;  // no row of the block sees a key of this tile
    for (int64_t e = tid; e < kTile * D; e += R) {
      const int64_t j = e / D, d = e % D, kj = k0 + j;
      ks[e] = kj < s.Tk ? ToFloat(k[At(s.k, b, h, kj) + d]) : 0.0f;
      vs[e] = kj < s.Tk ? ToFloat(v[At(s.v, b, h, kj) + d]) : 0.0f;
    }
    __syncthreads();

    float sc[kTile];
#pragma unroll
    for (int j = 0; j < kTile; ++j) sc[j] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float qd = qrow[d];
#pragma unroll
      for (int j = 0; j < kTile; ++j) sc[j] += qd * ks[j * D + d];
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const bool visible = valid && k0 + j < s.Tk && kp[j] <= qp && kp[j] >= lo;
      sc[j] = visible ? sc[j] * s.scale : -INFINITY;
      tile_max = fmaxf(tile_max, sc[j]);
    }
    const float m_new = fmaxf(m, tile_max);
    if (m_new == -INFINITY) continue;      // this row sees nothing here (no barrier skipped)
    const float corr = __expf(m - m_new);  // 0 while m is -inf
    l *= corr;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      sc[j] = __expf(sc[j] - m_new);  // exp(-inf) = 0 for masked keys
      l += sc[j];
    }
    for (int64_t d = 0; d < D; ++d) {
      float acc = orow[d] * corr;
#pragma unroll
      for (int j = 0; j < kTile; ++j) acc += sc[j] * vs[j * D + d];
      orow[d] = acc;
    }
    m = m_new;
  }
  if (!valid) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* o = out + At(s.out, b, h, i);
  for (int64_t d = 0; d < D; ++d) o[d] = FromFloat<T>(orow[d] * inv);
  lse[bh * s.Tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// delta[row] = Σ_d dout[row,d]·out[row,d]: one warp per (b,h,i).
template <typename T>
__global__ void DeltaKernel(float* delta, const T* dout, const T* out, AttentionShape s) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= s.B * s.H * s.Tq) return;
  const int64_t i = row % s.Tq, bh = row / s.Tq, b = bh / s.H, h = bh % s.H;
  const T* dy = dout + At(s.out, b, h, i);
  const T* y = out + At(s.out, b, h, i);
  float acc = 0.0f;
  for (int64_t d = lane; d < s.D; d += 32) acc += ToFloat(dy[d]) * ToFloat(y[d]);
  acc = WarpSum(acc);
  if (lane == 0) delta[row] = acc;
}

// dq: one thread per query row; K/V tiles staged.
template <typename T>
__global__ void BackwardQueryKernel(T* dq, const T* dout, const T* q, const T* k, const T* v,
                                    const float* lse, const float* delta, const int32_t* q_pos,
                                    const int32_t* k_pos, AttentionShape s, bool accumulate) {
  extern __shared__ float smem[];
  const int R = blockDim.x;
  const int64_t D = s.D, Dp = D + 1;
  float* qs = smem;            // [R][D+1]
  float* dos = qs + R * Dp;    // [R][D+1]
  float* dqs = dos + R * Dp;   // [R][D+1]
  float* ks = dqs + R * Dp;    // [kTile][D]
  float* vs = ks + kTile * D;  // [kTile][D]
  int* kp = reinterpret_cast<int*>(vs + kTile * D);
  __shared__ int q_max, lo_min;

  const int64_t bh = blockIdx.y, b = bh / s.H, h = bh % s.H;
  const int tid = threadIdx.x;
  const int64_t i = blockIdx.x * int64_t{R} + tid;
  const bool valid = i < s.Tq;
  const int qp = valid ? q_pos[i] : INT_MIN;
  const int lo = valid ? QueryLow(s, b, i) : INT_MAX;
  const float row_lse = valid ? lse[bh * s.Tq + i] : -INFINITY;
  const float row_delta = valid ? delta[bh * s.Tq + i] : 0.0f;
  const bool any = valid && row_lse != -INFINITY;
  if (tid == 0) {
    q_max = INT_MIN;
    lo_min = INT_MAX;
  }
  float* qrow = qs + tid * Dp;
  float* dorow = dos + tid * Dp;
  float* dqrow = dqs + tid * Dp;
  for (int64_t d = 0; d < D; ++d) {
    qrow[d] = valid ? ToFloat(q[At(s.q, b, h, i) + d]) : 0.0f;
    dorow[d] = valid ? ToFloat(dout[At(s.out, b, h, i) + d]) : 0.0f;
    dqrow[d] = 0.0f;
  }
  __syncthreads();
  atomicMax(&q_max, qp);
  atomicMin(&lo_min, lo);

  for (int64_t k0 = 0; k0 < s.Tk; k0 += kTile) {
    __syncthreads();
    bool seen = false;
    if (tid < kTile) {
      const int64_t kj = k0 + tid;
      kp[tid] = kj < s.Tk ? k_pos[kj] : INT_MAX;
      seen = kj < s.Tk && kp[tid] <= q_max && kp[tid] >= lo_min;
    }
    if (!__syncthreads_or(seen)) continue;  // no row of the block sees a key of this tile
    for (int64_t e = tid; e < kTile * D; e += R) {
      const int64_t j = e / D, d = e % D, kj = k0 + j;
      ks[e] = kj < s.Tk ? ToFloat(k[At(s.k, b, h, kj) + d]) : 0.0f;
      vs[e] = kj < s.Tk ? ToFloat(v[At(s.v, b, h, kj) + d]) : 0.0f;
    }
    __syncthreads();
    if (!any) continue;

    float sc[kTile], dp[kTile];
#pragma unroll
    for (int j = 0; j < kTile; ++j) sc[j] = dp[j] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float qd = qrow[d], dod = dorow[d];
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        sc[j] += qd * ks[j * D + d];
        dp[j] += dod * vs[j * D + d];
      }
    }
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const bool visible = k0 + j < s.Tk && kp[j] <= qp && kp[j] >= lo;
      const float p = visible ? __expf(sc[j] * s.scale - row_lse) : 0.0f;
      sc[j] = p * (dp[j] - row_delta) * s.scale;  // dS·scale: the score's gradient wrt q·k
    }
    for (int64_t d = 0; d < D; ++d) {
      float acc = dqrow[d];
#pragma unroll
      for (int j = 0; j < kTile; ++j) acc += sc[j] * ks[j * D + d];
      dqrow[d] = acc;
    }
  }
  if (!valid) return;
  T* g = dq + At(s.q, b, h, i);
  for (int64_t d = 0; d < D; ++d) {
    g[d] = FromFloat<T>(accumulate ? ToFloat(g[d]) + dqrow[d] : dqrow[d]);
  }
}

// dk, dv: one thread per key row; Q/dO tiles staged.
template <typename T>
__global__ void BackwardKeyValueKernel(T* dk, T* dv, const T* dout, const T* q, const T* k,
                                       const T* v, const float* lse, const float* delta,
                                       const int32_t* q_pos, const int32_t* k_pos, AttentionShape s,
                                       bool accumulate) {
  extern __shared__ float smem[];
  const int R = blockDim.x;
  const int64_t D = s.D, Dp = D + 1;
  float* ks = smem;                              // [R][D+1]
  float* vs = ks + R * Dp;                       // [R][D+1]
  float* dks = vs + R * Dp;                      // [R][D+1]
  float* dvs = dks + R * Dp;                     // [R][D+1]
  float* qs = dvs + R * Dp;                      // [kTile][D]
  float* dos = qs + kTile * D;                   // [kTile][D]
  float* ls = dos + kTile * D;                   // [kTile] lse
  float* dl = ls + kTile;                        // [kTile] delta
  int* qp = reinterpret_cast<int*>(dl + kTile);  // [kTile]
  int* ql = qp + kTile;                          // [kTile] the queries' lower bounds
  __shared__ int k_min, k_max;

  const int64_t bh = blockIdx.y, b = bh / s.H, h = bh % s.H;
  const int tid = threadIdx.x;
  const int64_t j = blockIdx.x * int64_t{R} + tid;
  const bool valid = j < s.Tk;
  const int kpj = valid ? k_pos[j] : INT_MAX;
  if (tid == 0) {
    k_min = INT_MAX;
    k_max = INT_MIN;
  }
  float* krow = ks + tid * Dp;
  float* vrow = vs + tid * Dp;
  float* dkrow = dks + tid * Dp;
  float* dvrow = dvs + tid * Dp;
  for (int64_t d = 0; d < D; ++d) {
    krow[d] = valid ? ToFloat(k[At(s.k, b, h, j) + d]) : 0.0f;
    vrow[d] = valid ? ToFloat(v[At(s.v, b, h, j) + d]) : 0.0f;
    dkrow[d] = dvrow[d] = 0.0f;
  }
  __syncthreads();
  atomicMin(&k_min, kpj);
  if (valid) atomicMax(&k_max, kpj);

  for (int64_t q0 = 0; q0 < s.Tq; q0 += kTile) {
    __syncthreads();
    bool seen = false;
    if (tid < kTile) {
      const int64_t qi = q0 + tid;
      const bool in = qi < s.Tq;
      qp[tid] = in ? q_pos[qi] : INT_MIN;
      ql[tid] = in ? QueryLow(s, b, qi) : INT_MAX;
      ls[tid] = in ? lse[bh * s.Tq + qi] : -INFINITY;
      dl[tid] = in ? delta[bh * s.Tq + qi] : 0.0f;
      seen = in && qp[tid] >= k_min && ql[tid] <= k_max;
    }
    if (!__syncthreads_or(seen)) continue;  // no query of the tile sees a key of the block
    for (int64_t e = tid; e < kTile * D; e += R) {
      const int64_t r = e / D, d = e % D, qi = q0 + r;
      qs[e] = qi < s.Tq ? ToFloat(q[At(s.q, b, h, qi) + d]) : 0.0f;
      dos[e] = qi < s.Tq ? ToFloat(dout[At(s.out, b, h, qi) + d]) : 0.0f;
    }
    __syncthreads();
    if (!valid) continue;

    float sc[kTile], dp[kTile];
#pragma unroll
    for (int r = 0; r < kTile; ++r) sc[r] = dp[r] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float kd = krow[d], vd = vrow[d];
#pragma unroll
      for (int r = 0; r < kTile; ++r) {
        sc[r] += kd * qs[r * D + d];
        dp[r] += vd * dos[r * D + d];
      }
    }
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      const bool visible = kpj <= qp[r] && kpj >= ql[r] && ls[r] != -INFINITY;
      const float p = visible ? __expf(sc[r] * s.scale - ls[r]) : 0.0f;
      sc[r] = p;                              // P
      dp[r] = p * (dp[r] - dl[r]) * s.scale;  // dS·scale
    }
    for (int64_t d = 0; d < D; ++d) {
      float av = dvrow[d], ak = dkrow[d];
#pragma unroll
      for (int r = 0; r < kTile; ++r) {
        av += sc[r] * dos[r * D + d];
        ak += dp[r] * qs[r * D + d];
      }
      dvrow[d] = av;
      dkrow[d] = ak;
    }
  }
  if (!valid) return;
  T* gk = dk + At(s.k, b, h, j);
  T* gv = dv + At(s.v, b, h, j);
  for (int64_t d = 0; d < D; ++d) {
    gk[d] = FromFloat<T>(accumulate ? ToFloat(gk[d]) + dkrow[d] : dkrow[d]);
    gv[d] = FromFloat<T>(accumulate ? ToFloat(gv[d]) + dvrow[d] : dvrow[d]);
  }
}

template <typename T>
__global__ void MergeKernel(T* out_a, float* lse_a, const T* out_b, const float* lse_b,
                            int64_t rows, int64_t D) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float la = lse_a[r], lb = lse_b[r];
  __syncwarp();                 // every lane has read lse_a[r] before lane 0 overwrites it
  if (lb == -INFINITY) return;  // b saw no key: a is unchanged
  T* oa = out_a + r * D;
  const T* ob = out_b + r * D;
  if (la == -INFINITY) {
    for (int64_t d = lane; d < D; d += 32) oa[d] = ob[d];
    if (lane == 0) lse_a[r] = lb;
    return;
  }
  // Relative to the larger side: w = e^{-|la − lb|} ≤ 1, so nothing overflows.
  const float w = expf(-fabsf(la - lb));
  const float inv = 1.0f / (1.0f + w);
  const float ca = la >= lb ? inv : w * inv;
  const float cb = la >= lb ? w * inv : inv;
  for (int64_t d = lane; d < D; d += 32) {
    oa[d] = FromFloat<T>(ca * ToFloat(oa[d]) + cb * ToFloat(ob[d]));
  }
  if (lane == 0) lse_a[r] = fmaxf(la, lb) + log1pf(w);
}

template <typename T>
Status CheckShape(const AttentionShape& s, AttentionAlgo algo) {
  if (s.D <= 0 || s.D > kMaxGenericD) {
    return InvalidArgumentError("attention head size D=" + std::to_string(s.D) +
                                " is outside [1, " + std::to_string(kMaxGenericD) +
                                "] (hint: use more heads)");
  }
  if (algo == AttentionAlgo::kTensorCore && !AttentionUsesTensorCores<T>(s.D, algo)) {
    return InvalidArgumentError(
        "tensor-core attention needs bf16 and D == 64, got D=" + std::to_string(s.D) +
        " (hint: use AttentionAlgo::kAuto or kGeneric)");
  }
  return OkStatus();
}

AttentionShape MakeShape(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, double scale,
                         const AttentionOptions& o) {
  return AttentionShape{B,
                        H,
                        Tq,
                        Tk,
                        D,
                        static_cast<float>(scale),
                        internal::Resolve(o.q, H, Tq, D),
                        internal::Resolve(o.k, H, Tk, D),
                        internal::Resolve(o.v, H, Tk, D),
                        internal::Resolve(o.out, H, Tq, D),
                        o.q_lo};
}

template <typename Kernel>
Status PrepareSharedMemory(Kernel kernel, size_t bytes) {
  MESHRUN_GPU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  return OkStatus();
}

}  // namespace

template <typename T>
bool AttentionUsesTensorCores(int64_t D, AttentionAlgo algo) {
  if constexpr (std::is_same_v<T, bf16>) {
    return algo != AttentionAlgo::kGeneric && D == 64;
  } else {
    return false;
  }
}

template <typename T>
Status AttentionForward(CudaContext& ctx, T* out, float* lse, const T* q, const T* k, const T* v,
                        const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t H,
                        int64_t Tq, int64_t Tk, int64_t D, double scale,
                        const AttentionOptions& options) {
  const AttentionShape s = MakeShape(B, H, Tq, Tk, D, scale, options);
  MESHRUN_RETURN_IF_ERROR(CheckShape<T>(s, options.algo));
  if (B * H * Tq == 0) return OkStatus();
  if constexpr (std::is_same_v<T, bf16>) {
    if (AttentionUsesTensorCores<T>(D, options.algo)) {
      return internal::AttentionForwardTensorCore(ctx, out, lse, q, k, v, q_pos, k_pos, s);
    }
  }
  const int R = RowsPerBlock(D);
  const size_t smem = sizeof(float) * (2 * R * (D + 1) + 2 * kTile * D) + sizeof(int) * kTile;
  MESHRUN_RETURN_IF_ERROR(PrepareSharedMemory(ForwardKernel<T>, smem));
  const dim3 grid(static_cast<unsigned>(CeilDiv(Tq, R)), static_cast<unsigned>(B * H));
  ForwardKernel<T><<<grid, R, smem, ctx.stream()>>>(out, lse, q, k, v, q_pos, k_pos, s);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status AttentionBackward(CudaContext& ctx, T* dq, T* dk, T* dv, const T* dout, const T* q,
                         const T* k, const T* v, const T* out, const float* lse,
                         const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t H,
                         int64_t Tq, int64_t Tk, int64_t D, double scale,
                         const AttentionOptions& options) {
  const AttentionShape s = MakeShape(B, H, Tq, Tk, D, scale, options);
  MESHRUN_RETURN_IF_ERROR(CheckShape<T>(s, options.algo));
  if (B * H * (Tq + Tk) == 0) return OkStatus();
  const int64_t rows = B * H * Tq;
  MESHRUN_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(sizeof(float) * (rows > 0 ? rows : 1)));
  float* delta = static_cast<float*>(scratch);
  if (rows > 0) {
    DeltaKernel<T>
        <<<static_cast<unsigned>(CeilDiv(rows, 8)), 256, 0, ctx.stream()>>>(delta, dout, out, s);
    MESHRUN_GPU_TRY_LAUNCH();
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (AttentionUsesTensorCores<T>(D, options.algo)) {
      return internal::AttentionBackwardTensorCore(ctx, dq, dk, dv, dout, q, k, v, lse, delta,
                                                   q_pos, k_pos, s, options.accumulate);
    }
  }
  const int R = RowsPerBlock(D);
  if (Tq > 0) {
    const size_t smem = sizeof(float) * (3 * R * (D + 1) + 2 * kTile * D) + sizeof(int) * kTile;
    MESHRUN_RETURN_IF_ERROR(PrepareSharedMemory(BackwardQueryKernel<T>, smem));
    const dim3 grid(static_cast<unsigned>(CeilDiv(Tq, R)), static_cast<unsigned>(B * H));
    BackwardQueryKernel<T><<<grid, R, smem, ctx.stream()>>>(dq, dout, q, k, v, lse, delta, q_pos,
                                                            k_pos, s, options.accumulate);
    MESHRUN_GPU_TRY_LAUNCH();
  }
  if (Tk > 0) {
    const size_t smem =
        sizeof(float) * (4 * R * (D + 1) + 2 * kTile * D + 2 * kTile) + sizeof(int) * 2 * kTile;
    MESHRUN_RETURN_IF_ERROR(PrepareSharedMemory(BackwardKeyValueKernel<T>, smem));
    const dim3 grid(static_cast<unsigned>(CeilDiv(Tk, R)), static_cast<unsigned>(B * H));
    BackwardKeyValueKernel<T><<<grid, R, smem, ctx.stream()>>>(dk, dv, dout, q, k, v, lse, delta,
                                                               q_pos, k_pos, s, options.accumulate);
    MESHRUN_GPU_TRY_LAUNCH();
  }
  return OkStatus();
}

template <typename T>
Status AttentionMerge(CudaContext& ctx, T* out_a, float* lse_a, const T* out_b, const float* lse_b,
                      int64_t rows, int64_t D) {
  if (rows <= 0) return OkStatus();
  MergeKernel<T><<<static_cast<unsigned>(CeilDiv(rows, 8)), 256, 0, ctx.stream()>>>(
      out_a, lse_a, out_b, lse_b, rows, D);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

#define MESHRUN_INSTANTIATE(T)                                                                   \
  template bool AttentionUsesTensorCores<T>(int64_t, AttentionAlgo);                             \
  template Status AttentionForward<T>(CudaContext&, T*, float*, const T*, const T*, const T*,    \
                                      const int32_t*, const int32_t*, int64_t, int64_t, int64_t, \
                                      int64_t, int64_t, double, const AttentionOptions&);        \
  template Status AttentionBackward<T>(CudaContext&, T*, T*, T*, const T*, const T*, const T*,   \
                                       const T*, const T*, const float*, const int32_t*,         \
                                       const int32_t*, int64_t, int64_t, int64_t, int64_t,       \
                                       int64_t, double, const AttentionOptions&);                \
  template Status AttentionMerge<T>(CudaContext&, T*, float*, const T*, const float*, int64_t,   \
                                    int64_t);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(bf16)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::gpu
