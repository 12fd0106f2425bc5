// Matmul (Linear) and the GEMMs under it: finite-difference gradients in float64, float32 vs
// float64, the built-in GEMM vs BLAS, accumulation and determinism.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::Cast;
using testing::Diff;
using testing::Dot;
using testing::ExpectClose;
using testing::NumericGrad;
using testing::Random;

TEST(KernelsMatmul, BackwardMatchesFiniteDifferences) {
  const int64_t N = 7, C = 13, OC = 11;
  auto inp = Random(N * C, 1), w = Random(OC * C, 2), b = Random(OC, 3), R = Random(N * OC, 4);
  std::vector<double> out(N * OC);
  auto loss = [&] {
    MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    return Dot(out, R);
  };
  // Backward accumulates: start every gradient from non-zero contents.
  const auto dinp0 = Random(N * C, 5), dw0 = Random(OC * C, 6), db0 = Random(OC, 7);
  auto dinp = dinp0, dw = dw0, db = db0;
  MatmulBackward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, C, OC);
  ExpectClose(Diff(dinp, dinp0), NumericGrad(inp, loss), testing::kFdRtol, testing::kFdAtol,
              "dinp");
  ExpectClose(Diff(dw, dw0), NumericGrad(w, loss), testing::kFdRtol, testing::kFdAtol, "dweight");
  ExpectClose(Diff(db, db0), NumericGrad(b, loss), testing::kFdRtol, testing::kFdAtol, "dbias");
}

TEST(KernelsMatmul, NullBiasAndNullGradientsAreSkipped) {
  const int64_t N = 5, C = 4, OC = 3;
  auto inp = Random(N * C, 1), w = Random(OC * C, 2), dout = Random(N * OC, 3);
  std::vector<double> out(N * OC), dw(OC * C, 0.0);
  MatmulForward<double>(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t o = 0; o < OC; ++o) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += inp[i * C + c] * w[o * C + c];
      EXPECT_NEAR(out[i * OC + o], s, 1e-14);
    }
  }
  MatmulBackward<double>(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t i = 0; i < N; ++i) s += dout[i * OC + o] * inp[i * C + c];
      EXPECT_NEAR(dw[o * C + c], s, 1e-14);
    }
  }
}

TEST(KernelsMatmul, Float32MatchesFloat64) {
  const int64_t N = 67, C = 96, OC = 130;
  auto inp = Random(N * C, 1), w = Random(OC * C, 2), b = Random(OC, 3), dout = Random(N * OC, 4);
  std::vector<double> out(N * OC), dinp(N * C, 0.0), dw(OC * C, 0.0), db(OC, 0.0);
  MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  auto inpf = Cast<float>(inp), wf = Cast<float>(w), bf = Cast<float>(b), doutf = Cast<float>(dout);
  std::vector<float> outf(N * OC), dinpf(N * C, 0.f), dwf(OC * C, 0.f), dbf(OC, 0.f);
  MatmulForward(outf.data(), inpf.data(), wf.data(), bf.data(), N, C, OC);
  MatmulBackward(dinpf.data(), dwf.data(), dbf.data(), doutf.data(), inpf.data(), wf.data(), N, C,
                 OC);
  ExpectClose(outf, out, 1e-5, 0, "out");
  ExpectClose(dinpf, dinp, 1e-5, 0, "dinp");
  ExpectClose(dwf, dw, 1e-5, 0, "dweight");
  ExpectClose(dbf, db, 1e-5, 0, "dbias");
}

// C = alpha·op(A)·op(B) + beta·C by the definition.
std::vector<double> NaiveGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                              const std::vector<double>& A, int64_t lda,
                              const std::vector<double>& B, int64_t ldb, double beta,
                              std::vector<double> C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      }
      C[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]);
    }
  }
  return C;
}

struct GemmCase {
  int64_t M, N, K;
};

// Both GEMMs against the definition, for every transpose combination, padded leading
// dimensions, sizes off the tile sizes, and sizes big enough for the threaded path.
TEST(KernelsGemm, FallbackAndBlasMatchTheDefinition) {
  for (const GemmCase& g : {GemmCase{1, 1, 1}, GemmCase{5, 3, 7}, GemmCase{37, 71, 300},
                            GemmCase{130, 65, 257}, GemmCase{64, 2100, 20}}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      const int64_t lda = (ta ? g.M : g.K) + 3, ldb = (tb ? g.K : g.N) + 2, ldc = g.N + 1;
      const auto A = Random((ta ? g.K : g.M) * lda, 10 + flags);
      const auto B = Random((tb ? g.N : g.K) * ldb, 20 + flags);
      const auto C0 = Random(g.M * ldc, 30 + flags);
      for (double beta : {0.0, 1.0, -0.5}) {
        const auto want = NaiveGemm(ta, tb, g.M, g.N, g.K, 0.75, A, lda, B, ldb, beta, C0, ldc);
        const std::string what = "M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
                                 " K=" + std::to_string(g.K) + " ta=" + std::to_string(ta) +
                                 " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta);
        auto c = C0;
        GemmFallback(ta, tb, g.M, g.N, g.K, 0.75, A.data(), lda, B.data(), ldb, beta, c.data(),
                     ldc);
        ExpectClose(c, want, 1e-13, 0, "fallback " + what);
        c = C0;
        Gemm(ta, tb, g.M, g.N, g.K, 0.75, A.data(), lda, B.data(), ldb, beta, c.data(), ldc);
        ExpectClose(c, want, 1e-13, 0, std::string(GemmBackend()) + " " + what);
        auto af = Cast<float>(A), bf = Cast<float>(B), c1 = Cast<float>(C0), c2 = c1;
        GemmFallback<float>(ta, tb, g.M, g.N, g.K, 0.75f, af.data(), lda, bf.data(), ldb,
                            static_cast<float>(beta), c1.data(), ldc);
        Gemm<float>(ta, tb, g.M, g.N, g.K, 0.75f, af.data(), lda, bf.data(), ldb,
                    static_cast<float>(beta), c2.data(), ldc);
        ExpectClose(c1, want, 2e-5, 0, "float fallback " + what);
        ExpectClose(c1, c2, 2e-5, 0, "float fallback vs " + std::string(GemmBackend()) + what);
      }
    }
  }
}

// When OpenBLAS misjudges this CPU, Gemm runs GemmFallback and the test above compares the
// fallback with itself. Rerun it in a child process with the OPENBLAS_CORETYPE the kernels
// recommend (OpenBLAS reads it only at load time), where Gemm must be OpenBLAS.
TEST(KernelsGemm, OpenBlasIsUsedWithTheCoreTypeHint) {
  const std::string backend = GemmBackend();
  if (backend.rfind("fallback (built without BLAS)", 0) == 0) GTEST_SKIP() << backend;
  if (backend.rfind("openblas", 0) == 0)
    SUCCEED() << backend;
  else {
    ASSERT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr)
        << "OPENBLAS_CORETYPE is set but Gemm still does not use OpenBLAS: " << backend;
    const std::string hint = OpenBlasCoreTypeHint();
    ASSERT_FALSE(hint.empty()) << backend;
    ::setenv("OPENBLAS_CORETYPE", hint.c_str(), 1);
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const int rc = std::system(("'" + self +
                                "' --gtest_brief=1 --gtest_filter=KernelsGemm."
                                "FallbackAndBlasMatchTheDefinition:KernelsGemm."
                                "OpenBlasIsUsedWithTheCoreTypeHint")
                                   .c_str());
    ::unsetenv("OPENBLAS_CORETYPE");
    EXPECT_EQ(rc, 0) << "with OPENBLAS_CORETYPE=" << hint;
  }
}

TEST(KernelsGemm, BetaZeroOverwritesNaN) {
  auto A = Random(4 * 3, 1), B = Random(3 * 5, 2);
  std::vector<double> c(4 * 5, std::nan(""));
  GemmFallback(false, false, 4, 5, 3, 1.0, A.data(), 3, B.data(), 5, 0.0, c.data(), 5);
  for (double x : c) EXPECT_FALSE(std::isnan(x));
}

TEST(KernelsMatmul, DeterministicWithTwoThreads) {
  SetNumThreads(2);
  const int64_t N = 300, C = 200, OC = 260;
  auto inp = Cast<float>(Random(N * C, 1)), w = Cast<float>(Random(OC * C, 2)),
       b = Cast<float>(Random(OC, 3)), dout = Cast<float>(Random(N * OC, 4));
  auto run = [&] {
    std::vector<float> out(N * OC), dinp(N * C, 0.f), dw(OC * C, 0.f), db(OC, 0.f), fb(N * OC);
    MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    GemmFallback(false, true, N, OC, C, 1.f, inp.data(), C, w.data(), C, 0.f, fb.data(), OC);
    return std::vector<std::vector<float>>{out, dinp, dw, db, fb};
  };
  const auto first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(testing::BitIdentical(first[i], second[i])) << "output " << i;
  }
  EXPECT_EQ(NumThreads(), 2);
}

}  // namespace
}  // namespace meshrun::cpu
