// NVIDIA's management library (NVML), loaded at run time with dlopen("libnvidia-ml.so.1") so
// that meshrun-worker needs neither the CUDA toolkit to build nor a driver to run: the few
// entry points it reads are declared here as plain C function pointers. Feeds the worker's
// meshrun_gpu_memory_bytes{worker,gpu,kind} and meshrun_gpu_utilization_ratio{worker,gpu}
// (docs/metrics.md); without the library those series are simply absent.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/gpu_inventory.h"

namespace meshrun {

// The NVML C ABI used here (nvml.h's types, declared again to avoid the header). Every call
// returns nvmlReturn_t, 0 = NVML_SUCCESS.
struct NvmlApi {
  using Device = void*;  // nvmlDevice_t
  struct Memory {        // nvmlMemory_t (bytes)
    unsigned long long total = 0;
    unsigned long long free = 0;
    unsigned long long used = 0;
  };
  struct Utilization {  // nvmlUtilization_t (percent over the last sample period)
    unsigned int gpu = 0;
    unsigned int memory = 0;
  };
  int (*init)() = nullptr;                                  // nvmlInit_v2
  int (*device_count)(unsigned int*) = nullptr;             // nvmlDeviceGetCount_v2
  int (*device_by_index)(unsigned int, Device*) = nullptr;  // nvmlDeviceGetHandleByIndex_v2
  int (*memory_info)(Device, Memory*) = nullptr;            // nvmlDeviceGetMemoryInfo
  int (*utilization)(Device, Utilization*) = nullptr;       // nvmlDeviceGetUtilizationRates
  int (*shutdown)() = nullptr;                              // nvmlShutdown
  // Optional (names are informational): nvmlDeviceGetName.
  int (*device_name)(Device, char*, unsigned int) = nullptr;
};

// One device as read at one moment; a value NVML refused to give is absent (its flag false).
struct GpuReading {
  int index = 0;  // NVML's device index (DCGM's `gpu` label)
  bool has_memory = false;
  double memory_used_bytes = 0, memory_total_bytes = 0;
  bool has_utilization = false;
  double utilization_ratio = 0;  // 0..1
};

// An initialized NVML. Thread-safe (NVML is; the object is immutable after Load).
class Nvml {
 public:
  static constexpr char kLibrary[] = "libnvidia-ml.so.1";

  // dlopen + dlsym + nvmlInit_v2. NOT_FOUND when the library or a symbol is missing (no NVIDIA
  // driver: the normal case on CPU machines), UNAVAILABLE when nvmlInit_v2 fails; the message
  // says which.
  static StatusOr<std::unique_ptr<Nvml>> Load(const std::string& library = kLibrary);
  // Over a given function table (tests); calls its init. `handle` is dlclose'd at the end.
  static StatusOr<std::unique_ptr<Nvml>> FromApi(const NvmlApi& api, void* handle = nullptr);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Every device NVML reports now; empty when it reports none.
  std::vector<GpuReading> Read() const;
  // Every device with its name and total memory (what a cuda worker offers, gpu_inventory.h).
  std::vector<GpuDevice> Devices() const;

 private:
  Nvml(const NvmlApi& api, void* handle) : api_(api), handle_(handle) {}

  NvmlApi api_;
  void* handle_ = nullptr;
};

}  // namespace meshrun
