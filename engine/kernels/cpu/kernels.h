// CPU kernels of the engine: each op has a forward and a backward, on raw pointers (llm.c
// style), templated on the element type so the tests can check every backward in float64
// against central finite differences while training runs in float32 (the product instantiates
// float only; the tests link float64 twins: engine/core/element_type.h, decision 0067).
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

#include "engine/core/element_type.h"
#include "engine/ops/op_table_macros.h"

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

// ---- the ops: one CPU kernel per row of the op table (engine/ops/op_table.inc), which holds its
// parameters and contract. A row MESHRUN_OP(Name, (type, name)...) declares here
//   template <typename T> void Name(type name, ...);
// (a MESHRUN_REDUCTION_OP returns double; a MESHRUN_FLOAT_OP is float32 only, no template). T is
// float in the product and double in the float64 twins the gradient tests link (element_type.h).
// The kernels are defined in this directory's files, each of which instantiates its own with
// MESHRUN_INSTANTIATE_CPU_KERNELS (below).
#define MESHRUN_OP(name, ...) \
  template <typename T>       \
  void name(MESHRUN_PP_LIST(MESHRUN_PARAM_DECL, __VA_ARGS__));
#define MESHRUN_REDUCTION_OP(name, ...) \
  template <typename T>                 \
  double name(MESHRUN_PP_LIST(MESHRUN_PARAM_DECL, __VA_ARGS__));
#define MESHRUN_FLOAT_OP(name, ...) void name(MESHRUN_PP_LIST(MESHRUN_PARAM_DECL, __VA_ARGS__));
#include "engine/ops/op_table.inc"

// The function type of each templated kernel, for the explicit instantiations.
namespace signature {
#define MESHRUN_OP(name, ...) \
  template <typename T>       \
  using name = void(MESHRUN_PP_LIST(MESHRUN_PARAM_TYPE, __VA_ARGS__));
#define MESHRUN_REDUCTION_OP(name, ...) \
  template <typename T>                 \
  using name = double(MESHRUN_PP_LIST(MESHRUN_PARAM_TYPE, __VA_ARGS__));
#define MESHRUN_FLOAT_OP(name, ...)
#include "engine/ops/op_table.inc"
}  // namespace signature

// Instantiates the named kernels of the op table (defined in the calling file, inside namespace
// meshrun::cpu) for this library's element type: MESHRUN_INSTANTIATE_CPU_KERNELS(GeluForward,
// GeluBackward).
#define MESHRUN_INSTANTIATE_CPU_KERNEL(name) \
  template signature::name<MESHRUN_ELEMENT_TYPE> name<MESHRUN_ELEMENT_TYPE>;
#define MESHRUN_INSTANTIATE_CPU_KERNELS(...) \
  MESHRUN_PP_EACH(MESHRUN_INSTANTIATE_CPU_KERNEL, __VA_ARGS__)

}  // namespace meshrun::cpu
