// What engine/ops/ops.cc shares with the dispatch of the op table (engine/ops/dispatch.cc).
#pragma once

#include "common/status.h"
#include "engine/core/tensor.h"

#if MESHRUN_WITH_CUDA
namespace meshrun::gpu {
class CudaContext;
}  // namespace meshrun::gpu
#endif

namespace meshrun::ops::internal {

#if MESHRUN_WITH_CUDA
// The device's context (stream, cuBLASLt handle), made on first use, for the life of the process.
StatusOr<gpu::CudaContext*> ContextOf(Device dev);
#else
// UNAVAILABLE: the engine was built without the CUDA path.
Status NotBuilt(const char* op);
#endif

}  // namespace meshrun::ops::internal
