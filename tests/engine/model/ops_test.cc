// The device-generic ops (engine/ops/ops.h): on cpu they are the cpu kernels; a cuda call in an
// engine without CUDA, or on a machine without a GPU, is a clear error, never a crash.
#include "engine/ops/ops.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/kernels/cpu/kernels.h"

namespace meshrun {
namespace {

constexpr Device kCpu{};
constexpr Device kCuda{DeviceType::kCuda, 0};

TEST(Ops, CpuCallsTheCpuKernels) {
  std::vector<float> a = {1, -2, 3, 0.5f}, b = {0.25f, 4, -1, 2}, out(4), want(4);
  ASSERT_TRUE(ops::ResidualForward(kCpu, out.data(), a.data(), b.data(), 4).ok());
  cpu::ResidualForward(want.data(), a.data(), b.data(), 4);
  EXPECT_EQ(out, want);
  auto sum = ops::Sum(kCpu, a.data(), 4);
  ASSERT_TRUE(sum.ok());
  EXPECT_DOUBLE_EQ(*sum, 2.5);
  auto sq = ops::SumOfSquares(kCpu, a.data(), 4);
  ASSERT_TRUE(sq.ok());
  EXPECT_DOUBLE_EQ(*sq, cpu::SumOfSquares(a.data(), 4));
  std::vector<float> host(4);
  ASSERT_TRUE(ops::CopyToHost(kCpu, host.data(), out.data(), sizeof(float) * 4).ok());
  EXPECT_EQ(host, want);
  ASSERT_TRUE(ops::Zero(kCpu, host.data(), sizeof(float) * 4).ok());
  EXPECT_EQ(host, std::vector<float>(4, 0.0f));
}

TEST(Ops, CudaWithoutCudaIsAClearError) {
  float x = 1;
  const Status s = ops::Scale(kCuda, &x, 1, 2.0);
  if (!ops::CudaBuilt()) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("not built into this engine"), std::string::npos) << s.message();
  } else if (s.ok()) {
    GTEST_SKIP() << "a CUDA device is visible here (tests/gpu covers the cuda ops)";
  } else {
    EXPECT_FALSE(s.message().empty());  // no device: the context says why
  }
  EXPECT_EQ(x, 1.0f);  // nothing ran on the host pointer
  double d = 1;
  const Status sd = ops::Scale(kCuda, &d, 1, 2.0);
  EXPECT_FALSE(sd.ok());
  if (ops::CudaBuilt()) {
    EXPECT_EQ(sd.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(sd.message().find("float32"), std::string::npos) << sd.message();
  }
}

}  // namespace
}  // namespace meshrun
