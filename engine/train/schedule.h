// The learning-rate schedule of docs/model.md: linear warmup, then cosine decay to min_lr.
#pragma once

#include <cmath>
#include <cstdint>

namespace meshrun {

// Learning rate of the update at step k (0-based).
inline double LearningRate(double lr, double min_lr, int64_t warmup_steps, int64_t steps,
                           int64_t k) {
  if (k < warmup_steps) return lr * static_cast<double>(k + 1) / static_cast<double>(warmup_steps);
  if (steps <= warmup_steps) return min_lr;
  const double progress =
      static_cast<double>(k - warmup_steps) / static_cast<double>(steps - warmup_steps);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
}

}  // namespace meshrun
