// The GPU peak table (MFU's denominator on cuda) and its MESHRUN_PEAK_TFLOPS override.
#include "common/gpu_peak.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace meshrun {
namespace {

TEST(GpuPeakTest, TableByDeviceName) {
  // Names as cudaDeviceProp::name and NVML report them.
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA H200"), 989.4);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA H200 NVL"), 835.5);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA H100 PCIe"), 756.5);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA H100 NVL"), 835.5);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA GH200 480GB"), 989.4);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA A100 80GB PCIe"), 312.0);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA L40S"), 362.05);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA L40"), 181.05);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA L4"), 121.0);
  EXPECT_EQ(DenseBf16PeakTflops("NVIDIA A10G"), 70.0);
  EXPECT_EQ(DenseBf16PeakTflops("nvidia h200"), 989.4) << "case-insensitive";
  EXPECT_FALSE(DenseBf16PeakTflops("Tesla V100-SXM2-16GB").has_value()) << "no bf16";
  EXPECT_FALSE(DenseBf16PeakTflops("").has_value());
  EXPECT_FALSE(DenseBf16PeakTflops("NVIDIA L400").has_value()) << "whole tokens only";
  size_t n = 0;
  const GpuPeakEntry* table = GpuPeakTable(&n);
  ASSERT_GT(n, 5u);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_GT(table[i].bf16_tflops, 0) << table[i].pattern;
    EXPECT_NE(std::string(table[i].source), "") << table[i].pattern;
  }
}

TEST(GpuPeakTest, EnvironmentOverride) {
  unsetenv("MESHRUN_PEAK_TFLOPS");
  auto none = PeakTflopsFromEnv();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  setenv("MESHRUN_PEAK_TFLOPS", "500.5", 1);
  auto set = PeakTflopsFromEnv();
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(**set, 500.5);
  for (const char* bad : {"fast", "-3", "0", "12x"}) {
    setenv("MESHRUN_PEAK_TFLOPS", bad, 1);
    auto s = PeakTflopsFromEnv();
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("MESHRUN_PEAK_TFLOPS: '"), std::string::npos);
    EXPECT_NE(s.status().message().find("(hint: "), std::string::npos);
  }
  unsetenv("MESHRUN_PEAK_TFLOPS");
}

}  // namespace
}  // namespace meshrun
