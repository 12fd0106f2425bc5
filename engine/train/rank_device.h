// Which GPU a rank trains on and the peak its MFU is measured against (docs/gpu.md). A worker
// makes exactly one GPU visible to each cuda rank (CUDA_VISIBLE_DEVICES), which is then device
// 0; a standalone `meshrun train --nproc N` on a host with several visible GPUs gives local rank
// r device r mod N_visible.
#pragma once

#include <string>

#include "common/status.h"

namespace meshrun {

// The CUDA device ordinal of the rank with `local_rank` (0 without a runtime or with one GPU).
int RankCudaDevice(int local_rank);

// cudaDeviceProp::name of `device` ("" without a runtime or such a device).
std::string CudaDeviceName(int device);

// MFU's peak for one rank, in FLOP/s: MESHRUN_PEAK_TFLOPS when set; else on cuda the table of
// common/gpu_peak.h by the device's name (+infinity for a GPU it lacks: MFU reads 0, and
// *note says so); else 0, meaning "measure" (the trainer's float32 GEMM on cpu).
// INVALID_ARGUMENT for a malformed MESHRUN_PEAK_TFLOPS.
StatusOr<double> RankPeakFlops(const std::string& device, int cuda_device,
                               std::string* note = nullptr);

}  // namespace meshrun
