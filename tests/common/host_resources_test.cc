// The host-resources probe over fake cgroup folders: v2 and v1 memory limits and CPU quotas cap
// the physical figures; "max", -1, garbage and missing files leave them.
#include "common/host_resources.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class HostResourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_host_resources_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  HostResources Physical() const { return HostResources{64.0 * (1 << 30), 16}; }
  std::string root_;
};

TEST_F(HostResourcesTest, NoCgroupFilesLeaveThePhysicalFigures) {
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.memory_bytes, 64.0 * (1 << 30));
  EXPECT_EQ(r.cores, 16);
}

TEST_F(HostResourcesTest, CgroupV2MemoryMaxAndCpuMaxCap) {
  Write("memory.max", "8589934592\n");
  Write("cpu.max", "250000 100000\n");  // 2.5 CPUs: 3 cores to share
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.memory_bytes, 8589934592.0);
  EXPECT_EQ(r.cores, 3);
}

TEST_F(HostResourcesTest, CgroupV2UnlimitedLeavesThePhysicalFigures) {
  Write("memory.max", "max\n");
  Write("cpu.max", "max 100000\n");
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.memory_bytes, 64.0 * (1 << 30));
  EXPECT_EQ(r.cores, 16);
}

TEST_F(HostResourcesTest, CgroupV1LimitAndQuotaCap) {
  Write("memory/memory.limit_in_bytes", "4294967296\n");
  Write("cpu/cpu.cfs_quota_us", "200000\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.memory_bytes, 4294967296.0);
  EXPECT_EQ(r.cores, 2);
}

TEST_F(HostResourcesTest, CgroupV1UnlimitedLeavesThePhysicalFigures) {
  Write("memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  Write("cpu/cpu.cfs_quota_us", "-1\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.memory_bytes, 64.0 * (1 << 30));
  EXPECT_EQ(r.cores, 16);
}

TEST_F(HostResourcesTest, ALimitAboveThePhysicalFiguresDoesNotRaiseThem) {
  Write("memory.max", "137438953472\n");  // 128 GiB
  Write("cpu.max", "3200000 100000\n");   // 32 CPUs
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.memory_bytes, 64.0 * (1 << 30));
  EXPECT_EQ(r.cores, 16);
}

TEST_F(HostResourcesTest, ASmallQuotaStillLeavesOneCore) {
  Write("cpu.max", "10000 100000\n");  // a tenth of a CPU
  Write("memory.max", "garbage\n");
  const HostResources r = CapByCgroup(Physical(), root_);
  EXPECT_EQ(r.cores, 1);
  EXPECT_EQ(r.memory_bytes, 64.0 * (1 << 30));
}

TEST_F(HostResourcesTest, ThisHostHasMemoryAndACore) {
  const HostResources r = ProbeHostResources();
  EXPECT_GT(r.memory_bytes, 0);
  EXPECT_GE(r.cores, 1);
}

}  // namespace
}  // namespace meshrun
