// Exponential backoff with jitter, for retrying a coordinator that is gone (session reconnects,
// store calls). Pure value type; not thread-safe (one per retry loop).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

namespace meshrun {

// Delays initial, initial·m, initial·m², … capped at `max`, each scaled by a random factor in
// [1 − jitter, 1 + jitter] (so reconnecting workers do not arrive in lockstep) and never above
// `max`. Reset() after a success starts over.
class Backoff {
 public:
  using Duration = std::chrono::milliseconds;

  Backoff(Duration initial, Duration max, double multiplier = 2.0, double jitter = 0.2,
          uint32_t seed = std::random_device{}())
      : initial_(initial), max_(max), multiplier_(multiplier), jitter_(jitter), rng_(seed) {}

  // The delay to wait before the next try.
  Duration Next() {
    const double base = std::min(static_cast<double>(max_.count()), current_);
    current_ = std::min(static_cast<double>(max_.count()), base * multiplier_);
    ++attempts_;
    double factor = 1.0;
    if (jitter_ > 0)
      factor = std::uniform_real_distribution<double>(1 - jitter_, 1 + jitter_)(rng_);
    const double delay = std::min(static_cast<double>(max_.count()), base * factor);
    return Duration(static_cast<int64_t>(std::max(0.0, delay)));
  }

  void Reset() {
    current_ = static_cast<double>(initial_.count());
    attempts_ = 0;
  }

  // Delays handed out since construction or the last Reset.
  int attempts() const { return attempts_; }

 private:
  Duration initial_;
  Duration max_;
  double multiplier_;
  double jitter_;
  std::minstd_rand rng_;
  double current_ = static_cast<double>(initial_.count());
  int attempts_ = 0;
};

}  // namespace meshrun
