// CUDA kernels of the engine: the ops of engine/kernels/cpu/kernels.h on device buffers, with the
// same semantics (backward kernels accumulate, attention masks by global positions and returns
// the log-sum-exp), enqueued on the context's stream.
//
// Precision: activations have type T, float or bf16 (__nv_bfloat16); every reduction, softmax and
// normalisation runs in float32. Parameter GRADIENTS, LayerNorm statistics, attention lse and
// losses are always float32 (mixed precision keeps fp32 master weights and fp32 gradients; the
// bf16 weights the forward reads are a copy). GEMMs run on cuBLASLt with float32 accumulation.
//
// Differences from the CPU kernels, on purpose:
//  - Some backward kernels take `accumulate`; false overwrites instead of adding (saves the
//    memset of a buffer that would be zero). The default is the CPU behaviour (accumulate).
//  - EmbeddingBackward adds with float atomics: not bit-reproducible run to run (tokens repeat).
//    Everything else is deterministic for a fixed device and shape.
//  - Every function returns a Status: launch errors surface at the call, kernel faults at the
//    next synchronizing call (MESHRUN_GPU_TRY records the first, see check.h).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/status.h"
#include "engine/cuda/context.h"

namespace meshrun::gpu {

using bf16 = __nv_bfloat16;

// ---- conversions and elementwise helpers (any T of float / bf16).
template <typename Dst, typename Src>
Status Convert(CudaContext& ctx, Dst* dst, const Src* src, int64_t n);
template <typename T>
Status Fill(CudaContext& ctx, T* dst, float value, int64_t n);

// ---- embedding: out[i,:] = wte[tokens[i],:] + wpe[positions[i],:].
template <typename T>
Status EmbeddingForward(CudaContext& ctx, T* out, const int32_t* tokens, const int32_t* positions,
                        const T* wte, const T* wpe, int64_t N, int64_t C);
// dwte[tokens[i],:] += dout[i,:]; dwpe[positions[i],:] += dout[i,:] (dwpe may be null).
template <typename T>
Status EmbeddingBackward(CudaContext& ctx, float* dwte, float* dwpe, const T* dout,
                         const int32_t* tokens, const int32_t* positions, int64_t N, int64_t C);

// ---- LayerNorm over the last dim; mean and rstd (N floats each) are saved for backward.
template <typename T>
Status LayerNormForward(CudaContext& ctx, T* out, float* mean, float* rstd, const T* inp,
                        const T* weight, const T* bias, int64_t N, int64_t C, double eps);
// dinp (+)= ...; dweight += Σ dout·x̂; dbias += Σ dout (deterministic two-pass reductions).
template <typename T>
Status LayerNormBackward(CudaContext& ctx, T* dinp, float* dweight, float* dbias, const T* dout,
                         const T* inp, const T* weight, const float* mean, const float* rstd,
                         int64_t N, int64_t C, bool accumulate = true);

// ---- matmul (a Linear layer): out[N,OC] = inp[N,C]·weight[OC,C]ᵀ + bias[OC] (bias may be null).
// Row strides: out has ld_out (0: OC).
template <typename T>
Status MatmulForward(CudaContext& ctx, T* out, const T* inp, const T* weight, const T* bias,
                     int64_t N, int64_t C, int64_t OC, int64_t ld_out = 0);
struct MatmulBackwardOptions {
  bool accumulate_dinp = true;  // false: dinp = dout·weight
  int64_t ld_dout = 0;          // row stride of dout; 0: OC (the LM head passes its padded vocab)
};
// dinp[N,C] (+)= dout·weight; dweight[OC,C] += doutᵀ·inp; dbias[OC] += Σ_rows dout.
// dinp and dbias may be null.
template <typename T>
Status MatmulBackward(CudaContext& ctx, T* dinp, float* dweight, float* dbias, const T* dout,
                      const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC,
                      const MatmulBackwardOptions& options = {});

// Mixed precision (train.precision: bf16): bf16 operands, float32 output and accumulation.
// out[N,OC] = inp·weightᵀ + bias (float32 bias, may be null), overwritten.
Status MatmulForwardMixed(CudaContext& ctx, float* out, const bf16* inp, const bf16* weight,
                          const float* bias, int64_t N, int64_t C, int64_t OC);
// dinp[N,C] += dout·weight and dweight[OC,C] += doutᵀ·inp, both float32 (either may be null);
// the bias gradient is the caller's (ColumnSum of the float32 dout).
Status MatmulBackwardMixed(CudaContext& ctx, float* dinp, float* dweight, const bf16* dout,
                           const bf16* inp, const bf16* weight, int64_t N, int64_t C, int64_t OC);

// Column sums: out[c] += Σ_i x[i·ld + c] for c < C (deterministic; the bias gradient).
template <typename T>
Status ColumnSum(CudaContext& ctx, float* out, const T* x, int64_t N, int64_t C, int64_t ld);

// ---- causal multi-head attention, flash-attention style (no T×T matrix in memory).
// Shapes as the CPU kernel: q (B,H,Tq,D), k and v (B,H,Tk,D), out (B,H,Tq,D), lse (B,H,Tq)
// float32 contiguous. Query i of sequence b sees key j iff q_lo[b·Tq + i] <= k_pos[j] <= q_pos[i]
// (options.q_lo: the first position each query sees, a sliding window's or its document's start;
// null: causal only); a row that sees no key gets out = 0 and lse = -inf. Each tensor may instead
// be a strided view (HeadLayout) whose D elements are contiguous, e.g. q, k and v read straight out
// of the fused qkv (B,T,3,H,D) rows.
struct HeadLayout {
  int64_t batch = 0, head = 0, token = 0;  // element strides; all 0: contiguous (B,H,T,D)
};
enum class AttentionAlgo {
  kAuto,        // kTensorCore when supported (bf16, D == 64), else kGeneric
  kGeneric,     // float32 CUDA-core math, any D ≤ 256, float or bf16
  kTensorCore,  // bf16 WMMA (sm_80+), D == 64; INVALID_ARGUMENT otherwise
};
struct AttentionOptions {
  HeadLayout q, k, v, out;  // dq, dk, dv and dout share the layouts of q, k, v and out
  AttentionAlgo algo = AttentionAlgo::kAuto;
  bool accumulate = true;         // backward: false overwrites dq, dk, dv
  const int32_t* q_lo = nullptr;  // (B,Tq) on the device: each query's first visible position
};
// True when kAuto picks the tensor-core kernels for this element type and head size.
template <typename T>
bool AttentionUsesTensorCores(int64_t D, AttentionAlgo algo = AttentionAlgo::kAuto);

template <typename T>
Status AttentionForward(CudaContext& ctx, T* out, float* lse, const T* q, const T* k, const T* v,
                        const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t H,
                        int64_t Tq, int64_t Tk, int64_t D, double scale,
                        const AttentionOptions& options = {});
// out and lse are those of the full attention of each row (after any merge), as on CPU.
template <typename T>
Status AttentionBackward(CudaContext& ctx, T* dq, T* dk, T* dv, const T* dout, const T* q,
                         const T* k, const T* v, const T* out, const float* lse,
                         const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t H,
                         int64_t Tq, int64_t Tk, int64_t D, double scale,
                         const AttentionOptions& options = {});
// Merges (out_b, lse_b) into (out_a, lse_a) in place; rows = B·H·Tq, contiguous rows of D.
template <typename T>
Status AttentionMerge(CudaContext& ctx, T* out_a, float* lse_a, const T* out_b, const float* lse_b,
                      int64_t rows, int64_t D);

// ---- tanh-GELU (gelu_new).
template <typename T>
Status GeluForward(CudaContext& ctx, T* out, const T* inp, int64_t n);
// dinp (+)= gelu'(inp)·dout. dinp may alias dout (then pass accumulate = false).
template <typename T>
Status GeluBackward(CudaContext& ctx, T* dinp, const T* inp, const T* dout, int64_t n,
                    bool accumulate = true);

// ---- residual: out = a + b; Accumulate: dst += src.
template <typename T>
Status ResidualForward(CudaContext& ctx, T* out, const T* a, const T* b, int64_t n);
template <typename T>
Status Accumulate(CudaContext& ctx, T* dst, const T* src, int64_t n);

// ---- fused softmax cross-entropy over V classes for N rows with row stride ld (0: V).
// losses[i] = −log softmax(logits[i,:V])[targets[i]] (float32). If dlogits is non-null:
// dlogits[i,:V] = grad_scale·(softmax − onehot) and dlogits[i,V:ld] = 0 (overwritten; may alias
// logits).
template <typename T>
Status SoftmaxCrossEntropy(CudaContext& ctx, float* losses, T* dlogits, const T* logits,
                           const int32_t* targets, int64_t N, int64_t V, float grad_scale,
                           int64_t ld = 0);

// ---- optimizer and clipping (float32 master weights and state).
// torch.optim.AdamW on n elements, step 1-based, with the gradient multiplied by grad_scale
// first (the clip factor). When param_copy is non-null it receives the updated weights in its
// type (the bf16 weights the next forward reads).
template <typename T>
Status AdamW(CudaContext& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
             double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
             float grad_scale = 1.0f, T* param_copy = nullptr);
// Lion on n elements, op for op as the CPU kernel (engine/cuda/lion.cu).
Status Lion(CudaContext& ctx, float* param, const float* grad, float* m, int64_t n, double lr,
            double beta1, double beta2, double weight_decay);
// Σ x² accumulated in double, deterministic; synchronizes to return the value.
StatusOr<double> SumOfSquares(CudaContext& ctx, const float* x, int64_t n);
// Σ x in double (the loss sum); synchronizes.
StatusOr<double> Sum(CudaContext& ctx, const float* x, int64_t n);
Status Scale(CudaContext& ctx, float* x, int64_t n, double s);  // x *= s

// ---- the rest of the one model's ops (engine/cuda/model_ops.cu; float32 only), with the
// semantics of the CPU kernels of the same names: backward kernels accumulate.
// RMSNorm: rstd (N) saved; dweight by a fixed-order column sum.
template <typename T>
Status RMSNormForward(CudaContext& ctx, T* out, float* rstd, const T* inp, const T* weight,
                      int64_t N, int64_t C, double eps);
template <typename T>
Status RMSNormBackward(CudaContext& ctx, T* dinp, float* dweight, const T* dout, const T* inp,
                       const T* weight, const float* rstd, int64_t N, int64_t C);
// SwiGLU over rows [gate (F) | up (F)].
template <typename T>
Status SwiGLUForward(CudaContext& ctx, T* out, const T* gate_up, int64_t N, int64_t F);
template <typename T>
Status SwiGLUBackward(CudaContext& ctx, T* dgate_up, const T* gate_up, const T* dout, int64_t N,
                      int64_t F);
// GeGLU (gelu_tanh(gate)·up) over the same rows.
template <typename T>
Status GeGLUForward(CudaContext& ctx, T* out, const T* gate_up, int64_t N, int64_t F);
template <typename T>
Status GeGLUBackward(CudaContext& ctx, T* dgate_up, const T* gate_up, const T* dout, int64_t N,
                     int64_t F);
// Rotary embeddings (half-split) in place; cos/sin (Tn, D/2).
template <typename T>
Status RopeForward(CudaContext& ctx, T* x, const T* cos, const T* sin, int64_t BH, int64_t Tn,
                   int64_t D);
template <typename T>
Status RopeBackward(CudaContext& ctx, T* dx, const T* cos, const T* sin, int64_t BH, int64_t Tn,
                    int64_t D);
// Vocab-parallel embedding rows [first, first + rows); the backward adds with float atomics.
template <typename T>
Status EmbeddingRowsForward(CudaContext& ctx, T* out, const int32_t* idx, const T* table,
                            int64_t first, int64_t rows, int64_t N, int64_t C);
template <typename T>
Status EmbeddingRowsBackward(CudaContext& ctx, float* dtable, const T* dout, const int32_t* idx,
                             int64_t first, int64_t rows, int64_t N, int64_t C);
// x[i,:] += table[idx[i],:] (positions); out[i,:] += bias.
template <typename T>
Status AddRows(CudaContext& ctx, T* x, const T* table, const int32_t* idx, int64_t N, int64_t C);
template <typename T>
Status AddBias(CudaContext& ctx, T* out, const T* bias, int64_t N, int64_t C);
// Vocab-parallel cross-entropy (see cpu::VocabShardStats).
template <typename T>
Status VocabShardStats(CudaContext& ctx, float* stats, const T* logits, const int32_t* targets,
                       int64_t first, int64_t N, int64_t V);
template <typename T>
Status VocabShardLoss(CudaContext& ctx, T* losses, T* lse, const T* all_stats,
                      const int32_t* targets, int64_t shards, int64_t N);
template <typename T>
Status VocabShardGrad(CudaContext& ctx, T* dlogits, const T* logits, const T* lse,
                      const int32_t* targets, int64_t first, int64_t N, int64_t V,
                      float grad_scale);
// Attention layouts (see cpu::SplitHeads and the functions after it).
template <typename T>
Status SplitHeads(CudaContext& ctx, T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn,
                  int64_t H, int64_t K, int64_t D);
template <typename T>
Status MergeQkvGrads(CudaContext& ctx, T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B,
                     int64_t Tn, int64_t H, int64_t K, int64_t D);
template <typename T>
Status HeadsToRows(CudaContext& ctx, T* rows, const T* heads, int64_t B, int64_t Tn, int64_t H,
                   int64_t D);
template <typename T>
Status RowsToHeads(CudaContext& ctx, T* heads, const T* rows, int64_t B, int64_t Tn, int64_t H,
                   int64_t D);
template <typename T>
Status BlocksToSequence(CudaContext& ctx, T* seq, const T* blocks, int64_t n, int64_t BH,
                        int64_t Tl, int64_t D);
template <typename T>
Status SequenceToBlocks(CudaContext& ctx, T* blocks, const T* seq, int64_t n, int64_t BH,
                        int64_t Tl, int64_t D);

}  // namespace meshrun::gpu
