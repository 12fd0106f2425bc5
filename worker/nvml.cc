// Nvml (see nvml.h): dlopen, symbol lookup and per-device readings.
#include "worker/nvml.h"

#include <dlfcn.h>

namespace meshrun {
namespace {

constexpr int kNvmlSuccess = 0;

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*out == nullptr) *missing = name;
  return *out != nullptr;
}

}  // namespace

StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return NotFoundError("NVML: cannot load " + library + ": " +
                         (why != nullptr ? why : "unknown error") +
                         " (hint: GPU series need the NVIDIA driver on this node)");
  }
  NvmlApi api;
  std::string missing;
  if (!Resolve(handle, "nvmlInit_v2", &api.init, &missing) ||
      !Resolve(handle, "nvmlDeviceGetCount_v2", &api.device_count, &missing) ||
      !Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", &api.device_by_index, &missing) ||
      !Resolve(handle, "nvmlDeviceGetMemoryInfo", &api.memory_info, &missing) ||
      !Resolve(handle, "nvmlDeviceGetUtilizationRates", &api.utilization, &missing) ||
      !Resolve(handle, "nvmlShutdown", &api.shutdown, &missing)) {
    dlclose(handle);
    return NotFoundError("NVML: " + library + " has no " + missing +
                         " (hint: update the NVIDIA driver)");
  }
  std::string optional;
  (void)Resolve(handle, "nvmlDeviceGetName", &api.device_name, &optional);
  return FromApi(api, handle);
}

StatusOr<std::unique_ptr<Nvml>> Nvml::FromApi(const NvmlApi& api, void* handle) {
  if (api.init == nullptr || api.device_count == nullptr || api.device_by_index == nullptr ||
      api.memory_info == nullptr || api.utilization == nullptr || api.shutdown == nullptr) {
    if (handle != nullptr) dlclose(handle);
    return InvalidArgumentError("NVML: incomplete function table");
  }
  if (const int rc = api.init(); rc != kNvmlSuccess) {
    if (handle != nullptr) dlclose(handle);
    return UnavailableError("NVML: nvmlInit_v2 returned " + std::to_string(rc) +
                            " (hint: check that the driver is loaded, e.g. with nvidia-smi)");
  }
  return std::unique_ptr<Nvml>(new Nvml(api, handle));
}

Nvml::~Nvml() {
  api_.shutdown();
  if (handle_ != nullptr) dlclose(handle_);
}

std::vector<GpuReading> Nvml::Read() const {
  std::vector<GpuReading> out;
  unsigned int count = 0;
  if (api_.device_count(&count) != kNvmlSuccess) return out;
  for (unsigned int i = 0; i < count; ++i) {
    NvmlApi::Device device = nullptr;
    if (api_.device_by_index(i, &device) != kNvmlSuccess) continue;
    GpuReading r;
    r.index = static_cast<int>(i);
    NvmlApi::Memory memory;
    if (api_.memory_info(device, &memory) == kNvmlSuccess) {
      r.has_memory = true;
      r.memory_used_bytes = static_cast<double>(memory.used);
      r.memory_total_bytes = static_cast<double>(memory.total);
    }
    NvmlApi::Utilization utilization;
    if (api_.utilization(device, &utilization) == kNvmlSuccess) {
      r.has_utilization = true;
      r.utilization_ratio = static_cast<double>(utilization.gpu) / 100.0;
    }
    out.push_back(r);
  }
  return out;
}

std::vector<GpuDevice> Nvml::Devices() const {
  std::vector<GpuDevice> out;
  unsigned int count = 0;
  if (api_.device_count(&count) != kNvmlSuccess) return out;
  for (unsigned int i = 0; i < count; ++i) {
    NvmlApi::Device device = nullptr;
    if (api_.device_by_index(i, &device) != kNvmlSuccess) continue;
    GpuDevice d;
    d.index = static_cast<int>(i);
    d.id = std::to_string(i);
    char name[96] = {0};
    if (api_.device_name != nullptr &&
        api_.device_name(device, name, sizeof(name) - 1) == kNvmlSuccess) {
      d.name = name;
    }
    NvmlApi::Memory memory;
    if (api_.memory_info(device, &memory) == kNvmlSuccess) d.memory_bytes = memory.total;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace meshrun
