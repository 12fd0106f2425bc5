// MetricsExporter: a Collectable that turns manager snapshots into metric families.
#include "coordinator/metrics_exporter.h"

#include <netdb.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <map>
#include <thread>

namespace meshrun::coordinator {
namespace {

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddGauge(prometheus::MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels,
              double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

const char* WorkerStateName(v1::WorkerState s) {
  switch (s) {
    case v1::WORKER_STATE_READY: return "READY";
    case v1::WORKER_STATE_BUSY: return "BUSY";
    case v1::WORKER_STATE_LOST: return "LOST";
    default: return "UNSPECIFIED";
  }
}

constexpr v1::JobState kJobStates[] = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,
                                       v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,
                                       v1::JOB_STATE_CANCELLED};

}  // namespace

class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  Collector(JobsFn jobs, WorkersFn workers)
      : jobs_(std::move(jobs)), workers_(std::move(workers)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    const JobsSnapshot snap = jobs_();

    auto jobs =
        Family("meshrun_jobs", "Jobs known to the coordinator, by state.", MetricType::Gauge);
    for (v1::JobState s : kJobStates) {
      auto it = snap.jobs_by_state.find(s);
      AddGauge(jobs, {{"state", JobStateName(s)}}, it == snap.jobs_by_state.end() ? 0 : it->second);
    }
    out.push_back(std::move(jobs));

    std::map<std::string, int> by_state = {{"READY", 0}, {"BUSY", 0}, {"LOST", 0}};
    for (const v1::WorkerInfo& w : workers_()) ++by_state[WorkerStateName(w.state())];
    auto workers = Family("meshrun_workers", "Registered workers, by state.", MetricType::Gauge);
    for (const auto& [state, n] : by_state) AddGauge(workers, {{"state", state}}, n);
    out.push_back(std::move(workers));

    auto state = Family("meshrun_job_state",
                        "1 for the state each job is in (PENDING and RUNNING jobs and the 100 "
                        "newest finished ones).",
                        MetricType::Gauge);
    auto step =
        Family("meshrun_job_step", "Step of the job's newest job-level sample.", MetricType::Gauge);
    auto tps =
        Family("meshrun_job_tokens_per_second",
               "global_batch_size·seq_len / the slowest rank's step time.", MetricType::Gauge);
    auto mfu = Family("meshrun_job_mfu", "Model FLOPs utilization averaged over ranks (0..1).",
                      MetricType::Gauge);
    auto restarts = Family("meshrun_job_restarts_total", "Attempts started after a failure.",
                           MetricType::Counter);
    auto skew = Family("meshrun_job_step_time_skew",
                       "(slowest - fastest) / slowest rank step time of the newest step.",
                       MetricType::Gauge);
    for (const JobsSnapshot::JobLine& j : snap.jobs) {
      for (v1::JobState s : kJobStates) {
        AddGauge(state, {{"job", j.job_id}, {"state", JobStateName(s)}}, s == j.state ? 1 : 0);
      }
      AddGauge(step, {{"job", j.job_id}}, static_cast<double>(j.step));
      AddGauge(tps, {{"job", j.job_id}}, j.tokens_per_second);
      AddGauge(mfu, {{"job", j.job_id}}, j.mfu);
      AddGauge(restarts, {{"job", j.job_id}}, j.restarts);
      AddGauge(skew, {{"job", j.job_id}}, j.step_time_skew);
    }
    for (auto* f : {&state, &step, &tps, &mfu, &restarts, &skew}) out.push_back(std::move(*f));
    return out;
  }

 private:
  JobsFn jobs_;
  WorkersFn workers_;
};

StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const std::string& listen,
                                                                  JobsFn jobs, WorkersFn workers) {
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collector_ = std::make_shared<Collector>(std::move(jobs), std::move(workers));
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& ex) {
    return FailedPreconditionError("--metrics-listen: cannot serve metrics on '" + listen + "': " +
                                   ex.what() + " (hint: use a free HOST:PORT, e.g. 127.0.0.1:0)");
  }
  e->exposer_->RegisterCollectable(e->collector_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  const size_t colon = listen.rfind(':');
  e->host_ = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (e->host_.size() > 2 && e->host_.front() == '[')
    e->host_ = e->host_.substr(1, e->host_.size() - 2);
  if (e->host_.empty() || e->host_ == "0.0.0.0" || e->host_ == "*") e->host_ = "127.0.0.1";
  if (e->host_ == "::") e->host_ = "::1";
  return e;
}

MetricsExporter::~MetricsExporter() {
  if (!exposer_) return;
  // civetweb's listener polls with a two-second timeout before it notices the stop flag;
  // connecting to it wakes it, so a coordinator stops at once.
  std::atomic<bool> stopped{false};
  std::thread waker([&] {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    if (getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &addrs) != 0) return;
    while (!stopped) {
      const int fd = socket(addrs->ai_family, addrs->ai_socktype, addrs->ai_protocol);
      if (fd >= 0) {
        (void)connect(fd, addrs->ai_addr, addrs->ai_addrlen);
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    freeaddrinfo(addrs);
  });
  exposer_.reset();
  stopped = true;
  waker.join();
}

}  // namespace meshrun::coordinator
