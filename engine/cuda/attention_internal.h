// Shared between the two attention implementations (attention.cu: float32 CUDA-core kernels for
// any D; attention_tc.cu: bf16 tensor-core kernels for D = 64). Internal to engine/cuda.
#pragma once

#include <climits>
#include <cstdint>

#include "common/status.h"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu::internal {

// Element strides of a (B,H,T,D) view with contiguous D (resolved: never all zero).
struct Strides {
  int64_t batch, head, token;
};

inline Strides Resolve(const HeadLayout& l, int64_t H, int64_t T, int64_t D) {
  if (l.batch == 0 && l.head == 0 && l.token == 0) return {H * T * D, T * D, D};
  return {l.batch, l.head, l.token};
}

struct AttentionShape {
  int64_t B, H, Tq, Tk, D;
  float scale;
  Strides q, k, v, out;
  const int32_t* q_lo;  // (B,Tq): the first key position each query sees; null: no lower bound
};

// Query i of sequence b sees keys at positions ≥ QueryLow(s, b, i) (and ≤ its own position).
#ifdef __CUDACC__
__device__ __forceinline__ int QueryLow(const AttentionShape& s, int64_t b, int64_t i) {
  return s.q_lo != nullptr ? s.q_lo[b * s.Tq + i] : INT_MIN;
}
#endif

// Tensor-core kernels (attention_tc.cu). Only called with bf16 and D == 64.
Status AttentionForwardTensorCore(CudaContext& ctx, bf16* out, float* lse, const bf16* q,
                                  const bf16* k, const bf16* v, const int32_t* q_pos,
                                  const int32_t* k_pos, const AttentionShape& s);
// delta[(b·H + h)·Tq + i] = Σ_d dout·out (float32), computed by the caller.
Status AttentionBackwardTensorCore(CudaContext& ctx, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                                   const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                   const float* delta, const int32_t* q_pos, const int32_t* k_pos,
                                   const AttentionShape& s, bool accumulate);

}  // namespace meshrun::gpu::internal
