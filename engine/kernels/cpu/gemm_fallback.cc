// The built-in GEMM: packed panels and a register-blocked micro-kernel (GotoBLAS/BLIS layout).
// Matmul uses it when the build has no BLAS (or a BLAS that misjudges the CPU). Attention's
// block products use TileGemm (tile_gemm.h), which reads its operands unpacked.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace meshrun::cpu {
namespace {

// Register tile: kMR rows × (2 vectors) columns of accumulators, sized to the vector file
// (AVX-512: 16 of 32 registers; AVX/SSE: 12 of 16).
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kMR = 8;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
constexpr int kMR = 6;
#else
constexpr int kVecBytes = 16;
constexpr int kMR = 6;
#endif

template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};

template <typename T>
constexpr int kNR = 2 * kVecBytes / static_cast<int>(sizeof(T));  // columns of the tile

// Cache blocking: a kKC-deep slice of B (kNC columns) and of A (all rows) are packed once;
// tasks of kMC rows × kNG column panels then run the micro-kernel over them.
constexpr int64_t kKC = 256;
constexpr int64_t kNC = 2048;
constexpr int64_t kMC = 8 * kMR;
constexpr int64_t kNG = 4;

// C[mr,nr] (+)= Ap(kc×kMR panel) · Bp(kc×NR panel); `overwrite` stores instead of adding.
// Padding rows/columns of the panels are 0.
template <typename T>
inline void MicroKernel(int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c,
                        int64_t ldc, int mr, int nr, bool overwrite) {
  using V = typename Vec<T>::type;
  constexpr int L = kVecBytes / sizeof(T);
  V acc[kMR][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = V{};
  for (int64_t k = 0; k < kc; ++k) {
    V b0, b1;
    std::memcpy(&b0, bp + k * 2 * L, sizeof(V));
    std::memcpy(&b1, bp + k * 2 * L + L, sizeof(V));
    const T* a = ap + k * kMR;
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      acc[r][0] += a[r] * b0;  // scalar × vector: one broadcast, two FMAs
      acc[r][1] += a[r] * b1;
    }
  }
  if (mr == kMR && nr == 2 * L) {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      V c0 = acc[r][0], c1 = acc[r][1];
      if (!overwrite) {
        V o0, o1;
        std::memcpy(&o0, c + r * ldc, sizeof(V));
        std::memcpy(&o1, c + r * ldc + L, sizeof(V));
        c0 += o0;
        c1 += o1;
      }
      std::memcpy(c + r * ldc, &c0, sizeof(V));
      std::memcpy(c + r * ldc + L, &c1, sizeof(V));
    }
  } else {
    T tile[kMR][2 * L];
    std::memcpy(tile, acc, sizeof(tile));
    for (int r = 0; r < mr; ++r) {
      for (int j = 0; j < nr; ++j)
        c[r * ldc + j] = (overwrite ? T(0) : c[r * ldc + j]) + tile[r][j];
    }
  }
}

// Packs rows [i0, i0+mc) × depth [p0, p0+kc) of op(A)·alpha into kMR-row panels:
// ap[(panel·kc + k)·kMR + r].
template <typename T>
void PackA(T* ap, bool trans, const T* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
           int64_t kc, T alpha) {
  for (int64_t ip = 0; ip < mc; ip += kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ip));
    T* dst = ap + ip * kc;
    if (!trans) {
      for (int r = 0; r < kMR; ++r) {
        if (r < mr) {
          const T* src = A + (i0 + ip + r) * lda + p0;
          for (int64_t k = 0; k < kc; ++k) dst[k * kMR + r] = alpha * src[k];
        } else {
          for (int64_t k = 0; k < kc; ++k) dst[k * kMR + r] = T(0);
        }
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = A + (p0 + k) * lda + i0 + ip;
        for (int r = 0; r < kMR; ++r) dst[k * kMR + r] = r < mr ? alpha * src[r] : T(0);
      }
    }
  }
}

// Packs depth [p0, p0+kc) × columns [j0, j0+nc) of op(B) into NR-column panels:
// bp[(panel·kc + k)·NR + c].
template <typename T>
void PackB(T* bp, bool trans, const T* B, int64_t ldb, int64_t p0, int64_t kc, int64_t j0,
           int64_t nc, int64_t jp) {
  constexpr int NR = kNR<T>;
  const int64_t jj = jp * NR;
  const int nr = static_cast<int>(std::min<int64_t>(NR, nc - jj));
  T* dst = bp + jj * kc;
  if (!trans) {
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = B + (p0 + k) * ldb + j0 + jj;
      T* d = dst + k * NR;
      for (int c = 0; c < nr; ++c) d[c] = src[c];
      for (int c = nr; c < NR; ++c) d[c] = T(0);
    }
  } else {
    for (int c = 0; c < NR; ++c) {
      if (c < nr) {
        const T* src = B + (j0 + jj + c) * ldb + p0;
        for (int64_t k = 0; k < kc; ++k) dst[k * NR + c] = src[k];
      } else {
        for (int64_t k = 0; k < kc; ++k) dst[k * NR + c] = T(0);
      }
    }
  }
}

// C *= beta for beta ∉ {0, 1} (beta = 0 is handled by the first product overwriting C).
template <typename T>
void ScaleC(T* C, int64_t ldc, int64_t M, int64_t N, T beta, [[maybe_unused]] bool parallel) {
  if (beta == T(0) || beta == T(1)) return;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] *= beta;
  }
}

// True inside any parallel region, even a one-thread team (then nesting would only add cost).
bool InParallelRegion() {
#ifdef _OPENMP
  return omp_get_level() > 0;
#else
  return true;
#endif
}

}  // namespace

template <typename T>
void GemmFallback(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const bool parallel =
      !InParallelRegion() && internal::WorthParallel(static_cast<double>(M) * N * K / 16);
  if (K <= 0 || alpha == T(0)) {
    if (beta == T(0)) {
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
    } else {
      ScaleC(C, ldc, M, N, beta, parallel);
    }
    return;
  }
  ScaleC(C, ldc, M, N, beta, parallel);
  constexpr int NR = kNR<T>;

  // Per calling thread: Attention calls this from many threads at once.
  thread_local std::vector<T> a_pack, b_pack;
  const int64_t m_pad = (M + kMR - 1) / kMR * kMR;
  const int64_t nc_max = std::min(N, kNC);
  const int64_t kc_max = std::min(K, kKC);
  a_pack.resize(m_pad * kc_max);
  b_pack.resize((nc_max + NR - 1) / NR * NR * kc_max);
  T* ap = a_pack.data();
  T* bp = b_pack.data();

  for (int64_t j0 = 0; j0 < N; j0 += kNC) {
    const int64_t nc = std::min(kNC, N - j0);
    const int64_t n_panels = (nc + NR - 1) / NR;
    for (int64_t p0 = 0; p0 < K; p0 += kKC) {
      const int64_t kc = std::min(kKC, K - p0);
      const bool overwrite = p0 == 0 && beta == T(0);
      const int64_t m_blocks = (M + kMC - 1) / kMC;
      // Packing: A once per depth slice (re-packed per column block only when N > kNC).
#pragma omp parallel if (parallel)
      {
#pragma omp for schedule(static) nowait
        for (int64_t mb = 0; mb < m_blocks; ++mb) {
          const int64_t i0 = mb * kMC;
          PackA(ap + i0 * kc, trans_a, A, lda, i0, std::min(kMC, M - i0), p0, kc, alpha);
        }
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < n_panels; ++jp) PackB(bp, trans_b, B, ldb, p0, kc, j0, nc, jp);
        // Tasks: kMC rows × kNG column panels. Each C tile is owned by one task and the depth
        // is summed in a fixed order, so the result does not depend on the thread count.
        const int64_t n_groups = (n_panels + kNG - 1) / kNG;
#pragma omp for schedule(dynamic) collapse(2)
        for (int64_t mb = 0; mb < m_blocks; ++mb) {
          for (int64_t g = 0; g < n_groups; ++g) {
            const int64_t i_end = std::min(M, (mb + 1) * kMC);
            const int64_t jp_end = std::min(n_panels, (g + 1) * kNG);
            for (int64_t jp = g * kNG; jp < jp_end; ++jp) {
              const int64_t jj = jp * NR;
              const int nr = static_cast<int>(std::min<int64_t>(NR, nc - jj));
              for (int64_t i = mb * kMC; i < i_end; i += kMR) {
                const int mr = static_cast<int>(std::min<int64_t>(kMR, M - i));
                MicroKernel(kc, ap + i * kc, bp + jj * kc, C + i * ldc + j0 + jj, ldc, mr, nr,
                            overwrite);
              }
            }
          }
        }
      }
    }
  }
}

#define MESHRUN_INSTANTIATE(T)                                                               \
  template void GemmFallback<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, \
                                const T*, int64_t, T, T*, int64_t);
MESHRUN_INSTANTIATE(MESHRUN_ELEMENT_TYPE)  // float; double in the float64 twin (element_type.h)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::cpu
