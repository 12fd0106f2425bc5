// The spelling of the API's states in JSON, tables, logs and Prometheus labels: the proto enum
// name without its prefix ("JOB_STATE_RUNNING" -> "RUNNING"). The one copy, used by the
// coordinator (metrics, errors), the worker and the client. Header-only, pure.
#pragma once

#include <string>
#include <string_view>

#include "meshrun/v1/types.pb.h"

namespace meshrun {

// `name` without `prefix`; "UNSPECIFIED" for a value the enum does not have (proto's _Name
// returns "" then).
inline std::string WithoutEnumPrefix(const std::string& name, std::string_view prefix) {
  if (name.empty()) return "UNSPECIFIED";
  if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
  return name;
}

inline std::string JobStateName(v1::JobState state) {
  return WithoutEnumPrefix(v1::JobState_Name(state), "JOB_STATE_");
}
inline std::string WorkerStateName(v1::WorkerState state) {
  return WithoutEnumPrefix(v1::WorkerState_Name(state), "WORKER_STATE_");
}
inline std::string RankStateName(v1::RankState state) {
  return WithoutEnumPrefix(v1::RankState_Name(state), "RANK_STATE_");
}

}  // namespace meshrun
