// WorkerMetrics (see worker_metrics.h) over prometheus-cpp's pull exposer.
#include "worker/worker_metrics.h"

#include <dlfcn.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <exception>

#include "common/metrics_http.h"

// The exposer's HTTP threads (civetweb's) ask for 100 KiB stacks, and glibc takes the static
// TLS of every library loaded at start out of each thread's stack: the worker links the engine
// (to count a rank's step before starting it, engine/train/counted_step.h), and with it
// OpenBLAS, whose static TLS alone is 60 KiB, which left a civetweb thread too little to format
// a request's path (a SIGSEGV in vsnprintf, seen in worker_nvml_test). The worker defines
// pthread_attr_setstacksize (exported from its executables, worker/CMakeLists.txt) so that no
// thread of its libraries starts with less than kMinThreadStack; glibc's does the rest.
namespace {
constexpr size_t kMinThreadStack = size_t{1} << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const auto glibc =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (glibc == nullptr) return ENOSYS;
  return glibc(attr, std::max(size, kMinThreadStack));
}

namespace meshrun {

std::vector<prometheus::MetricFamily> GpuFamilies(const std::string& worker_name,
                                                  const std::vector<GpuReading>& readings) {
  prometheus::MetricFamily memory;
  memory.name = "meshrun_gpu_memory_bytes";
  memory.help = "Device memory of each GPU of the node (NVML), used and total";
  memory.type = prometheus::MetricType::Gauge;
  prometheus::MetricFamily utilization;
  utilization.name = "meshrun_gpu_utilization_ratio";
  utilization.help = "Fraction of the last sample period a kernel ran on each GPU (NVML, 0..1)";
  utilization.type = prometheus::MetricType::Gauge;
  auto add = [&worker_name](prometheus::MetricFamily& f, int gpu, const char* kind, double v) {
    prometheus::ClientMetric m;
    m.label = {{"worker", worker_name}, {"gpu", std::to_string(gpu)}};
    if (kind != nullptr) m.label.push_back({"kind", kind});
    m.gauge.value = v;
    f.metric.push_back(std::move(m));
  };
  for (const GpuReading& r : readings) {
    if (r.has_memory) {
      add(memory, r.index, "used", r.memory_used_bytes);
      add(memory, r.index, "total", r.memory_total_bytes);
    }
    if (r.has_utilization) add(utilization, r.index, nullptr, r.utilization_ratio);
  }
  std::vector<prometheus::MetricFamily> out;
  if (!memory.metric.empty()) out.push_back(std::move(memory));
  if (!utilization.metric.empty()) out.push_back(std::move(utilization));
  return out;
}

// Reads NVML at scrape time.
class WorkerMetrics::GpuCollector final : public prometheus::Collectable {
 public:
  GpuCollector(std::string worker_name, std::unique_ptr<Nvml> nvml)
      : worker_name_(std::move(worker_name)), nvml_(std::move(nvml)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    return GpuFamilies(worker_name_, nvml_->Read());
  }

 private:
  std::string worker_name_;
  std::unique_ptr<Nvml> nvml_;
};

StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(const std::string& listen,
                                                               const std::string& worker_name,
                                                               int slots) {
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load();
  if (!nvml.ok()) {
    spdlog::info("no meshrun_gpu_* series: {}", nvml.status().message());
    return Create(listen, worker_name, slots, nullptr);
  }
  spdlog::info("NVML loaded: serving meshrun_gpu_* series");
  return Create(listen, worker_name, slots, std::move(nvml).value());
}

StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(const std::string& listen,
                                                               const std::string& worker_name,
                                                               int slots,
                                                               std::unique_ptr<Nvml> nvml) {
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
    m->exposer_ = std::make_unique<prometheus::Exposer>(MetricsHttpOptions(listen));
  } catch (const std::exception& e) {
    return UnavailableError("--metrics-listen: cannot listen on " + listen + ": " + e.what() +
                            " (hint: pick a free port, or 127.0.0.1:0)");
  }
  m->exposer_->RegisterCollectable(m->registry_);
  if (nvml != nullptr) {
    m->gpus_ = std::make_shared<GpuCollector>(worker_name, std::move(nvml));
    m->exposer_->RegisterCollectable(m->gpus_);
  }
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
