// The records JobManager keeps per job, attempt and rank in memory, and the transaction that
// changes one job's rows and events together (committed by JobJournal). Plain data: every
// field is guarded by JobManager's mutex; its parts (JobJournal, the scheduling parts,
// RestartPolicy, MetricsIngest) see them only as JobManager hands them over under that lock.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/parallel_dims.h"
#include "coordinator/clock.h"
#include "coordinator/job_events.h"
#include "coordinator/state_db.h"
#include "coordinator/step_aggregator.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

// State of one attempt, as stored in StateDb's attempts table.
// kRemeshed: an elastic re-mesh (grown, drained) stopped it after a checkpoint; not a failure.
enum class AttemptState {
  kRunning = 1,
  kSucceeded = 2,
  kFailed = 3,
  kCancelled = 4,
  kRemeshed = 5
};

// Why an elastic job's mesh changed (docs/job-spec.md "Elastic jobs", decision 0056).
enum class RemeshCause { kNone, kSubmitted, kLostWorker, kGrown, kDrained, kCapacity };
inline const char* RemeshCauseName(RemeshCause c) {
  switch (c) {
    case RemeshCause::kNone: return "";
    case RemeshCause::kSubmitted: return "submitted";
    case RemeshCause::kLostWorker: return "lost worker";
    case RemeshCause::kGrown: return "grown";
    case RemeshCause::kDrained: return "drained";
    case RemeshCause::kCapacity: return "capacity";
  }
  return "";
}

// One rank of one attempt of one job: what holds a slot on a worker.
struct RankRef {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  auto operator<=>(const RankRef&) const = default;
};

struct RankRecord {
  int rank = 0;
  MeshCoords coords;
  std::string worker_id, worker_name;
  int local_rank = 0, local_world_size = 0;
  v1::RankState state = v1::RANK_STATE_ASSIGNED;
  int pid = 0, exit_code = 0, signal = 0;
  std::string error;
  // False after a coordinator restart or a worker re-registration, until the worker reports
  // the rank running; unconfirmed ranks are subject to the missed-report rule.
  bool confirmed = true;
  int misses = 0;
  // Holds a slot on its worker: from assignment until it exits or its worker is lost.
  bool occupying = false;
};

struct AttemptRecord {
  int number = 0;
  AttemptState state = AttemptState::kRunning;
  int64_t started_ms = 0, ended_ms = 0;
  std::string reason;
  std::vector<RankRecord> ranks;
  std::unique_ptr<StepAggregator> aggregator;  // handed to the ingest path (IngestBook) at start
  int succeeded = 0;
  // Ranks per RankState (indexed by the enum's value), kept with every state change: the
  // job summary of GetJob without a pass over the ranks.
  std::array<int, 8> state_counts{};
  int workers_used = 0;
  // Ranks by worker id, built on the first ListRanks filtered by worker.
  std::unordered_map<std::string, std::vector<int>> ranks_by_worker;
  // Failed on a rank's error exit while its peers ran elsewhere: possibly the echo ("Connection
  // reset by peer") of a cause not known yet, a lost worker or a killed rank, which then
  // replaces it as the reason (JobManager::NameFirstCauseLocked). failed_message: the job's
  // message that failure set.
  bool cause_may_follow = false;
  std::string failed_message;
  // Elastic: a checkpoint-now stop is in flight (grown or drained); its ranks' stopped exits
  // (130, after the checkpoint) end the attempt as kRemeshed instead of failing it.
  RemeshCause remeshing = RemeshCause::kNone;
  int stopped_for_remesh = 0;
  // The mesh it ran on ("dp_shard 2 × tp 2") and why it was chosen; persisted with the attempt.
  std::string mesh_text;
  std::string cause;
  std::string spec_bytes;  // elastic jobs: the spec the ranks got (serialized v1::JobSpec)
};

// One mesh an elastic job ran on (JobRecord::meshes; GetJob's Job.meshes).
// JobRecord::meshes keeps the newest kMaxMeshEpochs of them: a job that re-meshes without end (a
// worker that comes and goes) must not grow the coordinator's memory (docs/coordinator.md).
inline constexpr size_t kMaxMeshEpochs = 32;
struct MeshEpoch {
  int attempt = 0;
  std::array<int, 4> sizes{1, 1, 1, 1};  // R, S, C, T
  int64_t from_step = -1;
  RemeshCause cause = RemeshCause::kSubmitted;
  int64_t started_ms = 0;
  // The job's step when the previous mesh's attempt ended, and when it ended (wall ms).
  int64_t step_before = -1;
  int64_t previous_end_ms = 0;
  double idle_seconds = -1;  // previous_end_ms → the first step on this mesh, once seen
};

// What MetricsIngest keeps per job beside the JobRow's progress columns; in memory only.
struct JobTotals {
  // MetricsIngest::Ingest's (JobManager keeps these in JobProgress, off its mutex).
  double step_time_skew = 0;
  double tokens_total = 0;
  // Refused on arrival and counted: checkpoint reports outside checkpoint.dir.
  size_t refused_checkpoints = 0;
};

// The job's progress from its job-level samples, written by the ingest path (IngestBook)
// without JobManager's mutex; `mu` is held only to copy these figures. JobManager copies them
// into the JobRow (SyncProgress) before it writes or shows the row.
struct JobProgress {
  mutable std::mutex mu;
  int64_t step = 0;
  double loss = 0, tokens_per_second = 0, mfu = 0;
  double step_time_skew = 0;
  double tokens_total = 0;  // JobsSnapshot::JobLine::tokens_total
  // The first job-level step of the newest attempt that reported one, and when (wall ms): the
  // end of an elastic job's time without training.
  int first_step_attempt = 0;
  int64_t first_step_ms = 0;
};

struct JobRecord {
  JobRecord(JobRow r, v1::JobSpec s, ParallelDims m, EventLimits limits)
      : row(std::move(r)),
        spec(std::move(s)),
        mesh(m),
        events(row.job_id, static_cast<uint64_t>(row.seq_reserved) + 1, limits) {
    events.set_reserved(row.seq_reserved);
    progress.step = row.step;
    progress.loss = row.loss;
    progress.tokens_per_second = row.tokens_per_second;
    progress.mfu = row.mfu;
  }

  JobRow row;
  v1::JobSpec spec;
  ParallelDims mesh;
  // The newest attempt, and older ones whose ranks still hold slots.
  std::map<int, std::unique_ptr<AttemptRecord>> attempts;
  // False for a finished job restored from StateDb until GetJob reads its ranks.
  bool ranks_loaded = true;
  JobTotals totals;
  JobProgress progress;
  // Why the job is PENDING ("submitted", or the failure that asked for a restart); the
  // message adds what it waits for.
  std::string pending_reason = "submitted";
  // A restart is not placed before this (the restart backoff); not persisted: after a
  // coordinator restart a PENDING job may be placed at once.
  MonoTime not_before{};
  std::chrono::milliseconds backoff{0};  // the wait that set not_before
  // Log lines written to StateDb by this coordinator process (at most EventLimits::logs per
  // job), so that `meshrun logs` still answers after a restart.
  size_t persisted_logs = 0;
  // Their bytes, and those of the checkpoint and job-level metrics events written (bounded by
  // EventLimits::stored_log_bytes and stored_event_bytes); what did not fit, and the cut lines,
  // are counted and warned about once per job.
  size_t persisted_log_bytes = 0, persisted_event_bytes = 0;
  size_t unstored_lines = 0, unstored_events = 0, cut_lines = 0;
  // Who submitted it (SubmitJob's caller: the token, or the peer's host), for
  // --max-pending-jobs-per-caller; not persisted: "" for jobs restored after a restart.
  std::string owner;
  JobEventLog events;
  // Elastic jobs (resources.elastic; decision 0056). pending_since: when it last became
  // PENDING (a shrink waits resources.elastic.wait_seconds from there); meshes: the newest
  // kMaxMeshEpochs meshes it ran on, and meshes_dropped, dropped_steps_lost and
  // dropped_seconds_without_training: how many older ones were let go and what they cost (the
  // metrics count every re-mesh); remesh_attempts: attempts ended by a re-mesh (not failures:
  // they use no restart);
  // next_cause: why the next attempt's mesh changes (set by a grow or a drain); the step and time
  // the last attempt ended at; next_grow_check throttles the grow check.
  MonoTime pending_since{};
  std::vector<MeshEpoch> meshes;
  int meshes_dropped = 0;
  int64_t dropped_steps_lost = 0;
  double dropped_seconds_without_training = 0;
  int remesh_attempts = 0;
  RemeshCause next_cause = RemeshCause::kNone;
  int64_t ended_step = -1, ended_ms = 0;
  MonoTime next_grow_check{};
  bool elastic() const {
    return spec.resources().elastic_min_ranks() > 0 || spec.resources().elastic_max_ranks() > 0;
  }

  const std::string& device() const { return spec.resources().device(); }
  AttemptRecord* last() const {
    return attempts.empty() ? nullptr : attempts.rbegin()->second.get();
  }
  // Copies `progress` (and the event log's reservation) into the row.
  void SyncProgress() {
    std::lock_guard<std::mutex> lock(progress.mu);
    row.step = progress.step;
    row.loss = progress.loss;
    row.tokens_per_second = progress.tokens_per_second;
    row.mfu = progress.mfu;
    row.seq_reserved = std::max(row.seq_reserved, events.reserved());
  }
  bool terminal() const {
    return row.state == v1::JOB_STATE_SUCCEEDED || row.state == v1::JOB_STATE_FAILED ||
           row.state == v1::JOB_STATE_CANCELLED;
  }
};

// Rows and events of one job changed together: committed to StateDb, then applied.
struct JobTxn {
  explicit JobTxn(JobRecord& j) : job(j) {}
  JobRecord& job;
  WriteBatch batch;
  std::vector<v1::JobEvent> events;
  bool job_dirty = false;
};

}  // namespace meshrun::coordinator
