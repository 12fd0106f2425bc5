// The coordinator's Prometheus endpoint (--metrics-listen, docs/metrics.md):
// meshrun_jobs{state}, meshrun_workers{state}; per job meshrun_job_state{job_id,state},
// meshrun_job_step, meshrun_job_tokens_per_second, meshrun_job_tokens_total, meshrun_job_mfu_ratio,
// meshrun_job_restarts_total, meshrun_job_step_time_skew, meshrun_job_world_size and the
// planner's meshrun_job_predicted_step_seconds / _peak_memory_bytes; per rank (from RankSeries)
// meshrun_rank_step_seconds, meshrun_rank_{tokens_per_second,model_flops_per_second,mfu_ratio,
// loss,pipeline_bubble_ratio,pipeline_bubble_theory_ratio}, the counters
// meshrun_rank_{tokens,steps,model_flops}_total, meshrun_rank_memory_bytes{kind},
// meshrun_rank_comm_{seconds,bytes}_total{axis,op} with the labels job_id, rank, worker, pp,
// dp_replicate, dp_shard, cp, tp, and the join gauge meshrun_rank_info{…,attempt,device,gpu}.
// No label is named after a Prometheus target label (job, instance): a standard scrape config
// (honor_labels off) keeps every label as written.
// Values are read from the managers at scrape time (a prometheus::Collectable), so nothing is
// updated on the hot path; a new series is one more family in Collect().
//
// Thread-safe: the snapshot functions are (they lock the managers).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/job_manager.h"
#include "coordinator/rank_series.h"
#include "meshrun/v1/types.pb.h"

namespace prometheus {
class Exposer;
struct MetricFamily;
}  // namespace prometheus

namespace meshrun::coordinator {

class MetricsExporter {
 public:
  using JobsFn = std::function<JobsSnapshot()>;
  using WorkersFn = std::function<std::vector<v1::WorkerInfo>()>;

  // Serves /metrics on `listen` (HOST:PORT; port 0 picks one). FAILED_PRECONDITION naming
  // --metrics-listen when it cannot bind.
  // `ranks` (may be null: no meshrun_rank_* series) is read at each scrape.
  static StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& listen, JobsFn jobs, WorkersFn workers,
      std::shared_ptr<const RankSeries> ranks = nullptr);
  // The families one scrape serves (what Start's endpoint renders), for tests without HTTP.
  static std::vector<prometheus::MetricFamily> Collect(const JobsSnapshot& jobs,
                                                       const std::vector<v1::WorkerInfo>& workers,
                                                       const RankSeries* ranks);
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
