// Helpers shared by the CPU kernel tests: seeded random buffers, central finite differences of a
// random projection loss L = Σ out∘R, and tolerance checks that report the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace meshrun::cpu::testing {

inline std::vector<double> Random(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> RandomInts(size_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

template <typename To, typename From>
std::vector<To> Cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// dL/dx by central differences, where loss() recomputes L from the current contents of x.
// Checks at most max_points elements (evenly spread) to keep big cases fast; the others are NaN
// and skipped by ExpectClose.
inline std::vector<double> NumericGrad(std::vector<double>& x, const std::function<double()>& loss,
                                       size_t max_points = 400, double h = 1e-5) {
  std::vector<double> g(x.size(), std::nan(""));
  const size_t stride = std::max<size_t>(1, (x.size() + max_points - 1) / max_points);
  for (size_t i = 0; i < x.size(); i += stride) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// |actual − expected| ≤ atol + rtol·max|expected| for every element where expected is not NaN.
template <typename A, typename E>
void ExpectClose(const std::vector<A>& actual, const std::vector<E>& expected, double rtol,
                 double atol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0;
  for (const E& e : expected) {
    if (!std::isnan(static_cast<double>(e))) scale = std::max(scale, std::abs(double(e)));
  }
  const double tol = atol + rtol * scale;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = static_cast<double>(expected[i]);
    if (std::isnan(e)) continue;
    const double err = std::abs(static_cast<double>(actual[i]) - e);
    if (!(err <= worst) || std::isnan(err)) {
      worst = std::isnan(err) ? INFINITY : err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst at " << worst_i << ": got " << double(actual[worst_i])
                        << ", want " << double(expected[worst_i]) << " (scale " << scale << ")";
}

// Analytic gradient from an accumulating backward: after − before.
inline std::vector<double> Diff(const std::vector<double>& after,
                                const std::vector<double>& before) {
  std::vector<double> d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

template <typename T>
bool BitIdentical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](T x, T y) {
           return std::memcmp(&x, &y, sizeof(T)) == 0;
         });
}

// Tolerances of a float64 finite-difference check (h = 1e-5, smooth functions).
constexpr double kFdRtol = 1e-6;
constexpr double kFdAtol = 1e-8;

}  // namespace meshrun::cpu::testing
