// Elementwise kernels: tanh-GELU (forward against the formula, backward against finite
// differences, float32 vs float64 over the whole range), residual add and Accumulate.
#include <gtest/gtest.h>

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

double GeluRef(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(KernelsGelu, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  const int64_t n = 301;
  auto inp = Random(n, 1, -6, 6), R = Random(n, 2);
  std::vector<double> out(n);
  auto loss = [&] {
    GeluForward(out.data(), inp.data(), n);
    return Dot(out, R);
  };
  loss();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], GeluRef(inp[i]), 1e-15);
  const auto dinp0 = Random(n, 3);
  auto dinp = dinp0;
  GeluBackward(dinp.data(), inp.data(), R.data(), n);
  ExpectClose(Diff(dinp, dinp0), NumericGrad(inp, loss), testing::kFdRtol, testing::kFdAtol,
              "dinp");
}

TEST(KernelsGelu, Float32MatchesFloat64) {
  // Covers the saturated tails (|2u| beyond float exp's range) and tiny inputs.
  const int64_t n = 100003;
  auto inp = Random(n, 1, -12, 12);
  inp[0] = 0;
  inp[1] = 1e-30;
  inp[2] = -1e-30;
  inp[3] = 80;
  inp[4] = -80;
  const auto dout = Random(n, 2);
  std::vector<double> out(n), dinp(n, 0.0);
  GeluForward(out.data(), inp.data(), n);
  GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  auto inpf = Cast<float>(inp), doutf = Cast<float>(dout);
  std::vector<float> outf(n), dinpf(n, 0.f);
  GeluForward(outf.data(), inpf.data(), n);
  GeluBackward(dinpf.data(), inpf.data(), doutf.data(), n);
  // Elementwise: absolute error relative to |x| (the output scale).
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(outf[i], out[i], 1e-6 * std::max(1.0, std::abs(inp[i]))) << inp[i];
    ASSERT_NEAR(dinpf[i], dinp[i], 2e-6 * std::max(1.0, std::abs(inp[i]))) << inp[i];
  }
}

TEST(KernelsResidual, ForwardAndAccumulate) {
  const int64_t n = 1001;
  auto a = Random(n, 1), b = Random(n, 2), R = Random(n, 3);
  std::vector<double> out(n);
  auto loss = [&] {
    ResidualForward(out.data(), a.data(), b.data(), n);
    return Dot(out, R);
  };
  loss();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  // Its backward is Accumulate(da, dout) and Accumulate(db, dout).
  const auto da0 = Random(n, 4), db0 = Random(n, 5);
  auto da = da0, db = db0;
  Accumulate(da.data(), R.data(), n);
  Accumulate(db.data(), R.data(), n);
  ExpectClose(Diff(da, da0), NumericGrad(a, loss), testing::kFdRtol, testing::kFdAtol, "da");
  ExpectClose(Diff(db, db0), NumericGrad(b, loss), testing::kFdRtol, testing::kFdAtol, "db");
  loss();  // the finite differences left out computed from perturbed inputs
  auto af = Cast<float>(a), bf = Cast<float>(b);
  std::vector<float> outf(n);
  ResidualForward(outf.data(), af.data(), bf.data(), n);
  ExpectClose(outf, out, 1e-7, 0, "float32 out");
}

}  // namespace
}  // namespace meshrun::cpu
