// The worker's Prometheus endpoint (--metrics-listen): meshrun_worker_up,
// meshrun_worker_slots{worker,state="free"|"busy"} and meshrun_worker_session_connected
// (CONVENTIONS §7). Per-rank series (meshrun_rank_*) come in a later change.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace prometheus {
class Exposer;
class Gauge;
class Registry;
}  // namespace prometheus

namespace meshrun {

// Owns the HTTP exposer and the registry. Thread-safe (prometheus-cpp gauges are atomic).
class WorkerMetrics {
 public:
  // Listens on `listen` (HOST:PORT; port 0 picks a free one). UNAVAILABLE when it cannot bind.
  static StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& listen,
                                                         const std::string& worker_name, int slots);
  ~WorkerMetrics();

  void SetSlots(int busy);
  void SetConnected(bool connected);
  // The port it listens on.
  int port() const { return port_; }

 private:
  WorkerMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Gauge* up_ = nullptr;
  prometheus::Gauge* connected_ = nullptr;
  prometheus::Gauge* free_ = nullptr;
  prometheus::Gauge* busy_ = nullptr;
  int slots_ = 0;
  int port_ = 0;
};

}  // namespace meshrun
