// std::chrono <-> google.protobuf.Duration/Timestamp, the one copy of each conversion. Every
// reader of a Duration sent by a peer (a StopOrder's grace, a heartbeat interval, a StoreGet
// timeout, a CancelJob grace) goes through DurationToMillis, which cannot overflow.
#pragma once

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/timestamp.pb.h>

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

inline void SetDuration(std::chrono::milliseconds d, google::protobuf::Duration* out) {
  out->set_seconds(d.count() / 1000);
  out->set_nanos(static_cast<int32_t>((d.count() % 1000) * 1'000'000));
}

inline void SetTimestamp(std::chrono::system_clock::time_point t,
                         google::protobuf::Timestamp* out) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  out->set_seconds(ns / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(ns % 1'000'000'000));
}

}  // namespace meshrun
