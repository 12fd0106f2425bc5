// The dense bf16 tensor-core peak of NVIDIA GPUs by device name: the denominator of MFU on cuda
// (docs/gpu.md "MFU"), overridable with MESHRUN_PEAK_TFLOPS (or meshrun-worker --peak-tflops,
// which sets it for the worker's ranks).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace meshrun {

struct GpuPeakEntry {
  const char* pattern;  // matched case-insensitively as a substring of the device name
  double bf16_tflops;   // dense (no structured sparsity)
  const char* source;   // the datasheet the figure comes from
};

// The table, most specific pattern first ("H100 PCIe" before "H100"). docs/gpu.md lists it.
const GpuPeakEntry* GpuPeakTable(size_t* size);

// Dense bf16 TFLOP/s of the GPU named `device_name` (cudaDeviceProp::name or NVML's name, e.g.
// "NVIDIA H200"); nullopt for a GPU the table does not know.
std::optional<double> DenseBf16PeakTflops(std::string_view device_name);

// MESHRUN_PEAK_TFLOPS when set: a positive number of TFLOP/s. nullopt when unset or empty;
// INVALID_ARGUMENT naming the variable when it is not a positive number.
StatusOr<std::optional<double>> PeakTflopsFromEnv();

}  // namespace meshrun
