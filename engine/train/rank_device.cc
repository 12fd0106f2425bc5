// RankCudaDevice, CudaDeviceName, RankPeakFlops (rank_device.h).
#include "engine/train/rank_device.h"

#include <limits>

#include "common/gpu_peak.h"
#include "common/job_spec.h"
#include "engine/train/device.h"

#ifdef MESHRUN_HAVE_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

namespace meshrun {

int RankCudaDevice(int local_rank) {
  const int visible = VisibleCudaDevices();
  if (visible <= 1 || local_rank < 0) return 0;
  return local_rank % visible;
}

std::string CudaDeviceName(int device) {
#ifdef MESHRUN_HAVE_CUDA_RUNTIME
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return props.name;
#else
  (void)device;
  return "";
#endif
}

StatusOr<double> RankPeakFlops(const std::string& device, int cuda_device, std::string* note) {
  MESHRUN_ASSIGN_OR_RETURN(std::optional<double> env, PeakTflopsFromEnv());
  if (env) return *env * 1e12;
  if (ParseComputeDevice(device) != ComputeDevice::kCuda) return 0.0;
  const std::string name = CudaDeviceName(cuda_device);
  if (std::optional<double> tflops = DenseBf16PeakTflops(name)) return *tflops * 1e12;
  if (note != nullptr && !name.empty()) {
    *note = "note: MFU reads 0: the GPU '" + name +
            "' is not in meshrun's peak table (hint: set MESHRUN_PEAK_TFLOPS to its dense bf16 "
            "TFLOP/s, or meshrun-worker --peak-tflops)";
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace meshrun
