// The one checking macro of the GPU path: every CUDA runtime, cuBLAS(Lt) and NCCL return code goes
// through MESHRUN_GPU_TRY, which turns a failure into a Status naming the expression and file:line,
// keeps the first such error of the process (FirstGpuError) and returns it from the caller.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "common/status.h"

namespace meshrun::gpu {

// OK for success; otherwise the error (INTERNAL, RESOURCE_EXHAUSTED for out-of-memory,
// UNAVAILABLE for a missing or busy device) with "<expr> failed at <file>:<line>: <reason>".
// A failure is also recorded as the process's first GPU error when it is the first.
// (The ncclResult_t overload lives in engine/comm/nccl_communicator.cc, next to the only NCCL
// calls.)
Status ToStatus(cudaError_t result, const char* expr, const char* file, int line);
Status ToStatus(cublasStatus_t result, const char* expr, const char* file, int line);

// The first GPU error of this process (OK when none): a rank reports it on exit, since a
// sticky CUDA error makes every later call fail with a less useful message.
Status FirstGpuError();
// Records `status` as the first GPU error unless one is already recorded. Thread-safe.
void RecordGpuError(const Status& status);
// Forgets the recorded error (tests only).
void ClearFirstGpuError();

// Number of CUDA devices; 0 when the driver or device is missing (never an error).
int DeviceCount();

}  // namespace meshrun::gpu

// MESHRUN_GPU_TRY(cudaMemcpyAsync(...)); in a function returning Status (or StatusOr<T>).
#define MESHRUN_GPU_TRY(expr)                                        \
  do {                                                               \
    ::meshrun::Status _mr_gpu_status =                               \
        ::meshrun::gpu::ToStatus((expr), #expr, __FILE__, __LINE__); \
    if (!_mr_gpu_status.ok()) return _mr_gpu_status;                 \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, at the launch site.
#define MESHRUN_GPU_TRY_LAUNCH() MESHRUN_GPU_TRY(cudaGetLastError())
