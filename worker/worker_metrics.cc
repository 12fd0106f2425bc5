// WorkerMetrics (see worker_metrics.h) over prometheus-cpp's pull exposer.
#include "worker/worker_metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <exception>

namespace meshrun {

StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(const std::string& listen,
                                                               const std::string& worker_name,
                                                               int slots) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->slots_ = slots;
  m->up_ = &prometheus::BuildGauge()
                .Name("meshrun_worker_up")
                .Help("1 while the worker daemon runs")
                .Register(*m->registry_)
                .Add({{"worker", worker_name}});
  m->connected_ = &prometheus::BuildGauge()
                       .Name("meshrun_worker_session_connected")
                       .Help("1 while the worker's session with the coordinator is open")
                       .Register(*m->registry_)
                       .Add({{"worker", worker_name}});
  auto& slot_family = prometheus::BuildGauge()
                          .Name("meshrun_worker_slots")
                          .Help("Rank slots of the worker by state (free, busy)")
                          .Register(*m->registry_);
  m->free_ = &slot_family.Add({{"worker", worker_name}, {"state", "free"}});
  m->busy_ = &slot_family.Add({{"worker", worker_name}, {"state", "busy"}});
  m->up_->Set(1);
  m->SetSlots(0);
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return UnavailableError("--metrics-listen: cannot listen on " + listen + ": " + e.what() +
                            " (hint: pick a free port, or 127.0.0.1:0)");
  }
  m->exposer_->RegisterCollectable(m->registry_);
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  m->port_ = ports.empty() ? 0 : ports.front();
  return m;
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::SetSlots(int busy) {
  busy_->Set(busy);
  free_->Set(slots_ - busy);
}

void WorkerMetrics::SetConnected(bool connected) {
  connected_->Set(connected ? 1 : 0);
}

}  // namespace meshrun
