// MetricsIngest: what happens to a rank's MetricsSample once JobManager has matched it to a
// running rank. The sample feeds the rank's Prometheus series (RankSeries) and the attempt's
// StepAggregator; when it completes a step, the job-level sample updates the job row's progress
// columns (step, loss, tokens/s, MFU) and the job's in-memory totals (skew, tokens done).
// JobManager then publishes both samples as job events. Not thread-safe: called under
// JobManager's mutex (RankSeries has its own).
//
// IngestBook is the ingest path proper (decision 0049): the rank samples of running attempts
// are matched, aggregated, published and counted there under a mutex per job, never under
// JobManager's mutex, which GetJob, ListRanks, ListWorkers and SubmitJob take.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/clock.h"
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

// What the ingest path knows of one running attempt, under its own mutex (the "ingest lock"
// of the job). JobManager fills it when the attempt starts and stops it when it ends, under
// its own mutex (lock order JobManager -> IngestBook -> JobIngest).
struct JobIngest {
  struct RankSlot {
    std::string worker_id;
    RankLabels labels;
  };
  std::mutex mu;
  std::string job_id;
  int attempt = 0;
  std::atomic<bool> running{true};        // cleared by Stop without the mutex
  std::vector<RankSlot> ranks;            // by rank; fixed from the placement on
  std::unique_ptr<StepAggregator> steps;  // the attempt's
  double tokens_per_step = 0;             // global_batch_size · seq_len
  JobRecord* job = nullptr;               // its event log and progress only (never freed)
  size_t dropped_comm = 0;                // comm entries refused on arrival
  size_t stored_bytes = 0;                // job-level samples written to StateDb from here
};

class IngestBook {
 public:
  // `db` may be null (tests without persistence); `series` null: no per-rank series.
  IngestBook(StateDb* db, const Clock& clock, EventLimits limits,
             std::shared_ptr<RankSeries> series)
      : db_(db), clock_(clock), limits_(limits), series_(std::move(series)) {}

  // The attempt of job->job_id runs (replaces an earlier attempt's entry).
  void Start(std::shared_ptr<JobIngest> job);
  // The attempt ended: its samples are dropped from now on.
  void Stop(const std::string& job_id, int attempt);

  // A rank sample from `worker_id`: dropped unless it is of a running attempt's rank placed on
  // that worker. Returns whether it was accepted.
  bool Add(const std::string& worker_id, const v1::MetricsSample& sample);
  // A batch (RankMetrics.samples): each as Add does, the job looked up and locked once per run
  // of samples of one job. Returns how many were accepted.
  size_t AddAll(const std::string& worker_id,
                const google::protobuf::RepeatedPtrField<v1::MetricsSample>& samples);

  // The job's entry, or null (tests hold its mutex to show that queries do not take it).
  std::shared_ptr<JobIngest> Find(const std::string& job_id) const;

 private:
  // Add under job.mu.
  bool AddLocked(JobIngest& job, const std::string& worker_id, const v1::MetricsSample& sample);

  StateDb* const db_;
  const Clock& clock_;
  const EventLimits limits_;
  const std::shared_ptr<RankSeries> series_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<JobIngest>> jobs_;  // guarded by mu_
};

}  // namespace meshrun::coordinator
