// Which device a rank trains on (resources.device), checked before anything is built for it:
// on cpu always available; on cuda the CUDA runtime must see a GPU (docs/gpu.md).
#pragma once

#include <string>

#include "common/status.h"

namespace meshrun {

// OK when `device` can train in this process. Otherwise INVALID_ARGUMENT naming
// resources.device: no CUDA runtime in this build, no CUDA device visible (with the runtime's
// error name), or — with GPUs visible — that the trainer does not run on them yet.
Status CheckTrainingDevice(const std::string& device);

// The GPUs the CUDA runtime sees (0 without a runtime or a device), and why none when none:
// the runtime's error name (e.g. cudaErrorNoDevice), "" when some are visible.
int VisibleCudaDevices(std::string* why_none = nullptr);

}  // namespace meshrun
