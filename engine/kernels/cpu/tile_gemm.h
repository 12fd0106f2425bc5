// Internal to the CPU kernels: small dense products on operands as they lie in memory, for
// attention's 64-row blocks (head dim 32–128). No packing: op(A) is read with row stride lda
// (or, transposed, column stride lda) and broadcast one element at a time, B is read a row of
// vectors at a time, so a 64 × 64 × 32 product costs no more than its multiply-adds. One body
// (tile_gemm_impl.h) is compiled for AVX-512, AVX2/FMA and baseline SSE2, and the widest this
// CPU runs is chosen once at first use (docs/decisions/0026). Single-threaded.
#pragma once

#include <cstdint>

namespace meshrun::cpu::internal {

// C[m,n] = alpha · op(A)·B, or C += alpha · op(A)·B when `accumulate`, where
// op(A)[i,p] = A[i·lda + p] (trans_a false) or A[p·lda + i] (trans_a true), B[p,j] = B[p·ldb + j],
// C[i,j] = C[i·ldc + j]. Each element's sum over p runs in order p = 0, 1, …, k−1.
template <typename T>
using TileGemmFn = void (*)(int64_t m, int64_t n, int64_t k, T alpha, const T* A, int64_t lda,
                            const T* B, int64_t ldb, bool accumulate, T* C, int64_t ldc);

// The implementation for this CPU (the same for every call of the process).
template <typename T>
TileGemmFn<T> TileGemm(bool trans_a);

// Which instruction set TileGemm runs: "avx512", "avx2" or "sse2".
const char* TileGemmIsa();

}  // namespace meshrun::cpu::internal
