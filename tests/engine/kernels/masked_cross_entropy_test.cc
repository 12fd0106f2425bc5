// Ignored targets (kIgnoreTarget, transformers' -100) in the fused and the vocab-parallel
// cross-entropy: no loss and a zero gradient row; the other rows exactly as without them.
#include <gtest/gtest.h>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::Random;
using testing::RandomInts;

TEST(KernelsMaskedCrossEntropy, IgnoredRowsHaveNoLossNorGradient) {
  const int64_t N = 7, V = 29;
  const auto logits = Random(N * V, 3, -4, 4);
  auto targets = RandomInts(N, 4, 0, V - 1);
  const auto kept = targets;
  targets[1] = -100;
  targets[4] = -100;
  std::vector<double> losses(N), dlogits(N * V), want_losses(N), want_d(N * V);
  SoftmaxCrossEntropy(want_losses.data(), want_d.data(), logits.data(), kept.data(), N, V, 0.5);
  SoftmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, 0.5);
  for (int64_t i = 0; i < N; ++i) {
    const bool ignored = targets[i] < 0;
    EXPECT_EQ(losses[i], ignored ? 0.0 : want_losses[i]) << "row " << i;
    for (int64_t j = 0; j < V; ++j) {
      EXPECT_EQ(dlogits[i * V + j], ignored ? 0.0 : want_d[i * V + j]) << i << "," << j;
    }
  }
  // In place (dlogits aliasing logits), float32.
  std::vector<float> f(logits.begin(), logits.end()), fl(N);
  SoftmaxCrossEntropy(fl.data(), f.data(), f.data(), targets.data(), N, V, 0.5f);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(f[4 * V + j], 0.0f);
  EXPECT_EQ(fl[1], 0.0f);
  EXPECT_NEAR(fl[0], want_losses[0], 1e-5);
}

TEST(KernelsMaskedCrossEntropy, VocabShardsIgnoreTheSameRows) {
  // Two shards of V/2 classes give the whole-vocabulary loss; ignored rows give 0 and no grad.
  const int64_t N = 5, V = 24, H = V / 2;
  const auto logits = Random(N * V, 5, -3, 3);
  auto targets = RandomInts(N, 6, 0, V - 1);
  targets[2] = -100;
  std::vector<double> full(N), full_d(N * V);
  SoftmaxCrossEntropy(full.data(), full_d.data(), logits.data(), targets.data(), N, V, 1.0);
  std::vector<double> shard_logits[2], stats[2], all(2 * 2 * N);
  for (int s = 0; s < 2; ++s) {
    shard_logits[s].resize(N * H);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < H; ++j) shard_logits[s][i * H + j] = logits[i * V + s * H + j];
    }
    stats[s].resize(2 * N);
    VocabShardStats(stats[s].data(), shard_logits[s].data(), targets.data(), s * H, N, H);
    std::copy(stats[s].begin(), stats[s].end(), all.begin() + s * 2 * N);
  }
  std::vector<double> losses(N), lse(N);
  VocabShardLoss(losses.data(), lse.data(), all.data(), targets.data(), 2, N);
  for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(losses[i], full[i], 1e-12) << "row " << i;
  EXPECT_EQ(losses[2], 0.0);
  for (int s = 0; s < 2; ++s) {
    std::vector<double> d(N * H);
    VocabShardGrad(d.data(), shard_logits[s].data(), lse.data(), targets.data(), s * H, N, H, 1.0);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < H; ++j) EXPECT_NEAR(d[i * H + j], full_d[i * V + s * H + j], 1e-12);
    }
  }
}

}  // namespace
}  // namespace meshrun::cpu
