// TileGemm (engine/kernels/cpu/tile_gemm.h), the block product of attention: every row count of
// the register tile and its tail, whole and partial vectors of columns, op(A) plain and
// transposed, overwrite and accumulate, against a float64 reference, in the instruction set this
// CPU runs (MESHRUN_FORCE_SCALAR=1: the baseline one).
#include "engine/kernels/cpu/tile_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace meshrun::cpu::internal {
namespace {

template <typename T>
std::vector<T> Values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

template <typename T>
void Check(double tol) {
  for (bool trans_a : {false, true}) {
    const TileGemmFn<T> gemm = TileGemm<T>(trans_a);
    for (int64_t m : {1, 5, 6, 7, 8, 9, 16, 64}) {
      for (int64_t n : {1, 3, 8, 15, 16, 17, 32, 40, 64}) {
        for (int64_t k : {0, 1, 7, 32, 64}) {
          for (bool accumulate : {false, true}) {
            // Leading dimensions wider than the operands, so strides are exercised.
            const int64_t lda = (trans_a ? m : k) + 3, ldb = n + 5, ldc = n + 2;
            const auto A = Values<T>((trans_a ? k : m) * lda + 1, 1);
            const auto B = Values<T>(k * ldb + 1, 2);
            auto C = Values<T>(m * ldc, 3);
            const std::vector<T> C0 = C;
            const T alpha = static_cast<T>(0.75);
            gemm(m, n, k, alpha, A.data(), lda, B.data(), ldb, accumulate, C.data(), ldc);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < ldc; ++j) {
                if (j >= n) {  // outside the product: untouched
                  ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]);
                  continue;
                }
                double ref = 0;
                for (int64_t p = 0; p < k; ++p) {
                  const double a = trans_a ? A[p * lda + i] : A[i * lda + p];
                  ref += a * static_cast<double>(B[p * ldb + j]);
                }
                ref = alpha * ref + (accumulate ? static_cast<double>(C0[i * ldc + j]) : 0.0);
                ASSERT_NEAR(C[i * ldc + j], ref, tol * (1 + std::abs(ref)))
                    << "trans_a " << trans_a << " m " << m << " n " << n << " k " << k
                    << " accumulate " << accumulate << " at " << i << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

TEST(TileGemm, ReportsWhichPathRuns) {
  std::printf("tile gemm path: %s\n", TileGemmIsa());
}

TEST(TileGemm, FloatMatchesFloat64Reference) {
  Check<float>(1e-5);
}

TEST(TileGemm, DoubleMatchesFloat64Reference) {
  Check<double>(1e-13);
}

}  // namespace
}  // namespace meshrun::cpu::internal
