// JobManager: the coordinator's jobs, from Submit to their last rank's exit (architecture.md
// "A job, from submit to its last step"). It owns the job records in memory and the mutex
// over them, answers the client RPCs and the workers' session messages, and drives the parts
// that each own one responsibility:
//
//   JobJournal     (job_journal.h)    rows and events written through StateDb, then published;
//   SlotBook, JobQueue, SchedulingRound (scheduler.h): slots held per worker, the PENDING
//                  queue, one FIFO placement pass;
//   RestartPolicy  (restart_policy.h) restart backoff and outcome, resume checkpoint, the
//                                     StopOrders outstanding per worker (StopLedger);
//   MetricsIngest  (metrics_ingest.h) rank samples into rank series and job-level samples.
//
// It opens and closes the attempts' store key spaces (StoreManager) and sends RankAssignments
// and StopOrders down the workers' sessions (WorkerView).
//
// Thread-safe: one mutex guards everything; lock order JobManager → WorkerView/StoreManager →
// streams (it never calls back into CoordinatorService). Called by CoordinatorService (client
// RPCs and session messages) and by the server's ticker (Tick).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/parallel_dims.h"
#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/job_events.h"
#include "coordinator/job_journal.h"
#include "coordinator/job_records.h"
#include "coordinator/metrics_ingest.h"
#include "coordinator/placement.h"
#include "coordinator/rank_series.h"
#include "coordinator/restart_policy.h"
#include "coordinator/scheduler.h"
#include "coordinator/state_db.h"
#include "coordinator/step_aggregator.h"
#include "coordinator/store_manager.h"
#include "coordinator/streams.h"
#include "coordinator/worker_manager.h"
#include "meshrun/v1/coordinator.pb.h"
#include "proto/state_names.h"

namespace meshrun::coordinator {

// "PENDING", "RUNNING", … (the JSON and Prometheus spelling of docs/cli.md).
using meshrun::JobStateName;

struct JobManagerConfig {
  // HOST:PORT the ranks dial for StoreSet/Get/Add (the coordinator's advertised address).
  std::string store_address;
  size_t max_queued_jobs = 10'000;  // PENDING jobs (--max-pending-jobs)
  // PENDING jobs of one caller (--max-pending-jobs-per-caller).
  size_t max_queued_jobs_per_caller = 1'000;
  size_t max_spec_bytes = 256 * 1024;  // serialized spec, source_yaml included (--max-spec-bytes)
  int default_page_size = 100;
  int max_page_size = 1000;
  // Serialized bytes of one ListRanks page at most (a page holds at least one rank).
  size_t max_page_bytes = 1 << 20;
  // Between SIGTERM and SIGKILL when a CancelJob gives none, and for PEER_FAILED stops.
  std::chrono::milliseconds default_grace{10'000};
  // How often a StopOrder for ranks a worker still runs is repeated.
  std::chrono::milliseconds stop_resend{5'000};
  // A RUNNING rank missing from this many consecutive `running` reports of its worker (open,
  // heartbeats) is LOST.
  int max_missed_reports = 2;
  // A failed attempt's restart waits restart_backoff·2^(k−1) before restart k is placed, at
  // most restart_backoff_max (--restart-backoff, --restart-backoff-max); 0: no wait.
  std::chrono::milliseconds restart_backoff{1'000};
  std::chrono::milliseconds restart_backoff_max{300'000};
  // Distinct (job, attempt) StopOrders outstanding for one worker (--max-stops-per-worker):
  // a `running` list naming more unknown attempts than this is refused.
  size_t max_stops_per_worker = 1'024;
  EventLimits events;
  // Receives every accepted rank sample with the rank's placement, and each job's end (the
  // coordinator's per-rank Prometheus series); null: none kept.
  std::shared_ptr<RankSeries> rank_series;
  // A placement made inside SubmitJob leaves its RankAssignments to FlushAssignments (the
  // server's ticker, every tick) so that the call answers once the job is placed and stored,
  // not after 32,768 messages were queued (decision 0058). False: sent within the call (unit
  // tests without a ticker). Every other placement sends them at once, as does any stop.
  bool defer_submit_assignments = false;
};

// What the metrics exporter reads (see metrics_exporter.h).
struct JobsSnapshot {
  struct JobLine {
    std::string job_id, name;
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    int64_t step = 0;
    double tokens_per_second = 0, mfu = 0, step_time_skew = 0;
    int restarts = 0;
    // Tokens of every job-level step since the coordinator started (steps repeated after a
    // restart count again: work done); a counter beside tokens_per_second for rate().
    double tokens_total = 0;
    // The client's planner's prediction for the job as it runs (JobSpec.predicted_*); 0: none.
    double predicted_step_seconds = 0, predicted_peak_memory_bytes = 0;
    // Elastic jobs (decision 0056): the current mesh's world size (every job), the re-meshes
    // so far, and what they cost: steps done again and seconds without training, summed.
    int world_size = 0;
    bool elastic = false;
    int remeshes = 0;
    int64_t remesh_steps_lost = 0;
    double remesh_seconds_without_training = 0;
  };
  std::map<v1::JobState, int> jobs_by_state;
  std::vector<JobLine> jobs;  // PENDING and RUNNING jobs, and the 100 newest finished ones
};

class JobManager {
 public:
  // Finished jobs whose event logs (log lines, rank samples, durable events) stay in memory;
  // older ones answer WatchJob from StateDb and GetJobLogs with `truncated`.
  static constexpr size_t kFinishedJobsWithEvents = 32;

  // `db` may be null (tests without persistence).
  JobManager(StateDb* db, WorkerView& workers, StoreManager& store, const Clock& clock,
             JobManagerConfig config);
  ~JobManager();

  // The HOST:PORT ranks dial for the store, known once the server listens. Call before Load.
  void set_store_address(const std::string& address);

  // Restores jobs from StateDb: PENDING jobs queue again, RUNNING attempts keep running with
  // fresh store key spaces and wait for their workers to report their ranks (see OnRunning).
  Status Load();

  // ---- Client RPCs (errors as in coordinator.proto) ----
  // The new job's id; for request.dry_run() the placement answer instead (nothing is stored).
  // `caller`: who submits (the token, or the peer's host; "" unknown, not counted per caller).
  StatusOr<std::string> Submit(const v1::SubmitJobRequest& request,
                               const std::string& caller = std::string());
  StatusOr<v1::Job> Get(const std::string& job_id);
  // GetJob: the job, with its ranks unless `summary`, and the current attempt's rank counts.
  Status Get(const v1::GetJobRequest& request, v1::GetJobResponse* response);
  // ListRanks: one page of the current attempt's ranks (errors in coordinator.proto).
  Status ListRanks(const v1::ListRanksRequest& request, v1::ListRanksResponse* response);
  // Slots held on each of `worker_ids` (SlotsInUse for a page of workers).
  std::vector<int> SlotsInUseOf(const std::vector<std::string>& worker_ids) const;
  // The ingest path's entry of a running job (tests: its mutex is the job's ingest lock).
  std::shared_ptr<JobIngest> IngestOf(const std::string& job_id) const {
    return ingest_.Find(job_id);
  }
  // The heartbeat fast path's lock (tests hold it to show that queries do not take it).
  std::unique_lock<std::mutex> HoldHeartbeatCacheForTest() {
    return std::unique_lock<std::mutex>(heartbeat_mu_);
  }
  StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request);
  StatusOr<v1::Job> Cancel(const v1::CancelJobRequest& request);
  // Replays and, unless the job is finished or replay_only, keeps `stream` as a watcher.
  // On error nothing was sent and the caller finishes the stream with the status.
  Status Watch(const v1::WatchJobRequest& request, std::shared_ptr<WatchJobStream> stream);
  StatusOr<v1::GetJobLogsResponse> Logs(const v1::GetJobLogsRequest& request) const;
  bool Exists(const std::string& job_id) const;
  // Whether a rank of (job_id, attempt) is placed on the worker named `worker_name`; nullopt
  // when the job or the attempt is not (or no longer) known. For the Authorizer (auth.h).
  std::optional<bool> RunsOnWorker(const std::string& worker_name, const std::string& job_id,
                                   int attempt) const;

  // ---- Worker session messages (already validated by CoordinatorService) ----
  // `running` of an `open` or a heartbeat: confirms ranks, stops ranks of stale attempts,
  // counts missing ones (see JobManagerConfig::max_missed_reports). A list equal to the one
  // the worker sent last, when nothing changed since for any job (generation_), is answered
  // from the heartbeat cache without JobManager's mutex (the fast path, decision 0049).
  // RESOURCE_EXHAUSTED naming --max-stops-per-worker when the list would need more StopOrders
  // than the worker may have outstanding (nothing of the list is applied then).
  Status OnRunning(const std::string& worker_id,
                   const google::protobuf::RepeatedPtrField<v1::RunningRank>& running);
  void OnRankStarted(const std::string& worker_id, const v1::RankStarted& started);
  void OnRankExited(const std::string& worker_id, const v1::RankExited& exited);
  void OnRankMetrics(const std::string& worker_id, const v1::RankMetrics& metrics);
  void OnLogs(const std::string& worker_id, const v1::LogBatch& logs);
  void OnCheckpointSaved(const std::string& worker_id, const v1::CheckpointSaved& saved);
  // The worker's lease ran out: its ranks are LOST and their attempts fail.
  void OnWorkerLost(const std::string& worker_id);
  // The worker registered again (it restarted): its ranks must be reported by its new session.
  void OnWorkerReregistered(const std::string& worker_id);
  // `meshrun workers drain/undrain` (WorkerManager already holds the flag): draining asks every
  // job with ranks on the worker to checkpoint now and re-mesh without it (job_manager_elastic.cc);
  // returns those jobs' ids.
  std::vector<std::string> OnWorkerDrained(const std::string& worker_id, bool drained);

  // Places queued jobs in FIFO order (per device) while slots allow.
  void Schedule();
  // Sends the RankAssignments of placements SubmitJob deferred (config
  // defer_submit_assignments); cheap when there are none.
  void FlushAssignments();
  // Periodic work: ranks on workers that are gone, StopOrder bookkeeping, Schedule.
  void Tick();
  // Ends every watch with UNAVAILABLE.
  void Shutdown();

  // Slots held per worker id: ranks assigned and not yet exited, plus ranks a worker reports
  // running that belong to no live attempt.
  std::unordered_map<std::string, int> SlotsInUse() const;
  JobsSnapshot Snapshot() const;

 private:
  using Job = JobRecord;
  using Attempt = AttemptRecord;
  using Rank = RankRecord;
  using Txn = JobTxn;

  // Job access and proto building (job_manager.cc).
  Job* FindLocked(const std::string& job_id) const;
  Attempt* FindAttemptLocked(Job& job, int attempt) const;
  v1::Job ToProtoLocked(Job& job, bool detail, bool with_ranks = true);

  // State changes within a transaction (job_manager.cc).
  void SetJobStateLocked(Txn& txn, v1::JobState state, const std::string& reason);
  // Records that `job_id` finished; releases the event log of the oldest finished job once
  // more than kFinishedJobsWithEvents finished after it.
  void NoteFinishedLocked(const std::string& job_id);
  void SetRankStateLocked(Txn& txn, Attempt& attempt, Rank& rank, v1::RankState state);

  // Lifecycle (job_manager_lifecycle.cc).
  void ScheduleLocked();
  void SetWaitMessageLocked(Job& job, const std::string& wait);
  void StartAttemptLocked(Job& job, const Placement& placement,
                          const std::vector<LiveWorker>& workers);
  // One RankAssignment per rank of the attempt to its worker.
  void SendAssignmentsLocked(const Job& job, const Attempt& attempt);
  // Sends the deferred assignments, before any other message to a worker (ordering).
  void FlushAssignmentsLocked();
  // Ends `attempt` (failed or cancelled): records it, stops its ranks, drops its key space.
  void EndAttemptLocked(Txn& txn, Attempt& attempt, AttemptState state, const std::string& reason,
                        v1::StopReason stop_reason, std::chrono::milliseconds grace);
  // Ends the running attempt as failed and applies the restart policy (PENDING for the next
  // attempt, or FAILED when restart.max_restarts are used up).
  void FailAttemptLocked(Txn& txn, Attempt& attempt, const std::string& reason);
  void SucceedAttemptLocked(Txn& txn, Attempt& attempt);
  void WorkerLostLocked(const std::string& worker_id, const std::string& reason);
  // An attempt that failed on a peer's error exit (cause_may_follow) learns its first cause
  // (a lost worker, a rank killed by a signal): it leads the attempt's reason and, while the
  // job still shows that failure, the job's message.
  void NameFirstCauseLocked(Txn& txn, Attempt& attempt, const std::string& cause);
  void SendStopLocked(const std::string& worker_id, const std::string& job_id, int attempt,
                      v1::StopReason reason, const std::string& message,
                      std::chrono::milliseconds grace, bool force);
  void OccupyLocked(const Job& job, const Attempt& attempt, Rank& rank);
  void ReleaseLocked(const Job& job, const Attempt& attempt, Rank& rank);
  // Forgets ended attempts whose ranks no longer hold slots (the newest attempt stays).
  void PruneAttemptsLocked(Job& job);
  // The rank (job, attempt, rank) if it is known and placed on `worker_id`.
  Rank* FindRankLocked(const std::string& worker_id, const std::string& job_id, int attempt,
                       int rank, Job** job_out, Attempt** attempt_out);

  // Elastic jobs and drains (job_manager_elastic.cc; decision 0056).
  // Before a queued elastic job is considered: false (its wait message set) while an older
  // attempt's ranks still hold slots (they may be writing the checkpoint the next attempt
  // resumes from); else sets the mesh it is placed with now (grow at once, shrink after
  // resources.elastic.wait_seconds, or at once after a drain).
  bool ElasticPrepareLocked(Job& job);
  // Each Tick: running attempts with ranks on a drained worker re-mesh; elastic jobs below
  // max_ranks grow when the capacity allows a larger mesh.
  void ElasticTickLocked();
  // Asks the attempt's ranks to checkpoint now and stop (StopOrder REMESH).
  void RemeshLocked(Job& job, Attempt& attempt, RemeshCause cause);
  // Every rank of a re-meshing attempt exited after its checkpoint: the job is PENDING for its
  // next mesh (no backoff, no restart used).
  void FinishRemeshLocked(Txn& txn, Attempt& attempt);
  // The largest mesh in [min_ranks, max_ranks] that places on the free slots of the job's
  // device (drained workers left out; with `own`, the slots the job's ranks hold count as free).
  std::optional<std::array<int, 4>> BestElasticMeshLocked(const Job& job, bool own) const;
  // Sets the job's spec and mesh to `sizes` (persisted, with a `remeshed` event).
  void SetJobMeshLocked(Job& job, const std::array<int, 4>& sizes, RemeshCause cause);
  // At an attempt's start: its mesh, and a new MeshEpoch when the mesh changed.
  void NoteAttemptMeshLocked(Job& job, Attempt& attempt);
  // Fills Job.meshes.
  void FillMeshesLocked(Job& job, v1::Job* out);
  // Live workers that take ranks (not drained).
  std::vector<LiveWorker> PlaceableWorkersLocked() const;

  // The ingest path's view of a newly running (or restored) attempt.
  void StartIngestLocked(Job& job, Attempt& attempt);
  // Ranks per state and workers used, counted again (after ranks were read from StateDb).
  static void RecountLocked(Attempt& attempt);
  // Something a heartbeat's outcome depends on changed: every cached heartbeat is stale.
  void ChangedLocked() { generation_.fetch_add(1, std::memory_order_acq_rel); }

  WorkerView& workers_;
  StoreManager& store_;
  const Clock& clock_;
  JobManagerConfig config_;  // store_address set once before Load, then read-only

  mutable std::mutex mu_;
  // The parts, guarded by mu_.
  JobJournal journal_;
  SlotBook slots_;
  JobQueue queue_;
  RestartPolicy restarts_;
  StopLedger stops_;
  MetricsIngest metrics_;

  std::map<std::string, std::unique_ptr<Job>> jobs_;  // guarded by mu_
  // Jobs that finished since start, oldest first; beyond the newest kFinishedJobsWithEvents
  // their in-memory event logs are released (JobEventLog::ReleaseRetained).
  std::deque<std::string> finished_with_events_;
  std::map<int64_t, std::string> by_seq_;                     // seq -> job_id
  std::unordered_map<std::string, std::string> request_ids_;  // request_id -> job_id
  std::set<std::string> active_;  // jobs with a RUNNING attempt or ranks holding slots
  int64_t next_seq_ = 1;
  bool shut_down_ = false;
  // Placements whose assignments are not sent yet: (job_id, attempt), in placement order;
  // set while Submit schedules (decision 0058).
  std::vector<std::pair<std::string, int>> unsent_assignments_;
  std::atomic<bool> has_unsent_assignments_{false};
  bool deferring_assignments_ = false;

  // The ingest path: rank samples of running attempts, off mu_ (its own locks).
  IngestBook ingest_;
  // The heartbeat fast path: per worker, the running list of its last heartbeat that changed
  // nothing, and the generation it was seen at. generation_ grows with every change of a
  // rank, slot or attempt (ChangedLocked, under mu_).
  struct CachedReport {
    uint64_t generation = 0;
    std::vector<RankRef> ranks;  // sorted
  };
  std::atomic<uint64_t> generation_{1};
  // Tick's check of the workers holding ranks (guarded by mu_): the roster and job generations
  // it last ran at, and ticks since; it runs when either changed, and every 50th tick anyway.
  uint64_t holders_checked_roster_ = 0;
  uint64_t holders_checked_jobs_ = 0;
  int ticks_since_holders_check_ = 0;
  std::mutex heartbeat_mu_;
  std::unordered_map<std::string, CachedReport> heartbeats_;  // guarded by heartbeat_mu_
};

}  // namespace meshrun::coordinator
