// The coordinator's Prometheus endpoint (--metrics-listen, CONVENTIONS §7): meshrun_jobs{state},
// meshrun_workers{state}, and per job meshrun_job_state{job,state}, meshrun_job_step,
// meshrun_job_tokens_per_second, meshrun_job_mfu, meshrun_job_restarts_total and
// meshrun_job_step_time_skew. Values are read from the managers at scrape time (a
// prometheus::Collectable), so nothing is updated on the hot path; a new series is one more
// family in Collect().
//
// Thread-safe: the snapshot functions are (they lock the managers).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/job_manager.h"
#include "meshrun/v1/types.pb.h"

namespace prometheus {
class Exposer;
}

namespace meshrun::coordinator {

class MetricsExporter {
 public:
  using JobsFn = std::function<JobsSnapshot()>;
  using WorkersFn = std::function<std::vector<v1::WorkerInfo>()>;

  // Serves /metrics on `listen` (HOST:PORT; port 0 picks one). FAILED_PRECONDITION naming
  // --metrics-listen when it cannot bind.
  static StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen, JobsFn jobs,
                                                          WorkersFn workers);
  ~MetricsExporter();

  int port() const { return port_; }

 private:
  class Collector;
  MetricsExporter() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;  // where to connect to wake the server at shutdown
  int port_ = 0;
};

}  // namespace meshrun::coordinator
