// The worker's Prometheus endpoint (--metrics-listen): the node's series, meshrun_worker_up,
// meshrun_worker_slots{worker,state="free"|"busy"}, meshrun_worker_session_connected and, when
// NVML loads, meshrun_gpu_memory_bytes{worker,gpu,kind="used"|"total"} and
// meshrun_gpu_utilization_ratio{worker,gpu} read at scrape time (docs/metrics.md). Per-rank and
// job series are the coordinator's (docs/decisions/0003-where-metrics-live.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/nvml.h"

namespace prometheus {
class Exposer;
class Gauge;
class Registry;
struct MetricFamily;
}  // namespace prometheus

namespace meshrun {

// The GPU families of `readings` (one metric per device and kind; values NVML refused are
// left out).
std::vector<prometheus::MetricFamily> GpuFamilies(const std::string& worker_name,
                                                  const std::vector<GpuReading>& readings);

// Owns the HTTP exposer and the registry. Thread-safe (prometheus-cpp gauges are atomic).
class WorkerMetrics {
 public:
  // Listens on `listen` (HOST:PORT; port 0 picks a free one). UNAVAILABLE when it cannot bind.
  // Serves the GPU series of `nvml` when given; by default it loads NVML itself and, when that
  // fails, logs one info line saying why and serves no GPU series.
  static StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& listen,
                                                         const std::string& worker_name, int slots);
  static StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& listen,
                                                         const std::string& worker_name, int slots,
                                                         std::unique_ptr<Nvml> nvml);
  ~WorkerMetrics();

  void SetSlots(int busy);
  void SetConnected(bool connected);
  // The port it listens on.
  int port() const { return port_; }

 private:
  class GpuCollector;
  WorkerMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<GpuCollector> gpus_;  // null without NVML
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Gauge* up_ = nullptr;
  prometheus::Gauge* connected_ = nullptr;
  prometheus::Gauge* free_ = nullptr;
  prometheus::Gauge* busy_ = nullptr;
  int slots_ = 0;
  int port_ = 0;
};

}  // namespace meshrun
