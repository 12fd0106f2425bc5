// The device check of a rank's start (resources.device).
#include "engine/train/device.h"

#include "common/job_spec.h"

#ifdef MESHRUN_HAVE_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

namespace meshrun {

int VisibleCudaDevices(std::string* why_none) {
#ifdef MESHRUN_HAVE_CUDA_RUNTIME
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_none != nullptr) *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e);
    (void)cudaGetLastError();  // not sticky: later calls start clean
    return 0;
  }
  if (n == 0 && why_none != nullptr) *why_none = "cudaGetDeviceCount: 0 devices";
  return n;
#else
  if (why_none != nullptr) *why_none = "this build has no CUDA runtime";
  return 0;
#endif
}

Status CheckTrainingDevice(const std::string& device) {
  const std::optional<ComputeDevice> kind = ParseComputeDevice(device);
  if (kind == ComputeDevice::kCpu) return OkStatus();
  if (kind != ComputeDevice::kCuda) {
    return InvalidArgumentError("resources.device: '" + device +
                                "' is not a device (hint: use cpu or cuda)");
  }
#ifndef MESHRUN_HAVE_CUDA_RUNTIME
  return InvalidArgumentError(
      "resources.device: cuda needs an engine built with the CUDA toolkit, and this one was built "
      "without it (hint: install the CUDA toolkit under /usr/local/cuda and rebuild, or use "
      "resources.device: cpu)");
#else
  std::string why;
  const int n = VisibleCudaDevices(&why);
  if (n == 0) {
    return InvalidArgumentError(
        "resources.device: no CUDA device is visible (" + why +
        ") (hint: run on a machine with an NVIDIA GPU and its driver, check "
        "CUDA_VISIBLE_DEVICES, or use resources.device: cpu)");
  }
  return OkStatus();  // the model's ops run on the rank's GPU (engine/ops)
#endif
}

}  // namespace meshrun
