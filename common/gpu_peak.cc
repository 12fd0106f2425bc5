// The GPU peak table of gpu_peak.h.
#include "common/gpu_peak.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace meshrun {
namespace {

// Dense bf16 with fp32 accumulation, from NVIDIA's datasheets (their "with sparsity" figures
// halved). Order matters: the first pattern found in the name wins.
constexpr GpuPeakEntry kTable[] = {
    {"GH200", 989.4, "NVIDIA GH200 Grace Hopper datasheet (1,979 TFLOPS sparse)"},
    {"H200 NVL", 835.5, "NVIDIA H200 datasheet, H200 NVL column (1,671 TFLOPS sparse)"},
    {"H200", 989.4, "NVIDIA H200 datasheet, H200 SXM column (1,979 TFLOPS sparse)"},
    {"H100 NVL", 835.5, "NVIDIA H100 datasheet, H100 NVL column (1,671 TFLOPS sparse)"},
    {"H100 PCIe", 756.5, "NVIDIA H100 datasheet, H100 PCIe column (1,513 TFLOPS sparse)"},
    {"H100", 989.4, "NVIDIA H100 datasheet, H100 SXM column (1,979 TFLOPS sparse)"},
    {"H800", 989.4, "NVIDIA H800 SXM (the H100 SXM's tensor cores)"},
    {"B200", 2250.0, "NVIDIA HGX B200 datasheet (4.5 PFLOPS sparse per GPU)"},
    {"A100", 312.0, "NVIDIA A100 datasheet (312 TFLOPS dense, SXM and PCIe)"},
    {"A800", 312.0, "NVIDIA A800 (the A100's tensor cores)"},
    {"L40S", 362.05, "NVIDIA L40S datasheet (733 TFLOPS sparse)"},
    {"L40", 181.05, "NVIDIA L40 datasheet (362.1 TFLOPS sparse)"},
    {"L4", 121.0, "NVIDIA L4 datasheet (242 TFLOPS sparse)"},
    {"A10G", 70.0, "AWS G5 (A10G) documentation, 70 TFLOPS bf16"},
    {"A10", 125.0, "NVIDIA A10 datasheet (250 TFLOPS sparse)"},
};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const GpuPeakEntry* GpuPeakTable(size_t* size) {
  *size = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

std::optional<double> DenseBf16PeakTflops(std::string_view device_name) {
  const std::string name = Lower(device_name);
  for (const GpuPeakEntry& e : kTable) {
    const std::string pattern = Lower(e.pattern);
    size_t at = name.find(pattern);
    while (at != std::string::npos) {
      // Whole tokens only: "L4" must not match "L40S", nor "A10" "A100".
      const size_t end = at + pattern.size();
      const bool starts = at == 0 || !std::isalnum(static_cast<unsigned char>(name[at - 1]));
      const bool ends = end == name.size() || !std::isalnum(static_cast<unsigned char>(name[end]));
      if (starts && ends) return e.bf16_tflops;
      at = name.find(pattern, at + 1);
    }
  }
  return std::nullopt;
}

StatusOr<std::optional<double>> PeakTflopsFromEnv() {
  const char* v = std::getenv("MESHRUN_PEAK_TFLOPS");
  if (v == nullptr || v[0] == '\0') return std::optional<double>();
  char* end = nullptr;
  const double tflops = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(tflops) || tflops <= 0) {
    return InvalidArgumentError(std::string("MESHRUN_PEAK_TFLOPS: '") + v +
                                "' is not a positive number of TFLOP/s (hint: e.g. "
                                "MESHRUN_PEAK_TFLOPS=989.4, or unset it to use the GPU table)");
  }
  return std::optional<double>(tflops);
}

}  // namespace meshrun
