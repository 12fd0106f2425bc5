// Tensor-core causal attention for bf16 and head size 64 (GPT-2's): flash-attention 2 forward and
// backward on WMMA 16×16×16 bf16 tiles with float32 accumulation.
//
// A block is 4 warps and owns 64 rows (queries in the forward and dq kernels, keys in the dk/dv
// kernel); each warp owns 16 of them. The other operand streams through shared memory in tiles of
// 64 rows. Score tiles go through shared memory in float32 so that lanes can apply the mask and
// the softmax (the WMMA accumulator layout is opaque); two lanes own one row, 32 columns each.
// The forward keeps its output accumulator in shared memory too, so that the online-softmax
// rescale can be applied per row; the backward's accumulators (dv, dk, dq) need no rescale and
// stay in registers. No T×T matrix exists anywhere; tiles that no row of the block can see (by
// position, and by the queries' lower bounds q_lo: sliding windows, documents) are skipped, so a
// causal sequence does about half the work.
#include <cuda_bf16.h>
#include <mma.h>

#include <climits>
#include <initializer_list>

#include "engine/cuda/attention_internal.h"
#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"

namespace meshrun::gpu::internal {
namespace {

constexpr int kD = 64;     // head size
constexpr int kRows = 64;  // rows per block and per streamed tile
constexpr int kThreads = 128;
constexpr int kLdh = kD + 8;     // bf16 pitch of a [64][64] tile (144 bytes: 16-byte aligned rows)
constexpr int kLdf = kRows + 4;  // float pitch of a [64][64] score / accumulator tile
constexpr int kHalfTile = kRows * kLdh;   // bf16 elements of one staged tile
constexpr int kFloatTile = kRows * kLdf;  // floats of one score tile

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MESHRUN_TC_ENABLED 1
#endif

// Rows [t0, t0 + 64) of one (b,h) of a strided bf16 tensor into a [64][kLdh] tile, zero past T.
__device__ __forceinline__ void LoadTile(bf16* dst, const bf16* src, const Strides& st, int64_t b,
                                         int64_t h, int64_t t0, int64_t T, bool vectorized) {
  const bf16* base = src + b * st.batch + h * st.head;
  if (vectorized) {
    for (int e = threadIdx.x; e < kRows * (kD / 8); e += kThreads) {
      const int r = e / (kD / 8), c = (e % (kD / 8)) * 8;
      const int64_t t = t0 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (t < T) val = *reinterpret_cast<const uint4*>(base + t * st.token + c);
      *reinterpret_cast<uint4*>(dst + r * kLdh + c) = val;
    }
  } else {
    for (int e = threadIdx.x; e < kRows * kD; e += kThreads) {
      const int r = e / kD, c = e % kD;
      const int64_t t = t0 + r;
      dst[r * kLdh + c] = t < T ? base[t * st.token + c] : __float2bfloat16_rn(0.0f);
    }
  }
}

using namespace nvcuda;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

#ifdef MESHRUN_TC_ENABLED
// out[16w.., 0..64) = A[16w.., 0..64) · B[0..64, 0..64)ᵀ for this warp's 16 rows, where A and B
// are bf16 [64][kLdh] tiles (row = a row of the operand), stored as float into out [64][kLdf].
__device__ __forceinline__ void WarpRowsTimesTransposed(float* out, const bf16* A, const bf16* B,
                                                        int warp) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      FragA a;
      FragBCol bt;
      wmma::load_matrix_sync(a, A + 16 * warp * kLdh + 16 * kk, kLdh);
      wmma::load_matrix_sync(bt, B + 16 * n * kLdh + 16 * kk, kLdh);
      wmma::mma_sync(acc, a, bt, acc);
    }
    wmma::store_matrix_sync(out + 16 * warp * kLdf + 16 * n, acc, kLdf, wmma::mem_row_major);
  }
}

// acc[n] += A[16w.., 0..64) · B[0..64, 16n..16n+16) for A, B bf16 [64][kLdh] tiles.
__device__ __forceinline__ void WarpRowsTimes(FragAcc (&acc)[4], const bf16* A, const bf16* B,
                                              int warp) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    FragA a;
    wmma::load_matrix_sync(a, A + 16 * warp * kLdh + 16 * kk, kLdh);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      FragBRow bm;
      wmma::load_matrix_sync(bm, B + 16 * kk * kLdh + 16 * n, kLdh);
      wmma::mma_sync(acc[n], a, bm, acc[n]);
    }
  }
}

// Writes this warp's 16 rows of acc·factor to global rows (the lane pair's row `r`, columns
// [c0, c0 + 32) at `dst`; null: this row is past the end), through `staging` [64][kLdf].
__device__ __forceinline__ void StoreRows(bf16* dst, FragAcc (&acc)[4], float* staging, int warp,
                                          int r, int c0, float factor, bool accumulate) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::store_matrix_sync(staging + 16 * warp * kLdf + 16 * n, acc[n], kLdf, wmma::mem_row_major);
  }
  __syncwarp();
  if (dst != nullptr) {
    const float* row = staging + r * kLdf;
    for (int d = c0; d < c0 + 32; ++d) {
      const float val = row[d] * factor;
      dst[d] = __float2bfloat16_rn(accumulate ? __bfloat162float(dst[d]) + val : val);
    }
  }
  __syncwarp();  // the staging rows are free again
}
#endif

struct SharedLayout {
  // Offsets in bytes; every array starts 128-byte aligned.
  static constexpr size_t kHalfBytes = sizeof(bf16) * kHalfTile;
  static constexpr size_t kFloatBytes = sizeof(float) * kFloatTile;
  static constexpr size_t kVecBytes = sizeof(float) * kRows;
  static constexpr size_t kScalarBytes = 128;  // the block-wide position bounds after the vectors
};

// ---- forward: grid (Tq/64, B·H); warp w owns queries [q0 + 16w, q0 + 16w + 16).
constexpr size_t kForwardSmem = 4 * SharedLayout::kHalfBytes + 2 * SharedLayout::kFloatBytes +
                                5 * SharedLayout::kVecBytes + SharedLayout::kScalarBytes;

__global__ void __launch_bounds__(kThreads)
    ForwardKernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                  const int32_t* q_pos, const int32_t* k_pos, AttentionShape s, bool vec) {
#ifdef MESHRUN_TC_ENABLED
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kHalfTile;
  bf16* Vs = Ks + kHalfTile;
  bf16* Ps = Vs + kHalfTile;
  float* Ss = reinterpret_cast<float*>(Ps + kHalfTile);
  float* Os = Ss + kFloatTile;
  float* row_m = Os + kFloatTile;
  float* row_l = row_m + kRows;
  int* qp_s = reinterpret_cast<int*>(row_l + kRows);
  int* lo_s = qp_s + kRows;  // the queries' lower bounds
  int* kp_s = lo_s + kRows;
  int& q_max = kp_s[kRows];  // in the dynamic block: no static shared memory shifts its base
  int& lo_min = kp_s[kRows + 1];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t bh = blockIdx.y, b = bh / s.H, h = bh % s.H;
  const int64_t q0 = blockIdx.x * int64_t{kRows};
  if (tid == 0) {
    q_max = INT_MIN;
    lo_min = INT_MAX;
  }
  LoadTile(Qs, q, s.q, b, h, q0, s.Tq, vec);
  for (int e = tid; e < kFloatTile; e += kThreads) Os[e] = 0.0f;
  if (tid < kRows) {
    row_m[tid] = -INFINITY;
    row_l[tid] = 0.0f;
    qp_s[tid] = q0 + tid < s.Tq ? q_pos[q0 + tid] : INT_MIN;
    lo_s[tid] = q0 + tid < s.Tq ? QueryLow(s, b, q0 + tid) : INT_MAX;
  }
  __syncthreads();
  if (tid < kRows) {
    atomicMax(&q_max, qp_s[tid]);
    atomicMin(&lo_min, lo_s[tid]);
  }

  // Lane pair (2r', 2r'+1) owns row r = 16·warp + lane/2, columns [32·half, 32·half + 32).
  const int r = 16 * warp + lane / 2, half = lane % 2, c0 = 32 * half;
  for (int64_t k0 = 0; k0 < s.Tk; k0 += kRows) {
    __syncthreads();  // every warp is done with the previous K/V tile; q_max is final
    bool seen = false;
    if (tid < kRows) {
      kp_s[tid] = k0 + tid < s.Tk ? k_pos[k0 + tid] : INT_MAX;
      seen = kp_s[tid] <= q_max && kp_s[tid] >= lo_min;
    }
    if (!__syncthreads_or(seen)) continue;  // no row of this block sees any key of the tile
    LoadTile(Ks, k, s.k, b, h, k0, s.Tk, vec);
    LoadTile(Vs, v, s.v, b, h, k0, s.Tk, vec);
    __syncthreads();

    WarpRowsTimesTransposed(Ss, Qs, Ks, warp);  // S = Q·Kᵀ for this warp's rows
    __syncwarp();

    const int qp = qp_s[r], lo = lo_s[r];
    const float m_old = row_m[r], l_old = row_l[r];
    float* srow = Ss + r * kLdf;
    float mx = -INFINITY;
    for (int c = c0; c < c0 + 32; ++c) {
      const float x = kp_s[c] <= qp && kp_s[c] >= lo ? srow[c] * s.scale : -INFINITY;
      srow[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_old, mx);
    const bool none = m_new == -INFINITY;  // the row sees no key yet
    const float corr = none ? 1.0f : __expf(m_old - m_new);
    float sum = 0.0f;
    bf16* prow = Ps + r * kLdh;
    for (int c = c0; c < c0 + 32; ++c) {
      const float p = none ? 0.0f : __expf(srow[c] - m_new);
      const bf16 pb = __float2bfloat16_rn(p);
      prow[c] = pb;
      sum += __bfloat162float(pb);  // the normaliser counts what P·V multiplies
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    float* orow = Os + r * kLdf;
    for (int d = c0; d < c0 + 32; ++d) orow[d] *= corr;
    if (half == 0) {
      row_m[r] = m_new;
      row_l[r] = l_old * corr + sum;
    }
    __syncwarp();

    // O += P·V for this warp's rows, through shared memory (the rescale above is per row).
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      FragAcc acc;
      wmma::load_matrix_sync(acc, Os + 16 * warp * kLdf + 16 * n, kLdf, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        FragA a;
        FragBRow bm;
        wmma::load_matrix_sync(a, Ps + 16 * warp * kLdh + 16 * kk, kLdh);
        wmma::load_matrix_sync(bm, Vs + 16 * kk * kLdh + 16 * n, kLdh);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(Os + 16 * warp * kLdf + 16 * n, acc, kLdf, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  const int64_t i = q0 + r;
  if (i >= s.Tq) return;
  const float l = row_l[r];
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  bf16* o = out + b * s.out.batch + h * s.out.head + i * s.out.token;
  const float* orow = Os + r * kLdf;
  for (int d = c0; d < c0 + 32; ++d) o[d] = __float2bfloat16_rn(orow[d] * inv);
  if (half == 0) lse[bh * s.Tq + i] = l > 0.0f ? row_m[r] + logf(l) : -INFINITY;
#endif
}

// ---- dk, dv: grid (Tk/64, B·H); warp w owns keys [j0 + 16w, j0 + 16w + 16).
constexpr size_t kKeyValueSmem = 6 * SharedLayout::kHalfBytes + SharedLayout::kFloatBytes +
                                 5 * SharedLayout::kVecBytes + SharedLayout::kScalarBytes;

__global__ void __launch_bounds__(kThreads)
    BackwardKeyValueKernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                           const bf16* v, const float* lse, const float* delta,
                           const int32_t* q_pos, const int32_t* k_pos, AttentionShape s,
                           bool accumulate, bool vec) {
#ifdef MESHRUN_TC_ENABLED
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kHalfTile;
  bf16* Qs = Vs + kHalfTile;
  bf16* dOs = Qs + kHalfTile;
  bf16* Pt = dOs + kHalfTile;                             // Pᵀ [keys][queries]
  bf16* dSt = Pt + kHalfTile;                             // dSᵀ [keys][queries]
  float* St = reinterpret_cast<float*>(dSt + kHalfTile);  // Sᵀ, then dPᵀ, then dk/dv out
  float* lse_s = St + kFloatTile;
  float* delta_s = lse_s + kRows;
  int* qp_s = reinterpret_cast<int*>(delta_s + kRows);
  int* lo_s = qp_s + kRows;  // the query tile's lower bounds
  int* kp_s = lo_s + kRows;
  int& k_min = kp_s[kRows];
  int& k_max = kp_s[kRows + 1];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t bh = blockIdx.y, b = bh / s.H, h = bh % s.H;
  const int64_t j0 = blockIdx.x * int64_t{kRows};
  if (tid == 0) {
    k_min = INT_MAX;
    k_max = INT_MIN;
  }
  LoadTile(Ks, k, s.k, b, h, j0, s.Tk, vec);
  LoadTile(Vs, v, s.v, b, h, j0, s.Tk, vec);
  if (tid < kRows) kp_s[tid] = j0 + tid < s.Tk ? k_pos[j0 + tid] : INT_MAX;
  __syncthreads();
  if (tid < kRows) {
    atomicMin(&k_min, kp_s[tid]);
    if (j0 + tid < s.Tk) atomicMax(&k_max, kp_s[tid]);
  }

  FragAcc dk_acc[4], dv_acc[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  const int r = 16 * warp + lane / 2, half = lane % 2, c0 = 32 * half;
  const int kp = kp_s[r];
  for (int64_t q0 = 0; q0 < s.Tq; q0 += kRows) {
    __syncthreads();
    bool seen = false;
    if (tid < kRows) {
      const bool in = q0 + tid < s.Tq;
      qp_s[tid] = in ? q_pos[q0 + tid] : INT_MIN;
      lo_s[tid] = in ? QueryLow(s, b, q0 + tid) : INT_MAX;
      lse_s[tid] = in ? lse[bh * s.Tq + q0 + tid] : -INFINITY;
      delta_s[tid] = in ? delta[bh * s.Tq + q0 + tid] : 0.0f;
      seen = in && qp_s[tid] >= k_min && lo_s[tid] <= k_max;
    }
    if (!__syncthreads_or(seen)) continue;  // no query of the tile sees a key of this block
    LoadTile(Qs, q, s.q, b, h, q0, s.Tq, vec);
    LoadTile(dOs, dout, s.out, b, h, q0, s.Tq, vec);
    __syncthreads();

    WarpRowsTimesTransposed(St, Ks, Qs, warp);  // Sᵀ = K·Qᵀ
    __syncwarp();
    float p[32];
    float* srow = St + r * kLdf;
    bf16* prow = Pt + r * kLdh;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = c0 + c;
      const bool visible = kp <= qp_s[col] && kp >= lo_s[col] && lse_s[col] != -INFINITY;
      p[c] = visible ? __expf(srow[col] * s.scale - lse_s[col]) : 0.0f;
      prow[col] = __float2bfloat16_rn(p[c]);
    }
    __syncwarp();
    WarpRowsTimes(dv_acc, Pt, dOs, warp);        // dV += Pᵀ·dO
    WarpRowsTimesTransposed(St, Vs, dOs, warp);  // dPᵀ = V·dOᵀ (over Sᵀ, already consumed)
    __syncwarp();
    bf16* dsrow = dSt + r * kLdh;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = c0 + c;
      dsrow[col] = __float2bfloat16_rn(p[c] * (srow[col] - delta_s[col]));
    }
    __syncwarp();
    WarpRowsTimes(dk_acc, dSt, Qs, warp);  // dK += dSᵀ·Q (scaled at the end)
  }
  __syncwarp();
  const int64_t j = j0 + r;
  const bool in = j < s.Tk;
  StoreRows(in ? dk + b * s.k.batch + h * s.k.head + j * s.k.token : nullptr, dk_acc, St, warp, r,
            c0, s.scale, accumulate);
  StoreRows(in ? dv + b * s.v.batch + h * s.v.head + j * s.v.token : nullptr, dv_acc, St, warp, r,
            c0, 1.0f, accumulate);
#endif
}

// ---- dq: grid (Tq/64, B·H); warp w owns queries [q0 + 16w, q0 + 16w + 16).
constexpr size_t kQuerySmem = 5 * SharedLayout::kHalfBytes + SharedLayout::kFloatBytes +
                              5 * SharedLayout::kVecBytes + SharedLayout::kScalarBytes;

__global__ void __launch_bounds__(kThreads)
    BackwardQueryKernel(bf16* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const float* lse, const float* delta, const int32_t* q_pos,
                        const int32_t* k_pos, AttentionShape s, bool accumulate, bool vec) {
#ifdef MESHRUN_TC_ENABLED
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + kHalfTile;
  bf16* Ks = dOs + kHalfTile;
  bf16* Vs = Ks + kHalfTile;
  bf16* dSs = Vs + kHalfTile;
  float* Ss = reinterpret_cast<float*>(dSs + kHalfTile);  // S, then dP, then dq out
  float* lse_s = Ss + kFloatTile;
  float* delta_s = lse_s + kRows;
  int* qp_s = reinterpret_cast<int*>(delta_s + kRows);
  int* lo_s = qp_s + kRows;  // the queries' lower bounds
  int* kp_s = lo_s + kRows;
  int& q_max = kp_s[kRows];
  int& lo_min = kp_s[kRows + 1];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t bh = blockIdx.y, b = bh / s.H, h = bh % s.H;
  const int64_t q0 = blockIdx.x * int64_t{kRows};
  if (tid == 0) {
    q_max = INT_MIN;
    lo_min = INT_MAX;
  }
  LoadTile(Qs, q, s.q, b, h, q0, s.Tq, vec);
  LoadTile(dOs, dout, s.out, b, h, q0, s.Tq, vec);
  if (tid < kRows) {
    const bool in = q0 + tid < s.Tq;
    qp_s[tid] = in ? q_pos[q0 + tid] : INT_MIN;
    lo_s[tid] = in ? QueryLow(s, b, q0 + tid) : INT_MAX;
    lse_s[tid] = in ? lse[bh * s.Tq + q0 + tid] : -INFINITY;
    delta_s[tid] = in ? delta[bh * s.Tq + q0 + tid] : 0.0f;
  }
  __syncthreads();
  if (tid < kRows) {
    atomicMax(&q_max, qp_s[tid]);
    atomicMin(&lo_min, lo_s[tid]);
  }

  FragAcc dq_acc[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);
  const int r = 16 * warp + lane / 2, half = lane % 2, c0 = 32 * half;
  const int qp = qp_s[r], lo = lo_s[r];
  const float row_lse = lse_s[r], row_delta = delta_s[r];
  for (int64_t k0 = 0; k0 < s.Tk; k0 += kRows) {
    __syncthreads();
    bool seen = false;
    if (tid < kRows) {
      kp_s[tid] = k0 + tid < s.Tk ? k_pos[k0 + tid] : INT_MAX;
      seen = kp_s[tid] <= q_max && kp_s[tid] >= lo_min;
    }
    if (!__syncthreads_or(seen)) continue;
    LoadTile(Ks, k, s.k, b, h, k0, s.Tk, vec);
    LoadTile(Vs, v, s.v, b, h, k0, s.Tk, vec);
    __syncthreads();

    WarpRowsTimesTransposed(Ss, Qs, Ks, warp);  // S = Q·Kᵀ
    __syncwarp();
    float p[32];
    float* srow = Ss + r * kLdf;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = c0 + c;
      const bool visible = kp_s[col] <= qp && kp_s[col] >= lo && row_lse != -INFINITY;
      p[c] = visible ? __expf(srow[col] * s.scale - row_lse) : 0.0f;
    }
    __syncwarp();
    WarpRowsTimesTransposed(Ss, dOs, Vs, warp);  // dP = dO·Vᵀ
    __syncwarp();
    bf16* dsrow = dSs + r * kLdh;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = c0 + c;
      dsrow[col] = __float2bfloat16_rn(p[c] * (srow[col] - row_delta));
    }
    __syncwarp();
    WarpRowsTimes(dq_acc, dSs, Ks, warp);  // dQ += dS·K (scaled at the end)
  }
  __syncwarp();
  const int64_t i = q0 + r;
  StoreRows(i < s.Tq ? dq + b * s.q.batch + h * s.q.head + i * s.q.token : nullptr, dq_acc, Ss,
            warp, r, c0, s.scale, accumulate);
#endif
}

// 16-byte loads need 16-byte aligned rows: aligned bases and strides that are multiples of 8.
bool Vectorizable(const AttentionShape& s, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  for (const Strides& st : {s.q, s.k, s.v, s.out}) {
    if (st.batch % 8 != 0 || st.head % 8 != 0 || st.token % 8 != 0) return false;
  }
  return true;
}

template <typename Kernel>
Status SetSharedMemory(Kernel kernel, size_t bytes) {
  MESHRUN_GPU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  return OkStatus();
}

}  // namespace

Status AttentionForwardTensorCore(CudaContext& ctx, bf16* out, float* lse, const bf16* q,
                                  const bf16* k, const bf16* v, const int32_t* q_pos,
                                  const int32_t* k_pos, const AttentionShape& s) {
  if (s.D != kD) return InvalidArgumentError("tensor-core attention needs D == 64");
  const bool vec = Vectorizable(s, {q, k, v});
  MESHRUN_RETURN_IF_ERROR(SetSharedMemory(ForwardKernel, kForwardSmem));
  const dim3 grid(static_cast<unsigned>(CeilDiv(s.Tq, kRows)), static_cast<unsigned>(s.B * s.H));
  ForwardKernel<<<grid, kThreads, kForwardSmem, ctx.stream()>>>(out, lse, q, k, v, q_pos, k_pos, s,
                                                                vec);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

Status AttentionBackwardTensorCore(CudaContext& ctx, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                                   const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                   const float* delta, const int32_t* q_pos, const int32_t* k_pos,
                                   const AttentionShape& s, bool accumulate) {
  if (s.D != kD) return InvalidArgumentError("tensor-core attention needs D == 64");
  const bool vec = Vectorizable(s, {q, k, v, dout});
  if (s.Tk > 0) {
    MESHRUN_RETURN_IF_ERROR(SetSharedMemory(BackwardKeyValueKernel, kKeyValueSmem));
    const dim3 grid(static_cast<unsigned>(CeilDiv(s.Tk, kRows)), static_cast<unsigned>(s.B * s.H));
    BackwardKeyValueKernel<<<grid, kThreads, kKeyValueSmem, ctx.stream()>>>(
        dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, s, accumulate, vec);
    MESHRUN_GPU_TRY_LAUNCH();
  }
  if (s.Tq > 0) {
    MESHRUN_RETURN_IF_ERROR(SetSharedMemory(BackwardQueryKernel, kQuerySmem));
    const dim3 grid(static_cast<unsigned>(CeilDiv(s.Tq, kRows)), static_cast<unsigned>(s.B * s.H));
    BackwardQueryKernel<<<grid, kThreads, kQuerySmem, ctx.stream()>>>(
        dq, dout, q, k, v, lse, delta, q_pos, k_pos, s, accumulate, vec);
    MESHRUN_GPU_TRY_LAUNCH();
  }
  return OkStatus();
}

}  // namespace meshrun::gpu::internal
