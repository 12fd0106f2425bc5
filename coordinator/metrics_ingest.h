// MetricsIngest: what happens to a rank's MetricsSample once JobManager has matched it to a
// running rank. The sample feeds the rank's Prometheus series (RankSeries) and the attempt's
// StepAggregator; when it completes a step, the job-level sample updates the job row's progress
// columns (step, loss, tokens/s, MFU) and the job's in-memory totals (skew, tokens done).
// JobManager then publishes both samples as job events. Not thread-safe: called under
// JobManager's mutex (RankSeries has its own).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "coordinator/job_records.h"
#include "coordinator/rank_series.h"
#include "coordinator/state_db.h"
#include "coordinator/step_aggregator.h"

namespace meshrun::coordinator {

class MetricsIngest {
 public:
  // `series` null: no per-rank series kept.
  explicit MetricsIngest(std::shared_ptr<RankSeries> series) : series_(std::move(series)) {}

  // Keeps of sample->comm the entries IsSeriesComm accepts, the first of each (axis, op), so
  // a sample holds at most 4 axes × 8 ops of them; returns how many it dropped. JobManager
  // cleans each rank sample on arrival, before it is stored, aggregated or turned into series.
  static size_t Clean(v1::MetricsSample* sample);

  // The aggregator of a new attempt of a job with this mesh size and global batch.
  static std::unique_ptr<StepAggregator> NewAggregator(const v1::JobSpec& spec, int world_size);

  // Feeds `sample` of the rank placed at `where`. Returns the job-level sample when it was
  // the last rank of its step, after updating `row` and `totals` from it.
  std::optional<v1::MetricsSample> Ingest(const RankLabels& where, const v1::MetricsSample& sample,
                                          const v1::JobSpec& spec, StepAggregator& steps,
                                          JobRow& row, JobTotals& totals);

  // The job finished: its series are kept as finished (RankSeries::JobFinished).
  void JobFinished(const std::string& job_id);

 private:
  std::shared_ptr<RankSeries> series_;
};

}  // namespace meshrun::coordinator
