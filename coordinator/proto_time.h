// Conversions between the coordinator's clocks and protobuf's Timestamp/Duration, and the
// milliseconds StateDb stores. Header-only, pure.
#pragma once

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/timestamp.pb.h>

#include <chrono>
#include <cstdint>

#include "coordinator/clock.h"
#include "proto/duration.h"

namespace meshrun::coordinator {

inline int64_t ToMillis(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

inline WallTime FromMillis(int64_t ms) {
  return WallTime(std::chrono::milliseconds(ms));
}

// Leaves `out` unset for 0 (the "unset" of StateDb rows).
inline void SetTimestampMillis(int64_t ms, google::protobuf::Timestamp* out) {
  if (ms == 0) return;
  out->set_seconds(ms / 1000);
  out->set_nanos(static_cast<int32_t>((ms % 1000) * 1'000'000));
}

inline void SetTimestamp(WallTime t, google::protobuf::Timestamp* out) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  out->set_seconds(ns / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(ns % 1'000'000'000));
}

inline void SetDuration(std::chrono::milliseconds d, google::protobuf::Duration* out) {
  out->set_seconds(d.count() / 1000);
  out->set_nanos(static_cast<int32_t>((d.count() % 1000) * 1'000'000));
}

// Saturating (proto/duration.h): a peer's Duration of any size is safe.
inline std::chrono::milliseconds FromDuration(const google::protobuf::Duration& d) {
  return DurationToMillis(d);
}

}  // namespace meshrun::coordinator
