// A cuda worker's GPUs without a GPU: the inventory from a faked NVML device list (and the
// worker's CUDA_VISIBLE_DEVICES), the slot count, which GPU a rank gets, the environment it
// gets, the interface of --address, and `meshrun-worker --device cuda` on a node without GPUs
// (exit 2, the field, a hint).
#include "worker/gpu_inventory.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>

#include "worker/nvml.h"
#include "worker/rank_protocol.h"

namespace meshrun {
namespace {

std::vector<GpuDevice> FakeNode(int n) {
  std::vector<GpuDevice> out;
  for (int i = 0; i < n; ++i) out.push_back({i, std::to_string(i), "NVIDIA H200", 141ull << 30});
  return out;
}

TEST(GpuInventoryTest, EveryDeviceOrTheWorkersVisibleOnes) {
  auto all = CudaInventory(FakeNode(4), nullptr, "");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[3].id, "3");
  EXPECT_EQ((*all)[3].name, "NVIDIA H200");

  auto some = CudaInventory(FakeNode(4), "2, 0", "");
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 2u);
  EXPECT_EQ((*some)[0].id, "2");
  EXPECT_EQ((*some)[0].index, 2);
  EXPECT_EQ((*some)[1].id, "0");
  EXPECT_EQ((*some)[0].memory_bytes, 141ull << 30);

  auto uuid = CudaInventory({}, "GPU-8f1c2d3e-0000-1111-2222-333344445555", "");
  ASSERT_TRUE(uuid.ok());
  EXPECT_EQ((*uuid)[0].id, "GPU-8f1c2d3e-0000-1111-2222-333344445555");

  // CUDA stops at the first invalid entry.
  auto stops = CudaInventory(FakeNode(2), "1,7,0", "");
  ASSERT_TRUE(stops.ok());
  EXPECT_EQ(stops->size(), 1u);
}

TEST(GpuInventoryTest, NoGpuIsAnInputErrorNamingTheFlag) {
  auto none = CudaInventory({}, nullptr, "NVML: cannot load libnvidia-ml.so.1: not found");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(),
            "--device: cuda, but this node offers no GPU (NVML: cannot load libnvidia-ml.so.1: "
            "not found) (hint: run the worker on a node with an NVIDIA GPU and its driver, check "
            "CUDA_VISIBLE_DEVICES, or use --device cpu)");
  auto hidden = CudaInventory(FakeNode(2), "-1", "");
  ASSERT_FALSE(hidden.ok());
  EXPECT_NE(hidden.status().message().find("CUDA_VISIBLE_DEVICES=\"-1\""), std::string::npos);
}

TEST(GpuInventoryTest, OneSlotPerGpuByDefault) {
  EXPECT_EQ(*CudaSlots(8, 0), 8);
  EXPECT_EQ(*CudaSlots(8, 3), 3);
  auto too_many = CudaSlots(2, 4);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(too_many.status().message(),
            "--slots: 4 slots for 2 GPU(s); each cuda rank needs a GPU of its own (hint: use "
            "--slots 2 or leave --slots out)");
}

TEST(GpuInventoryTest, ARankGetsItsLocalRanksGpuOrAFreeOne) {
  EXPECT_EQ(PickGpu(1, {false, false, false}), 1);
  EXPECT_EQ(PickGpu(1, {false, true, false}), 0);
  EXPECT_EQ(PickGpu(5, {true, false}), 1);
  EXPECT_EQ(PickGpu(0, {true, true}), std::nullopt);
}

TEST(GpuInventoryTest, TheEnvironmentOfACudaRank) {
  GpuDevice gpu{3, "3", "NVIDIA H200", 0};
  auto env = GpuRankEnv(gpu, "eth0", 0);
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(env, (Env{{"CUDA_VISIBLE_DEVICES", "3"},
                      {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                      {"NCCL_SOCKET_IFNAME", "eth0"}}));
  auto with_peak = GpuRankEnv(gpu, "", 989.4);
  EXPECT_EQ(with_peak, (Env{{"CUDA_VISIBLE_DEVICES", "3"},
                            {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                            {"MESHRUN_PEAK_TFLOPS", "989.4"}}));
  // The worker's own CUDA_VISIBLE_DEVICES (all its GPUs) gives way to the rank's one GPU;
  // NCCL_* of the worker reaches the rank.
  std::vector<std::string> merged = MergeEnvironment(
      {"PATH=/bin", "CUDA_VISIBLE_DEVICES=0,1,2,3", "NCCL_DEBUG=WARN", "MESHRUN_PEAK_TFLOPS=1"},
      env);
  EXPECT_EQ(merged,
            (std::vector<std::string>{"PATH=/bin", "NCCL_DEBUG=WARN", "CUDA_VISIBLE_DEVICES=3",
                                      "CUDA_DEVICE_ORDER=PCI_BUS_ID", "NCCL_SOCKET_IFNAME=eth0"}));
}

TEST(GpuInventoryTest, InterfaceOfAnAddress) {
  const std::string lo = InterfaceOf("127.0.0.1");
  if (lo.empty()) GTEST_SKIP() << "no interface holds 127.0.0.1 here";
  EXPECT_EQ(lo.substr(0, 2), "lo");
  EXPECT_EQ(InterfaceOf("192.0.2.123"), "") << "TEST-NET-1 is on no interface";
}

// nvmlDeviceGetName and the total memory come through Nvml::Devices.
struct NamedDriver {
  static int Init() { return 0; }
  static int Count(unsigned int* n) {
    *n = 2;
    return 0;
  }
  static int ByIndex(unsigned int i, NvmlApi::Device* d) {
    *d = reinterpret_cast<NvmlApi::Device>(static_cast<uintptr_t>(i + 1));
    return 0;
  }
  static int Memory(NvmlApi::Device, NvmlApi::Memory* m) {
    m->total = 141ull << 30;
    return 0;
  }
  static int Utilization(NvmlApi::Device, NvmlApi::Utilization*) { return 0; }
  static int Name(NvmlApi::Device d, char* out, unsigned int n) {
    std::snprintf(out, n, "NVIDIA H200 #%d", static_cast<int>(reinterpret_cast<uintptr_t>(d)));
    return 0;
  }
  static int Shutdown() { return 0; }
};

TEST(GpuInventoryTest, NvmlDevicesCarryNameAndMemory) {
  NvmlApi api;
  api.init = &NamedDriver::Init;
  api.device_count = &NamedDriver::Count;
  api.device_by_index = &NamedDriver::ByIndex;
  api.memory_info = &NamedDriver::Memory;
  api.utilization = &NamedDriver::Utilization;
  api.shutdown = &NamedDriver::Shutdown;
  api.device_name = &NamedDriver::Name;
  auto nvml = Nvml::FromApi(api);
  ASSERT_TRUE(nvml.ok());
  std::vector<GpuDevice> d = (*nvml)->Devices();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].index, 1);
  EXPECT_EQ(d[1].name, "NVIDIA H200 #2");
  EXPECT_EQ(d[1].memory_bytes, 141ull << 30);
  auto offered = CudaInventory(d, nullptr, "");
  ASSERT_TRUE(offered.ok());
  EXPECT_EQ(*CudaSlots(static_cast<int>(offered->size()), 0), 2);
}

#ifdef MESHRUN_WORKER_BIN
TEST(GpuInventoryTest, WorkerWithDeviceCudaOnANodeWithoutGpus) {
  if (Nvml::Load().ok()) GTEST_SKIP() << "this node has NVML (a GPU driver)";
  const std::string cmd = std::string(MESHRUN_WORKER_BIN) +
                          " --coordinator 127.0.0.1:1 --name w --device cuda --work-dir "
                          "/tmp/meshrun-gpu-inventory-test --meshrun /bin/true 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_EQ(out.rfind("error: --device: cuda, but this node offers no GPU (NVML: cannot load "
                      "libnvidia-ml.so.1",
                      0),
            0u)
      << out;
  EXPECT_NE(out.find("(hint: "), std::string::npos) << out;
}
#endif

}  // namespace
}  // namespace meshrun
