// The exit codes of every meshrun process (docs/cli.md, "Exit codes") and the one mapping of a
// Status to them, used by the client, the rank, the worker and the coordinator.
#pragma once

#include "common/status.h"

namespace meshrun {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;       // anything else
inline constexpr int kExitInvalidInput = 2;  // spec, flags, arguments
// Stopped by SIGINT/SIGTERM at a step boundary (with a checkpoint when checkpoint.dir is set);
// the same whatever --nproc is (128 + SIGINT, as shells report Ctrl-C).
inline constexpr int kExitInterrupted = 130;

// kExitOk for OK, kExitInvalidInput for INVALID_ARGUMENT (the caller's input), kExitFailure
// otherwise.
inline int ExitCodeFor(const Status& status) {
  if (status.ok()) return kExitOk;
  return status.code() == StatusCode::kInvalidArgument ? kExitInvalidInput : kExitFailure;
}

}  // namespace meshrun
