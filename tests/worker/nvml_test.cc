// NVML loaded at run time: the absent library (this machine, CI) is a clear NOT_FOUND, and a
// fake function table turns into meshrun_gpu_* families with the right values and labels.
#include "worker/nvml.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>

#include "worker/worker_metrics.h"

namespace meshrun {
namespace {

// The fake driver: two devices; device 1 refuses its utilization.
struct FakeDriver {
  static inline int init_rc = 0;
  static inline int inits = 0, shutdowns = 0;
  static int Init() {
    ++inits;
    return init_rc;
  }
  static int Count(unsigned int* n) {
    *n = 2;
    return 0;
  }
  static int ByIndex(unsigned int i, NvmlApi::Device* d) {
    *d = reinterpret_cast<NvmlApi::Device>(static_cast<uintptr_t>(i + 1));
    return 0;
  }
  static int Memory(NvmlApi::Device d, NvmlApi::Memory* m) {
    const auto i = reinterpret_cast<uintptr_t>(d) - 1;
    m->total = 80ull << 30;
    m->used = (i + 1) * (1ull << 30);
    m->free = m->total - m->used;
    return 0;
  }
  static int Utilization(NvmlApi::Device d, NvmlApi::Utilization* u) {
    if (reinterpret_cast<uintptr_t>(d) == 2) return 3;  // NVML_ERROR_NOT_SUPPORTED
    u->gpu = 87;
    u->memory = 40;
    return 0;
  }
  static int Shutdown() {
    ++shutdowns;
    return 0;
  }
  static NvmlApi Api() {
    NvmlApi api;
    api.init = &Init;
    api.device_count = &Count;
    api.device_by_index = &ByIndex;
    api.memory_info = &Memory;
    api.utilization = &Utilization;
    api.shutdown = &Shutdown;
    return api;
  }
};

TEST(Nvml, AbsentLibraryIsNotFoundWithTheReason) {
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load("libmeshrun-no-such-nvml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), StatusCode::kNotFound);
  EXPECT_NE(nvml.status().message().find("libmeshrun-no-such-nvml.so.1"), std::string::npos);
  EXPECT_NE(nvml.status().message().find("hint:"), std::string::npos);
}

TEST(Nvml, LibraryWithoutTheSymbolsIsNotFound) {
  // libc loads everywhere and has no nvmlInit_v2.
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load("libc.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), StatusCode::kNotFound);
  EXPECT_NE(nvml.status().message().find("nvmlInit_v2"), std::string::npos);
}

TEST(Nvml, InitFailureIsUnavailable) {
  FakeDriver::init_rc = 9;  // NVML_ERROR_DRIVER_NOT_LOADED
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::FromApi(FakeDriver::Api());
  FakeDriver::init_rc = 0;
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Nvml::FromApi(NvmlApi{}).status().code(), StatusCode::kInvalidArgument);
}

TEST(Nvml, ReadingsBecomeGpuFamilies) {
  FakeDriver::shutdowns = 0;
  {
    StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::FromApi(FakeDriver::Api());
    ASSERT_TRUE(nvml.ok()) << nvml.status().ToString();
    const std::vector<GpuReading> readings = (*nvml)->Read();
    ASSERT_EQ(readings.size(), 2u);
    EXPECT_TRUE(readings[0].has_utilization);
    EXPECT_DOUBLE_EQ(readings[0].utilization_ratio, 0.87);
    EXPECT_FALSE(readings[1].has_utilization);

    const auto families = GpuFamilies("node-a", readings);
    std::map<std::string, double> values;  // "name gpu kind" -> value
    for (const auto& f : families) {
      EXPECT_EQ(f.type, prometheus::MetricType::Gauge);
      for (const auto& m : f.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& l : m.label) labels[l.name] = l.value;
        EXPECT_EQ(labels.at("worker"), "node-a");
        values[f.name + " " + labels.at("gpu") + " " +
               (labels.count("kind") ? labels["kind"] : "")] = m.gauge.value;
      }
    }
    const std::map<std::string, double> want = {
        {"meshrun_gpu_memory_bytes 0 used", 1.0 * (1ull << 30)},
        {"meshrun_gpu_memory_bytes 0 total", 80.0 * (1ull << 30)},
        {"meshrun_gpu_memory_bytes 1 used", 2.0 * (1ull << 30)},
        {"meshrun_gpu_memory_bytes 1 total", 80.0 * (1ull << 30)},
        {"meshrun_gpu_utilization_ratio 0 ", 0.87},
    };
    EXPECT_EQ(values, want);
  }
  EXPECT_EQ(FakeDriver::shutdowns, 1) << "nvmlShutdown when the Nvml goes";
  EXPECT_TRUE(GpuFamilies("node-a", {}).empty()) << "no devices, no families";
}

std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return body;
}

// One exposer only: each costs civetweb's 2 s shutdown poll (without NVML no GPU collector is
// registered at all: WorkerMetrics::Create with a null Nvml).
TEST(WorkerMetricsGpu, ServedAtScrapeTime) {
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::FromApi(FakeDriver::Api());
  ASSERT_TRUE(nvml.ok());
  auto with = WorkerMetrics::Create("127.0.0.1:0", "node-a", 2, std::move(nvml).value());
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  const std::string body = Scrape((*with)->port());
  for (const char* line :
       {R"(meshrun_worker_up{worker="node-a"} 1)",
        R"(meshrun_gpu_utilization_ratio{worker="node-a",gpu="0"} 0.87)",
        R"(meshrun_gpu_memory_bytes{worker="node-a",gpu="1",kind="total"} 85899345920)"}) {
    EXPECT_NE(body.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << body;
  }
}

}  // namespace
}  // namespace meshrun
