// A Clock that only moves when the test says so. Thread-safe.
#pragma once

#include <chrono>
#include <mutex>

#include "coordinator/clock.h"

namespace meshrun::testing {

class FakeClock final : public coordinator::Clock {
 public:
  FakeClock()
      : wall_(std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000))),
        mono_(std::chrono::steady_clock::time_point(std::chrono::seconds(1000))) {}

  coordinator::WallTime Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return wall_;
  }
  coordinator::MonoTime Monotonic() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return mono_;
  }
  void Advance(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    wall_ += d;
    mono_ += d;
  }

 private:
  mutable std::mutex mu_;
  coordinator::WallTime wall_;
  coordinator::MonoTime mono_;
};

}  // namespace meshrun::testing
