// The row helpers of engine/kernels/cpu/simd.h (AVX2 on this CPU when it has it, scalar
// otherwise, MESHRUN_FORCE_SCALAR=1): against float64 references, at lengths that exercise the
// 8- and 16-lane bodies and every tail, including the -inf of masked attention scores.
#include "engine/kernels/cpu/simd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace meshrun::cpu::simd {
namespace {

std::vector<float> Values(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(Simd, ReportsWhichPathRuns) {
  std::printf("simd path: %s\n", HasAvx512() ? "avx512" : HasAvx2() ? "avx2+fma" : "scalar");
}

TEST(Simd, RowMaxAndExpShiftSumMatchFloat64AtEveryLength) {
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000}) {
    auto x = Values(n, static_cast<uint32_t>(n) + 1, -30.f, 30.f);
    if (n > 3) x[3] = -std::numeric_limits<float>::infinity();  // a masked score
    const float mx = RowMax(x.data(), n);
    double ref_max = -std::numeric_limits<double>::infinity();
    for (float v : x) ref_max = std::max<double>(ref_max, v);
    EXPECT_EQ(mx, static_cast<float>(ref_max)) << n;
    if (n == 0) continue;
    std::vector<float> y(n);
    const float sum = ExpShiftSum(y.data(), x.data(), n, mx);
    double ref_sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double e = std::exp(static_cast<double>(x[j] - mx));  // the float argument
      ref_sum += e;
      EXPECT_NEAR(y[j], e, 4e-7 * e + 1e-37) << "n " << n << " j " << j;
    }
    EXPECT_NEAR(sum, ref_sum, 1e-6 * ref_sum) << n;
    if (n > 3) {
      EXPECT_EQ(y[3], 0.f);  // e^{-inf} is exactly 0
    }
    // In place, the same values up to the last bits (the 8-lane body and the scalar tail may
    // cover different elements than ExpShiftSum's 16-lane body, and FMA rounds once).
    ExpShift(x.data(), n, mx);
    for (int64_t j = 0; j < n; ++j) EXPECT_FLOAT_EQ(x[j], y[j]) << n;
    const std::vector<float> before = y;
    ScaleRow(y.data(), n, 0.5f);
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(y[j], 0.5f * before[j]) << n;
  }
}

TEST(Simd, ExpUnderflowsToZeroAndSaturates) {
  std::vector<float> x = {-87.5f, -100.f, -1e30f, -std::numeric_limits<float>::infinity(),
                          -86.f,  0.f,    88.f,   200.f};
  std::vector<float> y(x.size());
  ExpShiftSum(y.data(), x.data(), static_cast<int64_t>(x.size()), 0.f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], 0.f) << i;
  EXPECT_NEAR(y[4], std::exp(-86.0), 1e-6 * std::exp(-86.0));
  EXPECT_EQ(y[5], 1.f);
  EXPECT_NEAR(y[6], std::exp(88.0), 1e-6 * std::exp(88.0));
  EXPECT_EQ(y[7], y[6]);  // saturated at e^88, finite
  EXPECT_TRUE(std::isfinite(y[7]));
}

TEST(Simd, GeluRowsMatchFloat64AtEveryLength) {
  const double k = std::sqrt(2.0 / M_PI), a = 0.044715;
  for (int64_t n : {1, 7, 8, 9, 17, 257}) {
    auto x = Values(n, static_cast<uint32_t>(n) + 7, -12.f, 12.f);
    auto g = Values(n, static_cast<uint32_t>(n) + 9, -1.f, 1.f);
    std::vector<float> out(n), dinp(n, 0.25f);
    GeluForwardRow(out.data(), x.data(), n);
    GeluBackwardRow(dinp.data(), x.data(), g.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x[i];
      const double t = std::tanh(k * (xi + a * xi * xi * xi));
      const double f = 0.5 * xi * (1 + t);
      const double df = 0.5 * (1 + t) + 0.5 * xi * (1 - t * t) * k * (1 + 3 * a * xi * xi);
      EXPECT_NEAR(out[i], f, 2e-6 * (1 + std::abs(f))) << "n " << n << " x " << xi;
      EXPECT_NEAR(dinp[i], 0.25 + df * g[i], 2e-6) << "n " << n << " x " << xi;
    }
  }
}

}  // namespace
}  // namespace meshrun::cpu::simd
