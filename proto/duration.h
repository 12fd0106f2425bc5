// google.protobuf.Duration -> std::chrono::milliseconds without overflow: every reader of a
// Duration sent by a peer (a StopOrder's grace, a heartbeat interval, a StoreGet timeout, a
// CancelJob grace) goes through this one function.
#pragma once

#include <google/protobuf/duration.pb.h>

#include <chrono>
#include <cstdint>
#include <limits>

namespace meshrun {

// The duration in whole milliseconds, saturated at ±kMaxDurationMillis (about 292 million
// years would overflow int64 nanoseconds; callers clamp further to what they allow).
inline constexpr int64_t kMaxDurationMillis = std::numeric_limits<int64_t>::max() / 1'000'000;

inline std::chrono::milliseconds DurationToMillis(const google::protobuf::Duration& d) {
  constexpr int64_t kMaxSeconds = kMaxDurationMillis / 1000;
  if (d.seconds() >= kMaxSeconds) return std::chrono::milliseconds(kMaxDurationMillis);
  if (d.seconds() <= -kMaxSeconds) return std::chrono::milliseconds(-kMaxDurationMillis);
  // |nanos| < 1e9 for a valid Duration; a peer may send anything, so clamp it too.
  const int64_t nanos = d.nanos() > 999'999'999    ? 999'999'999
                        : d.nanos() < -999'999'999 ? -999'999'999
                                                   : d.nanos();
  return std::chrono::milliseconds(d.seconds() * 1000 + nanos / 1'000'000);
}

}  // namespace meshrun
