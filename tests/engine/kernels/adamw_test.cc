// AdamW against a hand-written torch.optim.AdamW step (with and without weight decay), and the
// clipping helpers SumOfSquares (exact, deterministic) and Scale.
#include <gtest/gtest.h>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::Cast;
using testing::ExpectClose;
using testing::Random;

// torch.optim.AdamW (_single_tensor_adamw), written out for one element in double.
struct RefAdamW {
  double p, m = 0, v = 0;
  void Step(double g, int step, double lr, double b1, double b2, double eps, double wd) {
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double m_hat = m / (1 - std::pow(b1, step));
    const double v_hat = v / (1 - std::pow(b2, step));
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

void CheckAdamW(double wd) {
  const int64_t n = 1000;
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  const auto p0 = Random(n, 1);
  std::vector<RefAdamW> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i].p = p0[i];
  std::vector<double> p = p0, m(n, 0.0), v(n, 0.0);
  std::vector<float> pf = Cast<float>(p0), mf(n, 0.f), vf(n, 0.f);
  for (int step = 1; step <= 4; ++step) {
    auto g = Random(n, 100 + step);
    g[0] = 0;  // zero gradient on the first step: eps keeps the update finite
    for (int64_t i = 0; i < n; ++i) ref[i].Step(g[i], step, lr, b1, b2, eps, wd);
    AdamW(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step);
    auto gf = Cast<float>(g);
    AdamW(pf.data(), gf.data(), mf.data(), vf.data(), n, lr, b1, b2, eps, wd, step);
    std::vector<double> want_p(n), want_m(n), want_v(n);
    for (int64_t i = 0; i < n; ++i) {
      want_p[i] = ref[i].p;
      want_m[i] = ref[i].m;
      want_v[i] = ref[i].v;
    }
    const std::string what = "step " + std::to_string(step);
    ExpectClose(p, want_p, 1e-14, 0, "param " + what);
    ExpectClose(m, want_m, 1e-14, 0, "exp_avg " + what);
    ExpectClose(v, want_v, 1e-14, 0, "exp_avg_sq " + what);
    ExpectClose(pf, want_p, 1e-6, 0, "float32 param " + what);
  }
}

TEST(KernelsAdamW, MatchesTorchWithoutWeightDecay) {
  CheckAdamW(0.0);
}
TEST(KernelsAdamW, MatchesTorchWithWeightDecay) {
  CheckAdamW(0.1);
}

TEST(KernelsAdamW, FirstStepHandComputed) {
  // step 1: m = 0.1·g, v = 0.05·g², m̂ = g, v̂ = g² → p = p·(1 − lr·wd) − lr·g/(|g| + eps).
  double p = 2.0, m = 0, v = 0;
  const double g = 0.5;
  AdamW(&p, &g, &m, &v, 1, 0.1, 0.9, 0.95, 1e-8, 0.1, 1);
  EXPECT_NEAR(p, 2.0 * (1 - 0.01) - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(m, 0.05, 1e-16);
  EXPECT_NEAR(v, 0.0125, 1e-16);
}

TEST(KernelsClip, SumOfSquaresAndScale) {
  SetNumThreads(2);
  const int64_t n = 100001;  // several chunks, the last one partial
  const auto x = Random(n, 1);
  double want = 0;
  for (double e : x) want += e * e;
  EXPECT_NEAR(SumOfSquares(x.data(), n), want, 1e-12 * want);
  const auto xf = Cast<float>(x);
  double want_f = 0;
  for (float e : xf) want_f += double(e) * double(e);
  const double sf = SumOfSquares(xf.data(), n);
  EXPECT_NEAR(sf, want_f, 1e-12 * want_f);
  EXPECT_EQ(SumOfSquares(xf.data(), n), sf);  // deterministic
  EXPECT_EQ(SumOfSquares(xf.data(), 0), 0.0);
  auto y = xf;
  Scale(y.data(), n, 0.25);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], xf[i] * 0.25f);
}

}  // namespace
}  // namespace meshrun::cpu
