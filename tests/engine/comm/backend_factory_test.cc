// The backend by resources.device: Gloo on cpu (when built), NCCL on cuda (when built), and the
// errors of a build or device without one.
#include "engine/comm/backend_factory.h"

#include <gtest/gtest.h>

namespace meshrun {
namespace {

TEST(BackendFactoryTest, NamesByDevice) {
  EXPECT_STREQ(CommBackendName("cpu"), "gloo");
  EXPECT_STREQ(CommBackendName("cuda"), "nccl");
}

TEST(BackendFactoryTest, UnknownDeviceIsAnInputError) {
  auto b = CreateCommBackend("tpu");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.status().message(),
            "resources.device: 'tpu' is not a device (hint: use cpu or cuda)");
}

TEST(BackendFactoryTest, CpuIsGlooWhenBuiltIn) {
  auto b = CreateCommBackend("cpu", {"127.0.0.1", 0});
  if (!HasCommBackend("cpu")) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("resources.device: cpu trains over gloo"),
              std::string::npos)
        << b.status().message();
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->name(), "gloo");
}

TEST(BackendFactoryTest, CudaIsNcclOrSaysWhatIsMissing) {
  auto b = CreateCommBackend("cuda");
  if (!HasCommBackend("cuda")) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(b.status().message(),
              "resources.device: cuda trains over nccl across ranks, and this build has no nccl "
              "(NCCL was not found) (hint: run one rank, or use a full build with NCCL "
              "installed)");
    return;
  }
  // With NCCL built in, Create fails only without a device (UNAVAILABLE naming cuda:0).
  if (!b.ok()) {
    EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().ToString();
    EXPECT_NE(b.status().message().find("cuda:0"), std::string::npos);
    return;
  }
  EXPECT_EQ((*b)->name(), "nccl");
}

}  // namespace
}  // namespace meshrun
