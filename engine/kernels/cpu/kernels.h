// CPU kernels of the engine: each op has a forward and a backward, on raw pointers (llm.c
// style), templated on the element type so the tests can check every backward in float64
// against central finite differences while training runs in float32.
//
// Conventions for every kernel here:
//  - Row-major, contiguous buffers; N is a number of rows (tokens), C a row width.
//  - Backward kernels ACCUMULATE (+=) into every gradient they write, so gradient
//    accumulation over micro-batches and partial (ring) contributions need no extra buffers.
//  - Results are deterministic for a fixed thread count (no atomics, fixed reduction order),
//    which the bit-for-bit resume test relies on.
//  - Multithreaded with OpenMP; the thread count is SetNumThreads() (set once at rank start
//    from the spec or OMP_NUM_THREADS).
#pragma once

#include <cstdint>

namespace meshrun::cpu {

// Threads used by every kernel. n <= 0 keeps the current setting. With OpenMP, OpenBLAS runs
// single-threaded and Gemm splits each product over the OpenMP team itself (one thread pool;
// docs/decisions/0013); without OpenMP, OpenBLAS gets the n threads.
void SetNumThreads(int n);
int NumThreads();

// ---- general matrix multiply, the building block of Matmul and Attention (row-major):
// C[M,N] = alpha·op(A)·op(B) + beta·C, op(X) = Xᵀ when trans_x; A is M×K after op, B is K×N.
// lda/ldb/ldc are the row strides of the buffers as stored. beta = 0 overwrites C (even NaN).
// Gemm uses BLAS (sgemm/dgemm) when built with it, else GemmFallback, the built-in blocked
// kernel that is always compiled (the tests compare the two). GemmFallback is deterministic
// for any thread count and runs serially when called from inside a parallel region.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
template <typename T>
void GemmFallback(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
// What Gemm and Matmul use, for the rank's start-up log: "openblas (<core>)", with
// ", selected by meshrun; OpenBLAS chose <core>" when the first Gemm switched OpenBLAS's core, or
// "fallback" followed by why in parentheses. An OpenBLAS too old to know this CPU loads SSE3
// kernels (core "Prescott"); the first Gemm switches it to SkylakeX on AVX-512 CPUs and Haswell on
// AVX2 ones (Haswell also where MESHRUN_NO_AVX512=1) unless OPENBLAS_CORETYPE is set, and uses
// GemmFallback where that fails (decision 0041).
const char* GemmBackend();
// The OPENBLAS_CORETYPE that makes OpenBLAS use this CPU's vector units ("SkylakeX" or
// "Haswell") when the first Gemm could not switch OpenBLAS to it itself, or "" when OpenBLAS's
// core is right, the variable is already set, or there is no OpenBLAS.
const char* OpenBlasCoreTypeHint();
// The instruction set of attention's tile GEMM: "avx512", "avx2" (also where
// MESHRUN_NO_AVX512=1) or "sse2" (MESHRUN_FORCE_SCALAR=1). The e^x, GELU and softmax row loops
// are AVX2 at most (simd.h).
const char* KernelIsa();

// The rate of MatmulForward at 512³ (0.27 GFLOP; the fastest of ≥ 10 calls over ≥ 60 ms, after
// one untimed call) with the current threads, in FLOP/s: near the GEMM's steady rate and short
// enough for every rank start. The one measurement behind MFU on CPU and the planner's
// calibration.
double MeasureMatmulFlops();

// ---- embedding: out[i,:] = wte[tokens[i],:] + wpe[positions[i],:]
// positions are global positions (context parallel passes non-contiguous ones).
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                      const T* wpe, int64_t N, int64_t C);
// dwte[tokens[i],:] += dout[i,:]; dwpe[positions[i],:] += dout[i,:]. dwpe may be null.
template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                       const int32_t* positions, int64_t N, int64_t C);

// ---- LayerNorm over the last dim. mean and rstd (N each) are saved for backward.
template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t N, int64_t C, double eps);
template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t N, int64_t C);

// ---- matmul (a Linear layer): out[N,OC] = inp[N,C] · weight[OC,C]ᵀ + bias[OC].
// weight has PyTorch Linear layout (out, in). bias may be null. Uses BLAS (OpenBLAS sgemm /
// dgemm) when built with it, else a blocked fallback.
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                   int64_t OC);
// dinp[N,C] += dout·weight (= with accumulate_dinp false: no zeroing pass, no read of dinp);
// dweight[OC,C] += doutᵀ·inp; dbias[OC] += Σ_rows dout. dinp, dweight and dbias may be null.
template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int64_t N, int64_t C, int64_t OC, bool accumulate_dinp = true);

// ---- causal multi-head attention, blocked with online softmax (flash-attention style):
// never more than one block of scores per head in memory.
// q: (B,H,Tq,D); k, v: (B,H,Tk,D); out: (B,H,Tq,D); lse: (B,H,Tq) log-sum-exp of the scaled
// scores of each query row. Query i of sequence b sees key j iff
// q_lo[b·Tq + i] <= k_pos[j] <= q_pos[i] (global positions, so context-parallel chunks and ring
// blocks work unchanged; q_lo, (B,Tq), is the first position each query sees: a sliding window's
// or its document's start; null: causal only). A row that sees no key gets out = 0 and
// lse = -inf. scale is usually 1/sqrt(D).
template <typename T>
void AttentionForward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* q_pos,
                      const int32_t* k_pos, int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                      double scale, const int32_t* q_lo = nullptr);
// Recomputes the scores block by block. out and lse are those of the FULL attention of each
// query row (after any log-sum-exp merge across blocks), so calling this once per K/V block
// with the merged out/lse yields exact gradients for a ring. dq, dk, dv are accumulated.
template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                       const T* out, const T* lse, const int32_t* q_pos, const int32_t* k_pos,
                       int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, double scale,
                       const int32_t* q_lo = nullptr);
// Merges a partial attention result (out_b, lse_b) into (out_a, lse_a) in place:
// lse = log(exp(lse_a) + exp(lse_b)); out = (exp(lse_a-lse)·out_a + exp(lse_b-lse)·out_b).
// rows = B·H·Tq.
template <typename T>
void AttentionMerge(T* out_a, T* lse_a, const T* out_b, const T* lse_b, int64_t rows, int64_t D);

// ---- tanh-GELU (gelu_new): 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))).
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);
template <typename T>
// dinp += gelu'(inp)·dout (= when not accumulate: no zeroing pass, no read of dinp).
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, bool accumulate = true);

// ---- residual: out = a + b; its backward is Accumulate(da, dout) and Accumulate(db, dout).
template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n);
template <typename T>
void Accumulate(T* dst, const T* src, int64_t n);  // dst += src

// ---- fused softmax cross-entropy over V classes for N rows.
// losses[i] = -log softmax(logits[i,:])[targets[i]], targets[i] in [0, V).
// If dlogits is non-null: dlogits[i,:] = grad_scale·(softmax(logits[i,:]) − onehot(targets[i]))
// (overwritten, not accumulated; dlogits may alias logits to save memory).
// A negative target (kIgnoreTarget) is ignored: losses[i] = 0 and dlogits[i,:] = 0.
template <typename T>
void SoftmaxCrossEntropy(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                         int64_t V, T grad_scale);

// ---- RMSNorm over the last dim (Llama): out = weight·x·rstd, rstd = (mean(x²) + eps)^(-1/2),
// saved (N) for backward. dinp and dweight accumulate.
template <typename T>
void RMSNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                    double eps);
template <typename T>
void RMSNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int64_t N, int64_t C);

// ---- SwiGLU: gate_up rows hold [gate (F) | up (F)]; out[N,F] = silu(gate)·up.
template <typename T>
void SwiGLUForward(T* out, const T* gate_up, int64_t N, int64_t F);
template <typename T>
void SwiGLUBackward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t F);
// ---- GeGLU (Gemma): the same rows; out[N,F] = gelu_tanh(gate)·up.
template <typename T>
void GeGLUForward(T* out, const T* gate_up, int64_t N, int64_t F);
template <typename T>
void GeGLUBackward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t F);

// ---- rotary embeddings in the half-split (rotate_half) convention, in place on x (BH·Tn rows
// of D): (a, b) = (x[i], x[i + D/2]) → (a·cos − b·sin, b·cos + a·sin), with cos/sin (Tn, D/2)
// for the row's token t = row mod Tn. Backward applies the transpose to the gradient in place.
template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int64_t BH, int64_t Tn, int64_t D);
template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int64_t BH, int64_t Tn, int64_t D);

// ---- vocab-parallel embedding: this rank holds rows [first, first + rows) of the table.
// out[i,:] = table[tokens[i] − first,:] for its tokens, 0 for the others (the tp all-reduce
// then sums the shards); dtable[tokens[i] − first,:] += dout[i,:] for its tokens.
template <typename T>
void EmbeddingRowsForward(T* out, const int32_t* tokens, const T* table, int64_t first,
                          int64_t rows, int64_t N, int64_t C);
template <typename T>
void EmbeddingRowsBackward(T* dtable, const T* dout, const int32_t* tokens, int64_t first,
                           int64_t rows, int64_t N, int64_t C);

// ---- vocab-parallel cross-entropy (Megatron): logits (N, V) of the classes [first, first + V)
// this rank holds. VocabShardStats writes per row {log-sum-exp of its logits, the target's
// logit if it holds the target else 0} (2·N values); after an all-gather of every shard's
// stats (shards × 2N), VocabShardLoss gives each row's loss and whole-vocabulary log-sum-exp,
// and VocabShardGrad dlogits = grad_scale·(softmax − onehot) over this shard (overwritten; may
// alias logits). Rows with a negative target (ignored) get loss 0 and a zero gradient.
template <typename T>
void VocabShardStats(T* stats, const T* logits, const int32_t* targets, int64_t first, int64_t N,
                     int64_t V);
template <typename T>
void VocabShardLoss(T* losses, T* lse, const T* all_stats, const int32_t* targets, int64_t shards,
                    int64_t N);
template <typename T>
void VocabShardGrad(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                    int64_t first, int64_t N, int64_t V, T grad_scale);

// ---- optimizer and clipping.
// torch.optim.AdamW for n elements; step is 1-based (bias correction uses it).
// p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
// p ← p − lr·(m/(1−β1^step)) / (sqrt(v/(1−β2^step)) + eps).
template <typename T>
void AdamW(T* param, const T* grad, T* m, T* v, int64_t n, double lr, double beta1, double beta2,
           double eps, double weight_decay, int64_t step);
// Lion (Chen et al. 2023) for n float32 elements: p ← p·(1 − lr·wd);
// p ← p − lr·sign(β1·m + (1−β1)·g); m ← β2·m + (1−β2)·g (engine/kernels/cpu/lion.cc).
void Lion(float* param, const float* grad, float* m, int64_t n, double lr, double beta1,
          double beta2, double weight_decay);
// Σ x² in double, deterministic for a fixed thread count.
template <typename T>
double SumOfSquares(const T* x, int64_t n);
template <typename T>
void Scale(T* x, int64_t n, double s);  // x *= s

// ---- data movement of the model (engine/kernels/cpu/layout.cc).
// qkv rows [q (H·D) | k (K·D) | v (K·D)] → q, k, v (B,H,T,D); query head h reads kv head
// h/(H/K). MergeQkvGrads is the transpose: dqkv overwritten, repeated kv heads summed in order.
template <typename T>
void SplitHeads(T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t K,
                int64_t D);
template <typename T>
void MergeQkvGrads(T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B, int64_t Tn, int64_t H,
                   int64_t K, int64_t D);
// (B,H,T,D) → (B,T,H·D) and back.
template <typename T>
void HeadsToRows(T* rows, const T* heads, int64_t B, int64_t Tn, int64_t H, int64_t D);
template <typename T>
void RowsToHeads(T* heads, const T* rows, int64_t B, int64_t Tn, int64_t H, int64_t D);
// Gathered blocks [j][BH][Tl][D] → one sequence (BH, n·Tl, D) whose key j·Tl + t is token t of
// block j, and back.
template <typename T>
void BlocksToSequence(T* seq, const T* blocks, int64_t n, int64_t BH, int64_t Tl, int64_t D);
template <typename T>
void SequenceToBlocks(T* blocks, const T* seq, int64_t n, int64_t BH, int64_t Tl, int64_t D);
// out[i,:] += bias; dbias += Σ_rows dout (fixed order); x[i,:] += table[idx[i],:].
template <typename T>
void AddBias(T* out, const T* bias, int64_t N, int64_t C);
template <typename T>
void BiasBackward(T* dbias, const T* dout, int64_t N, int64_t C);
template <typename T>
void AddRows(T* x, const T* table, const int32_t* idx, int64_t N, int64_t C);

}  // namespace meshrun::cpu
