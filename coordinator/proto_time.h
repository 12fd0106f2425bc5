// The milliseconds StateDb stores <-> the coordinator's clock and protobuf's Timestamp.
// Header-only, pure. Duration and Timestamp of a clock value: proto/duration.h.
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

using meshrun::SetDuration;
using meshrun::SetTimestamp;

}  // namespace meshrun::coordinator
