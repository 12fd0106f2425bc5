// Fused softmax cross-entropy: losses against the definition, dlogits against finite
// differences of grad_scale·Σ losses, in place (dlogits aliasing logits), large logits, float32.
#include <gtest/gtest.h>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::Cast;
using testing::ExpectClose;
using testing::NumericGrad;
using testing::Random;
using testing::RandomInts;

std::vector<double> ReferenceLosses(const std::vector<double>& logits,
                                    const std::vector<int32_t>& targets, int64_t N, int64_t V) {
  std::vector<double> losses(N);
  for (int64_t i = 0; i < N; ++i) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits[i * V + j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[i * V + j] - mx);
    losses[i] = std::log(s) + mx - logits[i * V + targets[i]];
  }
  return losses;
}

TEST(KernelsCrossEntropy, LossesAndGradientMatchReferenceAndFiniteDifferences) {
  const int64_t N = 6, V = 37;
  auto logits = Random(N * V, 1, -4, 4);
  const auto targets = RandomInts(N, 2, 0, V - 1);
  const double grad_scale = 1.0 / N;
  std::vector<double> losses(N), dlogits(N * V);
  SoftmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V,
                      grad_scale);
  ExpectClose(losses, ReferenceLosses(logits, targets, N, V), 1e-14, 0, "losses");
  auto loss = [&] {
    std::vector<double> l(N);
    SoftmaxCrossEntropy<double>(l.data(), nullptr, logits.data(), targets.data(), N, V, 0.0);
    double s = 0;
    for (double x : l) s += grad_scale * x;
    return s;
  };
  ExpectClose(dlogits, NumericGrad(logits, loss), testing::kFdRtol, testing::kFdAtol, "dlogits");
}

TEST(KernelsCrossEntropy, InPlaceLargeLogitsAndFloat32) {
  const int64_t N = 33, V = 5000;
  auto logits = Random(N * V, 1, -10, 10);
  for (int64_t i = 0; i < N; ++i) logits[i * V + (i * 7) % V] += 1000;  // overflow without max
  const auto targets = RandomInts(N, 2, 0, V - 1);
  std::vector<double> losses(N), dlogits(N * V);
  SoftmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, 0.5);
  ExpectClose(losses, ReferenceLosses(logits, targets, N, V), 1e-13, 0, "losses");
  // dlogits aliasing logits gives the same result.
  auto inplace = logits;
  std::vector<double> losses2(N);
  SoftmaxCrossEntropy(losses2.data(), inplace.data(), inplace.data(), targets.data(), N, V, 0.5);
  EXPECT_TRUE(testing::BitIdentical(losses2, losses));
  EXPECT_TRUE(testing::BitIdentical(inplace, dlogits));
  // float32, in place.
  auto f = Cast<float>(logits);
  std::vector<float> lf(N);
  SoftmaxCrossEntropy(lf.data(), f.data(), f.data(), targets.data(), N, V, 0.5f);
  for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(lf[i], losses[i], 1e-5 * (1 + losses[i]));
  ExpectClose(f, dlogits, 1e-5, 1e-9, "float32 dlogits");
}

}  // namespace
}  // namespace meshrun::cpu
