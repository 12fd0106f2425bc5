// Time as the coordinator's managers see it: wall time for timestamps users read, monotonic
// time for leases and timeouts. Injected so that tests drive leases with a fake clock.
#pragma once

#include <chrono>

namespace meshrun::coordinator {

using WallTime = std::chrono::system_clock::time_point;
using MonoTime = std::chrono::steady_clock::time_point;

// Thread-safe implementations only: every manager reads it under its own lock.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual WallTime Now() const = 0;
  virtual MonoTime Monotonic() const = 0;
};

// The system clocks.
class RealClock final : public Clock {
 public:
  WallTime Now() const override { return std::chrono::system_clock::now(); }
  MonoTime Monotonic() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace meshrun::coordinator
