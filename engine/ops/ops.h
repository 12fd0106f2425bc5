// The device-generic ops of the model: one function per op, taking the device its buffers live
// on and dispatching once per call (never per element) to the CPU kernel of
// engine/kernels/cpu/kernels.h or the CUDA kernel of engine/cuda/kernels.h. The model
// (engine/model/gpt2.*), the sharded state and the optimizer call only these.
//
// Semantics are those of the CPU kernels (row-major, backward kernels ACCUMULATE, attention masks
// by global positions). Every pointer argument is a buffer on `dev` (token ids and positions
// included); host↔device traffic goes through CopyFromHost / CopyToHost and the scalar results
// (Sum, SumOfSquares).
//
// On cuda: float32 only (T = double answers INVALID_ARGUMENT; bf16 GEMMs: SetMatmulPrecision); work
// is enqueued on the device's compute stream (ops::ComputeStreamOf) and the functions that return a
// host value synchronize. In an engine built without CUDA every op on a cuda device answers
// UNAVAILABLE saying so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "engine/core/tensor.h"

namespace meshrun::ops {

// True when this engine was built with the CUDA path.
bool CudaBuilt();

// ---- memory.
Status CopyFromHost(Device dev, void* dst, const void* host_src, size_t bytes);  // then complete
Status CopyToHost(Device dev, void* host_dst, const void* src, size_t bytes);    // synchronizes
Status Copy(Device dev, void* dst, const void* src, size_t bytes);               // same device
Status Zero(Device dev, void* dst, size_t bytes);
template <typename T>
Status Fill(Device dev, T* dst, double value, int64_t n);
// Waits for everything enqueued on dev (no-op on cpu).
Status Synchronize(Device dev);
// The stream the ops enqueue on for `dev` (a cudaStream_t; null on cpu), for the communicator
// that must order its collectives after them (MeshComms::SetComputeStream).
StatusOr<void*> ComputeStreamOf(Device dev);

// ---- mixed precision (train.precision: bf16, cuda only). With kBf16 set for a cuda device,
// MatmulForward / MatmulBackward<float> on it cast their operands (input, weight, output
// gradient) to bf16 and run the GEMMs in bf16 on cuBLASLt with float32 accumulation and float32
// results (outputs, input gradients, weight gradients, bias gradients from the float32 dout);
// every other op stays float32. A GEMM cuBLASLt has no bf16 algorithm for runs in float32. Per
// device and process-wide (the rank's trainer sets it at start). A cpu device takes only kFloat32
// (INVALID_ARGUMENT otherwise).
enum class MatmulPrecision { kFloat32, kBf16 };
Status SetMatmulPrecision(Device dev, MatmulPrecision precision);
// The bf16 GEMMs keep the bf16 copy of the last weight they read while nothing may have written
// it: every op here that may write parameters (copies, fills, Zero, Scale, AdamW, CastFromBf16)
// says so itself; a caller that writes parameters another way (a collective into a gathered
// unit) calls this. No-op on cpu.
void ParametersChanged(Device dev);
MatmulPrecision MatmulPrecisionOf(Device dev);
// bf16 (stored as its 16 bits) ↔ float32, round to nearest even; on any device.
Status CastToBf16(Device dev, uint16_t* dst, const float* src, int64_t n);
Status CastFromBf16(Device dev, float* dst, const uint16_t* src, int64_t n);

// ---- linear layers: out[N,OC] = inp[N,C]·weight[OC,C]ᵀ + bias (bias may be null);
// dinp += dout·weight (accumulate_dinp false: dinp = dout·weight, without a zeroing pass);
// dweight += doutᵀ·inp; dbias += Σ_rows dout (each may be null; without dinp the weight is not
// read and may be null).
template <typename T>
Status MatmulForward(Device dev, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                     int64_t C, int64_t OC);
template <typename T>
Status MatmulBackward(Device dev, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                      const T* weight, int64_t N, int64_t C, int64_t OC,
                      bool accumulate_dinp = true);
// out[i,:] += bias (row-parallel layers add it after the tp reduce); dbias += Σ_rows dout.
template <typename T>
Status AddBias(Device dev, T* out, const T* bias, int64_t N, int64_t C);
template <typename T>
Status BiasBackward(Device dev, T* dbias, const T* dout, int64_t N, int64_t C);

// ---- norms (mean/rstd saved for backward, N each; RMSNorm keeps no mean).
template <typename T>
Status LayerNormForward(Device dev, T* out, T* mean, T* rstd, const T* inp, const T* weight,
                        const T* bias, int64_t N, int64_t C, double eps);
template <typename T>
Status LayerNormBackward(Device dev, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                         const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C);
template <typename T>
Status RMSNormForward(Device dev, T* out, T* rstd, const T* inp, const T* weight, int64_t N,
                      int64_t C, double eps);
template <typename T>
Status RMSNormBackward(Device dev, T* dinp, T* dweight, const T* dout, const T* inp,
                       const T* weight, const T* rstd, int64_t N, int64_t C);

// ---- activations and residuals.
template <typename T>
Status GeluForward(Device dev, T* out, const T* inp, int64_t n);
template <typename T>
Status GeluBackward(Device dev, T* dinp, const T* inp, const T* dout, int64_t n,
                    bool accumulate = true);
template <typename T>
Status SwiGLUForward(Device dev, T* out, const T* gate_up, int64_t N, int64_t F);
template <typename T>
Status SwiGLUBackward(Device dev, T* dgate_up, const T* gate_up, const T* dout, int64_t N,
                      int64_t F);
template <typename T>  // gelu_tanh(gate)·up over [gate | up] rows (Gemma)
Status GeGLUForward(Device dev, T* out, const T* gate_up, int64_t N, int64_t F);
template <typename T>
Status GeGLUBackward(Device dev, T* dgate_up, const T* gate_up, const T* dout, int64_t N,
                     int64_t F);
template <typename T>
Status ResidualForward(Device dev, T* out, const T* a, const T* b, int64_t n);
template <typename T>
Status Accumulate(Device dev, T* dst, const T* src, int64_t n);  // dst += src

// ---- embeddings. Rows of a table at an offset (vocab parallel): out[i] = table[idx[i] − first]
// for the indices this shard holds, else 0; backward dtable[idx[i] − first] += dout[i].
// AddRows: x[i] += table[idx[i]] (the position embedding; its backward is EmbeddingRowsBackward
// with first 0).
template <typename T>
Status EmbeddingRowsForward(Device dev, T* out, const int32_t* idx, const T* table, int64_t first,
                            int64_t rows, int64_t N, int64_t C);
template <typename T>
Status EmbeddingRowsBackward(Device dev, T* dtable, const T* dout, const int32_t* idx,
                             int64_t first, int64_t rows, int64_t N, int64_t C);
template <typename T>
Status AddRows(Device dev, T* x, const T* table, const int32_t* idx, int64_t N, int64_t C);

// ---- rotary embeddings in place (half-split), cos/sin (Tn, D/2) on dev.
template <typename T>
Status RopeForward(Device dev, T* x, const T* cos, const T* sin, int64_t BH, int64_t Tn, int64_t D);
template <typename T>
Status RopeBackward(Device dev, T* dx, const T* cos, const T* sin, int64_t BH, int64_t Tn,
                    int64_t D);

// ---- attention layout. qkv rows [q (H·D) | k (K·D) | v (K·D)] → q, k, v (B,H,T,D) with kv head
// h/(H/K) repeated for query head h; MergeQkvGrads is its transpose (sums the repeats, overwrites
// dqkv). HeadsToRows: (B,H,T,D) → (B,T,H·D); RowsToHeads the inverse. BlocksToSequence: gathered
// blocks [j][BH][Tl][D] → (BH, n·Tl, D); SequenceToBlocks the inverse.
template <typename T>
Status SplitHeads(Device dev, T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn, int64_t H,
                  int64_t K, int64_t D);
template <typename T>
Status MergeQkvGrads(Device dev, T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B,
                     int64_t Tn, int64_t H, int64_t K, int64_t D);
template <typename T>
Status HeadsToRows(Device dev, T* rows, const T* heads, int64_t B, int64_t Tn, int64_t H,
                   int64_t D);
template <typename T>
Status RowsToHeads(Device dev, T* heads, const T* rows, int64_t B, int64_t Tn, int64_t H,
                   int64_t D);
template <typename T>
Status BlocksToSequence(Device dev, T* seq, const T* blocks, int64_t n, int64_t BH, int64_t Tl,
                        int64_t D);
template <typename T>
Status SequenceToBlocks(Device dev, T* blocks, const T* seq, int64_t n, int64_t BH, int64_t Tl,
                        int64_t D);

// ---- causal attention (flash style) with log-sum-exp, its backward, and the lse merge of
// partial results (context parallel ring). See cpu::AttentionForward (q_lo: the first key
// position each query of each sequence sees, (B,Tq); null: causal only).
template <typename T>
Status AttentionForward(Device dev, T* out, T* lse, const T* q, const T* k, const T* v,
                        const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t H,
                        int64_t Tq, int64_t Tk, int64_t D, double scale,
                        const int32_t* q_lo = nullptr);
template <typename T>
Status AttentionBackward(Device dev, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                         const T* v, const T* out, const T* lse, const int32_t* q_pos,
                         const int32_t* k_pos, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                         int64_t D, double scale, const int32_t* q_lo = nullptr);
template <typename T>
Status AttentionMerge(Device dev, T* out_a, T* lse_a, const T* out_b, const T* lse_b, int64_t rows,
                      int64_t D);

// ---- losses. SoftmaxCrossEntropy: losses[i] and (dlogits non-null) dlogits = grad_scale·
// (softmax − onehot), overwritten, may alias logits. A negative target (kIgnoreTarget) is
// ignored: loss 0, gradient 0. The vocab-shard trio: see cpu::VocabShardStats.
template <typename T>
Status SoftmaxCrossEntropy(Device dev, T* losses, T* dlogits, const T* logits,
                           const int32_t* targets, int64_t N, int64_t V, double grad_scale);
template <typename T>
Status VocabShardStats(Device dev, T* stats, const T* logits, const int32_t* targets, int64_t first,
                       int64_t N, int64_t V);
template <typename T>
Status VocabShardLoss(Device dev, T* losses, T* lse, const T* all_stats, const int32_t* targets,
                      int64_t shards, int64_t N);
template <typename T>
Status VocabShardGrad(Device dev, T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                      int64_t first, int64_t N, int64_t V, double grad_scale);

// ---- reductions and the optimizer (host results synchronize).
template <typename T>
StatusOr<double> Sum(Device dev, const T* x, int64_t n);  // in double, fixed order
template <typename T>
StatusOr<double> SumOfSquares(Device dev, const T* x, int64_t n);
template <typename T>
Status Scale(Device dev, T* x, int64_t n, double s);  // x *= s
// torch.optim.AdamW; step 1-based.
template <typename T>
Status AdamW(Device dev, T* param, const T* grad, T* m, T* v, int64_t n, double lr, double beta1,
             double beta2, double eps, double weight_decay, int64_t step);
// Lion (Chen et al. 2023) on float32 master weights and momentum (engine/train/optimizer.h).
Status Lion(Device dev, float* param, const float* grad, float* m, int64_t n, double lr,
            double beta1, double beta2, double weight_decay);

}  // namespace meshrun::ops
