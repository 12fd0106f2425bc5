// JobManager, part 1: the client RPCs (submit, get, list, cancel, watch, logs), transactions
// against StateDb, and restoring state after a restart. Placement, attempts and worker
// messages are in job_manager_lifecycle.cc.
#include "coordinator/job_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/job_spec_yaml.h"
#include "coordinator/job_manager_internal.h"
#include "coordinator/placement.h"
#include "coordinator/proto_time.h"
#include "proto/spec_convert.h"

namespace meshrun::coordinator {

namespace {

constexpr int64_t kSequenceBlock = 4096;
// Stored events GetJobLogs reads back at most (log lines and the durable events between them).
constexpr int kStoredEventsRead = 200'000;

Status JobNotFound(const std::string& job_id) {
  return NotFoundError("job_id: " + job_id +
                       " is not a job of this coordinator (hint: `meshrun jobs` lists the jobs)");
}

bool PrintableId(const std::string& s, size_t max) {
  return s.size() <= max && std::all_of(s.begin(), s.end(), [](char ch) {
           return static_cast<unsigned char>(ch) > 0x20 && ch != 0x7f;
         });
}

}  // namespace

JobManager::JobManager(StateDb* db, WorkerView& workers, StoreManager& store, const Clock& clock,
                       JobManagerConfig config)
    : db_(db), workers_(workers), store_(store), clock_(clock), config_(std::move(config)) {}

JobManager::~JobManager() = default;

void JobManager::set_store_address(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  config_.store_address = address;
}

// ---- Lookup and proto building ----------------------------------------------------------------

JobManager::Job* JobManager::FindLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

JobManager::Attempt* JobManager::FindAttemptLocked(Job& job, int attempt) const {
  auto it = job.attempts.find(attempt);
  return it == job.attempts.end() ? nullptr : it->second.get();
}

bool JobManager::Exists(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(job_id) != nullptr;
}

std::optional<bool> JobManager::RunsOnWorker(const std::string& worker_name,
                                             const std::string& job_id, int attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(job_id);
  if (job == nullptr) return std::nullopt;
  auto it = job->attempts.find(attempt);
  if (it == job->attempts.end()) return std::nullopt;
  for (const Rank& r : it->second->ranks) {
    if (r.worker_name == worker_name) return true;
  }
  return false;
}

void JobManager::FillRankInfo(const Rank& r, v1::RankInfo* info) const {
  info->set_rank(r.rank);
  info->mutable_coords()->set_dp_replicate(r.coords.dp_replicate);
  info->mutable_coords()->set_dp_shard(r.coords.dp_shard);
  info->mutable_coords()->set_cp(r.coords.cp);
  info->mutable_coords()->set_tp(r.coords.tp);
  info->set_worker_id(r.worker_id);
  info->set_worker_name(r.worker_name);
  info->set_local_rank(r.local_rank);
  info->set_state(r.state);
  info->set_pid(r.pid);
  info->set_exit_code(r.exit_code);
  info->set_signal(r.signal);
  info->set_error(r.error);
}

v1::Job JobManager::ToProtoLocked(Job& job, bool detail) {
  const JobRow& row = job.row;
  v1::Job j;
  j.set_job_id(row.job_id);
  j.set_name(row.name);
  j.set_state(static_cast<v1::JobState>(row.state));
  j.set_attempt(row.attempt);
  j.set_restarts(row.restarts);
  j.set_step(row.step);
  j.set_steps(job.spec.train().steps());
  j.set_loss(row.loss);
  j.set_tokens_per_second(row.tokens_per_second);
  j.set_mfu(row.mfu);
  SetTimestampMillis(row.submitted_ms, j.mutable_submitted_at());
  SetTimestampMillis(row.started_ms, j.mutable_started_at());
  SetTimestampMillis(row.finished_ms, j.mutable_finished_at());
  if (row.started_ms == 0) j.clear_started_at();
  if (row.finished_ms == 0) j.clear_finished_at();
  j.set_message(row.message);
  j.set_world_size(row.world_size);
  j.set_last_checkpoint(row.last_checkpoint);
  j.set_last_event_sequence(job.events.last_sequence());
  if (!detail) return j;
  *j.mutable_spec() = job.spec;
  if (!job.ranks_loaded && db_ != nullptr && row.attempt > 0) {
    // A finished job restored after a restart: read its last attempt's ranks once.
    auto ranks = db_->LoadRanks(row.job_id, row.attempt);
    if (ranks.ok()) {
      auto attempt = std::make_unique<Attempt>();
      attempt->number = row.attempt;
      for (const RankRow& rr : *ranks) {
        attempt->ranks.push_back(RankFromRow(rr));
      }
      job.attempts[row.attempt] = std::move(attempt);
      job.ranks_loaded = true;
    }
  }
  if (const Attempt* last = job.last()) {
    for (const Rank& r : last->ranks) FillRankInfo(r, j.add_ranks());
  }
  return j;
}

// ---- Transactions -------------------------------------------------------------------------------

v1::JobEvent* JobManager::AddEvent(Txn& txn) {
  txn.events.emplace_back();
  v1::JobEvent* e = &txn.events.back();
  txn.job.events.Stamp(e, clock_.Now());
  if (static_cast<int64_t>(e->sequence()) > txn.job.row.seq_reserved) {
    txn.job.row.seq_reserved = e->sequence() + kSequenceBlock;
    txn.job_dirty = true;
  }
  return e;
}

Status JobManager::CommitLocked(Txn& txn, Durability durability) {
  Job& job = txn.job;
  if (txn.job_dirty) txn.batch.jobs.push_back(job.row);
  bool finished = false;
  for (const v1::JobEvent& e : txn.events) {
    // Log lines too (kFast like the rest of their batch, bounded per job): GetJobLogs reads
    // them back once the memory tier is gone (a restart, or a job's events released).
    const bool log_kept = e.has_log() && job.persisted_logs < config_.events.logs;
    if (log_kept) ++job.persisted_logs;
    if (JobEventLog::IsDurable(e) || log_kept) {
      txn.batch.events.push_back(
          {job.row.job_id, static_cast<int64_t>(e.sequence()), e.SerializeAsString()});
    }
    if (e.has_state_changed()) {
      const v1::JobState s = e.state_changed().state();
      finished =
          s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
    }
  }
  // Every job state change is on disk before anyone sees it.
  for (const v1::JobEvent& e : txn.events) {
    if (e.has_state_changed()) durability = Durability::kDurable;
  }
  if (db_ != nullptr) {
    Status status = db_->Commit(txn.batch, durability);
    if (!status.ok()) {
      spdlog::error("job {}: cannot persist a change: {}", job.row.job_id, status.ToString());
      return status;
    }
  }
  for (const v1::JobEvent& e : txn.events) job.events.Publish(e);
  // The stream of a finished job ends right after the event that finished it.
  if (finished) job.events.FinishWatchers(OkStatus());
  txn.batch = WriteBatch{};
  txn.events.clear();
  txn.job_dirty = false;
  return OkStatus();
}

JobManager::Rank JobManager::RankFromRow(const RankRow& rr) {
  Rank r;
  r.rank = rr.rank;
  r.coords = {rr.dp_replicate, rr.dp_shard, rr.cp, rr.tp};
  r.worker_id = rr.worker_id;
  r.worker_name = rr.worker_name;
  r.local_rank = rr.local_rank;
  r.local_world_size = rr.local_world_size;
  r.state = static_cast<v1::RankState>(rr.state);
  r.pid = rr.pid;
  r.exit_code = rr.exit_code;
  r.signal = rr.signal;
  r.error = rr.error;
  return r;
}

RankRow JobManager::ToRow(const Job& job, const Attempt& attempt, const Rank& r) const {
  RankRow row;
  row.job_id = job.row.job_id;
  row.attempt = attempt.number;
  row.rank = r.rank;
  row.worker_id = r.worker_id;
  row.worker_name = r.worker_name;
  row.local_rank = r.local_rank;
  row.local_world_size = r.local_world_size;
  row.dp_replicate = r.coords.dp_replicate;
  row.dp_shard = r.coords.dp_shard;
  row.cp = r.coords.cp;
  row.tp = r.coords.tp;
  row.state = r.state;
  row.pid = r.pid;
  row.exit_code = r.exit_code;
  row.signal = r.signal;
  row.error = r.error;
  return row;
}

AttemptRow JobManager::ToRow(const Job& job, const Attempt& a) const {
  return {job.row.job_id, a.number, static_cast<int>(a.state), a.started_ms, a.ended_ms, a.reason};
}

void JobManager::SetJobStateLocked(Txn& txn, v1::JobState state, const std::string& reason) {
  JobRow& row = txn.job.row;
  const auto previous = static_cast<v1::JobState>(row.state);
  row.state = state;
  row.message = reason;
  const int64_t now = ToMillis(clock_.Now());
  if (state == v1::JOB_STATE_RUNNING && row.started_ms == 0) row.started_ms = now;
  if (txn.job.terminal()) row.finished_ms = now;
  if (txn.job.terminal() && config_.rank_series) config_.rank_series->JobFinished(row.job_id);
  if (txn.job.terminal() && previous != v1::JOB_STATE_SUCCEEDED &&
      previous != v1::JOB_STATE_FAILED && previous != v1::JOB_STATE_CANCELLED) {
    NoteFinishedLocked(row.job_id);
  }
  txn.job_dirty = true;
  if (state == v1::JOB_STATE_PENDING) {
    txn.job.pending_reason = reason;
    queue_.insert({row.seq, row.job_id});
  } else {
    queue_.erase({row.seq, row.job_id});
  }
  v1::JobStateChanged* e = AddEvent(txn)->mutable_state_changed();
  e->set_state(state);
  e->set_previous_state(previous);
  e->set_attempt(row.attempt);
  e->set_reason(reason);
}

void JobManager::NoteFinishedLocked(const std::string& job_id) {
  finished_with_events_.push_back(job_id);
  while (finished_with_events_.size() > kFinishedJobsWithEvents) {
    const std::string oldest = std::move(finished_with_events_.front());
    finished_with_events_.pop_front();
    Job* job = FindLocked(oldest);
    // A job that is no longer finished (a rolled-back transition) keeps its events.
    if (job != nullptr && job->terminal()) job->events.ReleaseRetained();
  }
}

void JobManager::SetRankStateLocked(Txn& txn, Attempt& attempt, Rank& rank, v1::RankState state) {
  rank.state = state;
  txn.batch.ranks.push_back(ToRow(txn.job, attempt, rank));
  v1::RankStateChanged* e = AddEvent(txn)->mutable_rank_state_changed();
  e->set_attempt(attempt.number);
  FillRankInfo(rank, e->mutable_rank());
}

// ---- Client RPCs --------------------------------------------------------------------------------

StatusOr<std::string> JobManager::Submit(const v1::SubmitJobRequest& request) {
  const size_t spec_bytes = request.spec().ByteSizeLong();
  if (spec_bytes > config_.max_spec_bytes) {
    return ResourceExhaustedError(
        "spec: " + std::to_string(spec_bytes) + " bytes (its YAML and fields), over the " +
        std::to_string(config_.max_spec_bytes) +
        " of the coordinator's --max-spec-bytes (hint: shorten the YAML, data and checkpoints "
        "are named by path; or ask the operator to raise --max-spec-bytes)");
  }
  if (!PrintableId(request.request_id(), 128)) {
    return InvalidArgumentError(
        "request_id: must be at most 128 printable characters without spaces (hint: use a "
        "UUID)");
  }
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, ValidateProtoJobSpec(request.spec()));
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
  // Stored and sent to the ranks with the defaults applied: a client may leave fields unset.
  v1::JobSpec resolved = ResolvedJobSpecProto(request.spec(), spec);
  // Checkpoints already under checkpoint.dir (an earlier run): found now, before the lock; the
  // job's own CheckpointSaved reports move it on from here (ResumeCheckpointLocked).
  std::string existing_checkpoint;
  if (spec.checkpoint.resume == "auto" && !spec.checkpoint.dir.empty() && !request.dry_run()) {
    existing_checkpoint = config_.find_checkpoint ? config_.find_checkpoint(spec.checkpoint.dir)
                                                  : NewestCompleteCheckpoint(spec.checkpoint.dir);
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return UnavailableError("the coordinator is stopping (hint: retry)");
  if (!request.request_id().empty()) {
    auto it = request_ids_.find(request.request_id());
    if (it != request_ids_.end()) return it->second;
  }
  if (queue_.size() >= config_.max_queued_jobs) {
    return ResourceExhaustedError("--max-pending-jobs: " + std::to_string(queue_.size()) +
                                  " jobs are already PENDING, the coordinator's limit (hint: "
                                  "wait for some to start, cancel some, or ask the operator to "
                                  "raise --max-pending-jobs)");
  }
  std::vector<int> slots;
  for (const LiveWorker& w : workers_.LiveWorkers()) {
    if (w.device == spec.resources.device) slots.push_back(w.slots);
  }
  if (!slots.empty()) {
    PlaceabilityVerdict verdict = CheckPlaceable(mesh, slots);
    if (verdict.verdict == Placeability::kTpGroupTooLarge) {
      return FailedPreconditionError(verdict.message);
    }
    // More ranks than every registered worker together holds: it would wait PENDING until
    // workers register, which the submitter must ask for (docs/decisions/0009).
    if (verdict.verdict == Placeability::kTooFewSlots && !request.wait_for_capacity()) {
      long long total = 0;
      for (int n : slots) total += n;
      const std::string world = std::to_string(mesh.world_size());
      std::string held = std::to_string(total) + " slots";
      if (verdict.usable_slots != total) {
        held += " (" + std::to_string(verdict.usable_slots) + " of them in whole tp groups of " +
                std::to_string(mesh.tp()) + ")";
      }
      return FailedPreconditionError(
          "parallelism: " + mesh.ToString() + " needs " + world + " slots but the " +
          std::to_string(slots.size()) + " registered " + spec.resources.device +
          (slots.size() == 1 ? " worker holds " : " workers hold ") + held +
          " in all, so it could never start (hint: choose sizes whose product is at most " +
          std::to_string(verdict.usable_slots) +
          ", start more workers, or submit with --wait-for-capacity to queue it until they "
          "register)");
    }
  }

  if (request.dry_run()) return DryRunPlacementLocked(spec.resources.device, mesh);

  JobRow row;
  row.seq = next_seq_;
  char id[32];
  std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(row.seq));
  row.job_id = id;
  row.name = spec.name;
  row.state = v1::JOB_STATE_UNSPECIFIED;
  row.spec = resolved.SerializeAsString();
  row.resolved_yaml = JobSpecToYaml(spec);
  row.request_id = request.request_id();
  row.submitted_ms = ToMillis(clock_.Now());
  row.world_size = mesh.world_size();
  row.last_checkpoint = existing_checkpoint;
  auto job = std::make_unique<Job>(std::move(row), std::move(resolved), mesh, config_.events);
  Txn txn(*job);
  SetJobStateLocked(txn, v1::JOB_STATE_PENDING, "submitted");
  Status status = CommitLocked(txn, Durability::kDurable);
  if (!status.ok()) {
    queue_.erase({job->row.seq, job->row.job_id});
    return status;
  }
  ++next_seq_;
  const std::string job_id = job->row.job_id;
  if (!job->row.request_id.empty()) request_ids_[job->row.request_id] = job_id;
  by_seq_[job->row.seq] = job_id;
  jobs_[job_id] = std::move(job);
  spdlog::info("job {} ({}) submitted: {} ranks, {}", job_id, spec.name, mesh.world_size(),
               mesh.ToString());
  ScheduleLocked();
  return job_id;
}

std::string JobManager::DryRunPlacementLocked(const std::string& device,
                                              const ParallelDims& mesh) const {
  std::vector<LiveWorker> live;
  std::vector<PlacementWorker> candidates;
  std::vector<int> slots;
  for (LiveWorker& w : workers_.LiveWorkers()) {
    if (w.device != device) continue;
    int used = 0;
    if (auto it = by_worker_.find(w.worker_id); it != by_worker_.end()) {
      used += static_cast<int>(it->second.size());
    }
    if (auto it = foreign_.find(w.worker_id); it != foreign_.end()) used += it->second;
    candidates.push_back({w.worker_id, w.slots, std::max(0, w.slots - used)});
    slots.push_back(w.slots);
    live.push_back(std::move(w));
  }
  if (live.empty()) return "would wait PENDING for a " + device + " worker to register";
  const PlaceabilityVerdict verdict = CheckPlaceable(mesh, slots);
  if (verdict.verdict != Placeability::kPlaceable) return "would wait PENDING: " + verdict.message;
  int ahead = 0;
  for (const auto& [seq, id] : queue_) ahead += jobs_.at(id)->device() == device ? 1 : 0;
  if (ahead > 0) {
    return "would wait PENDING behind " + std::to_string(ahead) + " queued " + device + " job" +
           (ahead == 1 ? "" : "s");
  }
  StatusOr<Placement> placement = PlaceJob(mesh, candidates);
  if (!placement.ok()) {
    return "would wait PENDING: " + placement.status().message() + "; waiting for slots to free up";
  }
  // "ranks 0-1 on worker-1, ranks 2-3 on worker-2" (rank runs in global-rank order).
  std::string where;
  for (int g = 0; g < mesh.world_size();) {
    const int w = placement->ranks[g].worker;
    int end = g;
    while (end + 1 < mesh.world_size() && placement->ranks[end + 1].worker == w) ++end;
    where += where.empty() ? "" : ", ";
    where += (g == end ? "rank " + std::to_string(g)
                       : "ranks " + std::to_string(g) + "-" + std::to_string(end)) +
             " on " + live[w].name;
    g = end + 1;
  }
  return "would start now: " + where;
}

StatusOr<v1::Job> JobManager::Get(const std::string& job_id) {
  if (job_id.empty()) {
    return InvalidArgumentError("job_id: is empty (hint: pass a job id from `meshrun jobs`)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(job_id);
  if (job == nullptr) return JobNotFound(job_id);
  return ToProtoLocked(*job, /*detail=*/true);
}

StatusOr<v1::ListJobsResponse> JobManager::List(const v1::ListJobsRequest& request) {
  int64_t before = INT64_MAX;
  if (!request.page_token().empty()) {
    const std::string& t = request.page_token();
    char* end = nullptr;
    const long long v = t.rfind("before:", 0) == 0 ? std::strtoll(t.c_str() + 7, &end, 10) : 0;
    if (end == nullptr || *end != '\0' || v <= 0) {
      return InvalidArgumentError("page_token: '" + t.substr(0, 64) +
                                  "' was not issued by this coordinator (hint: leave it empty "
                                  "for the first page)");
    }
    before = v;
  }
  if (request.page_size() < 0) {
    return InvalidArgumentError("page_size: must be ≥ 0 (hint: 0 for the default)");
  }
  const int page = request.page_size() == 0 ? config_.default_page_size
                                            : std::min(request.page_size(), config_.max_page_size);
  std::set<int> states(request.states().begin(), request.states().end());
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListJobsResponse out;
  for (auto it = std::make_reverse_iterator(by_seq_.lower_bound(before)); it != by_seq_.rend();
       ++it) {
    Job& job = *jobs_.at(it->second);
    if (!states.empty() && states.count(job.row.state) == 0) continue;
    if (out.jobs_size() == page) {
      out.set_next_page_token("before:" + std::to_string(job.row.seq + 1));
      break;
    }
    *out.add_jobs() = ToProtoLocked(job, /*detail=*/false);
  }
  return out;
}

StatusOr<v1::Job> JobManager::Cancel(const v1::CancelJobRequest& request) {
  if (request.job_id().empty()) {
    return InvalidArgumentError("job_id: is empty (hint: pass a job id from `meshrun jobs`)");
  }
  if (request.reason().size() > 1024) {
    return InvalidArgumentError("reason: over 1024 bytes (hint: say it in one line)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  if (job->terminal()) {
    return FailedPreconditionError("job " + job->row.job_id + " is already " +
                                   JobStateName(static_cast<v1::JobState>(job->row.state)) +
                                   " (hint: only PENDING and RUNNING jobs can be cancelled)");
  }
  const std::string reason = request.reason().empty() ? "cancelled by the user" : request.reason();
  std::chrono::milliseconds grace = config_.default_grace;
  if (request.has_grace_period())
    grace = std::max(std::chrono::milliseconds(0), DurationToMillis(request.grace_period()));
  Txn txn(*job);
  Attempt* attempt = job->last();
  if (job->row.state == v1::JOB_STATE_RUNNING && attempt != nullptr &&
      attempt->state == AttemptState::kRunning) {
    EndAttemptLocked(txn, *attempt, AttemptState::kCancelled, reason, v1::STOP_REASON_CANCELLED,
                     grace);
  }
  SetJobStateLocked(txn, v1::JOB_STATE_CANCELLED, reason);
  MESHRUN_RETURN_IF_ERROR(CommitLocked(txn, Durability::kDurable));
  spdlog::info("job {} cancelled: {}", job->row.job_id, reason);
  PruneAttemptsLocked(*job);
  ScheduleLocked();
  return ToProtoLocked(*job, /*detail=*/true);
}

Status JobManager::Watch(const v1::WatchJobRequest& request,
                         std::shared_ptr<WatchJobStream> stream) {
  if (request.job_id().empty()) {
    return InvalidArgumentError("job_id: is empty (hint: pass a job id from `meshrun jobs`)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return UnavailableError("the coordinator is stopping (hint: reconnect later)");
  Job* job = FindLocked(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  size_t watchers = 0;
  for (const auto& [id, j] : jobs_) watchers += j->events.watcher_count();
  const bool keep = !job->terminal() && !request.replay_only();
  if (keep && watchers >= config_.max_watchers) {
    return ResourceExhaustedError("watchers: " + std::to_string(watchers) +
                                  " streams are open, the coordinator's limit (hint: retry later)");
  }
  const uint64_t from = std::max<uint64_t>(1, request.from_sequence());
  const WatchFilter filter = WatchFilter::FromRequest(request);
  // Durable events older than the ones in memory come back from StateDb.
  std::vector<v1::JobEvent> older;
  const uint64_t first = job->events.first_retained_durable();
  if (db_ != nullptr && from < first) {
    auto rows =
        db_->LoadEvents(job->row.job_id, static_cast<int64_t>(from), static_cast<int64_t>(first),
                        static_cast<int>(config_.events.durable));
    if (rows.ok()) {
      for (const EventRow& row : *rows) {
        v1::JobEvent e;
        // Stored log lines are GetJobLogs' (the memory tier may hold the same ones).
        if (e.ParseFromString(row.event) && !e.has_log()) older.push_back(std::move(e));
      }
    }
  }
  if (!job->events.Replay(from, filter, older, *stream)) return OkStatus();
  if (keep) {
    job->events.AddWatcher(std::move(stream), filter);
  } else {
    stream->Finish(OkStatus());
  }
  return OkStatus();
}

StatusOr<v1::GetJobLogsResponse> JobManager::Logs(const v1::GetJobLogsRequest& request) const {
  if (request.job_id().empty()) {
    return InvalidArgumentError("job_id: is empty (hint: pass a job id from `meshrun jobs`)");
  }
  if (request.tail_lines() < 0) {
    return InvalidArgumentError("tail_lines: must be ≥ 0, got " +
                                std::to_string(request.tail_lines()) + " (hint: 0 for every line)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  std::optional<int> rank;
  if (request.has_rank()) rank = request.rank();
  v1::GetJobLogsResponse memory = job->events.Logs(rank, request.attempt(), request.tail_lines());
  if (memory.lines_size() > 0 || db_ == nullptr) return memory;
  // Nothing in memory: the coordinator restarted, or the job's events were released. The lines
  // StateDb kept answer instead.
  auto rows = db_->LoadEvents(job->row.job_id, 1, INT64_MAX, kStoredEventsRead);
  if (!rows.ok()) return memory;
  std::vector<v1::LogLine> lines;
  for (const EventRow& row : *rows) {
    v1::JobEvent e;
    if (!e.ParseFromString(row.event) || !e.has_log()) continue;
    if (rank && e.log().rank() != *rank) continue;
    if (request.attempt() > 0 && e.log().attempt() != request.attempt()) continue;
    lines.push_back(std::move(*e.mutable_log()));
  }
  if (lines.empty()) return memory;
  v1::GetJobLogsResponse stored;
  size_t begin = 0;
  if (request.tail_lines() > 0 && lines.size() > static_cast<size_t>(request.tail_lines())) {
    begin = lines.size() - request.tail_lines();
  }
  for (size_t i = begin; i < lines.size(); ++i) *stored.add_lines() = std::move(lines[i]);
  stored.set_truncated(job->persisted_logs >= config_.events.logs);
  return stored;
}

// ---- Restore ------------------------------------------------------------------------------------

Status JobManager::Load() {
  if (db_ == nullptr) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(std::vector<JobRow> rows, db_->LoadJobs());
  std::lock_guard<std::mutex> lock(mu_);
  for (JobRow& row : rows) {
    v1::JobSpec spec;
    if (!spec.ParseFromString(row.spec)) {
      return DataLossError("state database: the spec of job " + row.job_id + " is unreadable");
    }
    auto parsed = JobSpecFromProto(spec);
    if (!parsed.ok())
      return DataLossError("state database: job " + row.job_id + ": " + parsed.status().message());
    auto mesh = MeshOf(*parsed);
    if (!mesh.ok())
      return DataLossError("state database: job " + row.job_id + ": " + mesh.status().message());
    next_seq_ = std::max(next_seq_, row.seq + 1);
    auto job = std::make_unique<Job>(std::move(row), std::move(spec), *mesh, config_.events);
    Job& j = *job;
    const std::string job_id = j.row.job_id;
    jobs_[job_id] = std::move(job);
    by_seq_[j.row.seq] = job_id;
    if (!j.row.request_id.empty()) request_ids_[j.row.request_id] = job_id;
    // The sequences up to seq_reserved may have been handed out before the restart.
    j.row.seq_reserved += kSequenceBlock;
    if (j.row.state == v1::JOB_STATE_PENDING) queue_.insert({j.row.seq, job_id});
    j.ranks_loaded = j.row.attempt == 0;
    if (j.row.state != v1::JOB_STATE_RUNNING) continue;

    // A running attempt: its ranks keep their slots and wait for their workers' reports.
    MESHRUN_ASSIGN_OR_RETURN(std::vector<RankRow> ranks, db_->LoadRanks(job_id, j.row.attempt));
    MESHRUN_ASSIGN_OR_RETURN(std::vector<AttemptRow> attempts, db_->LoadAttempts(job_id));
    auto attempt = std::make_unique<Attempt>();
    attempt->number = j.row.attempt;
    for (const AttemptRow& a : attempts) {
      if (a.attempt == j.row.attempt) attempt->started_ms = a.started_ms;
    }
    attempt->aggregator = std::make_unique<StepAggregator>(
        j.mesh.world_size(), j.spec.train().global_batch_size() * j.spec.model().seq_len());
    for (const RankRow& rr : ranks) {
      Rank r = RankFromRow(rr);
      r.confirmed = false;
      if (r.state == v1::RANK_STATE_SUCCEEDED) ++attempt->succeeded;
      attempt->ranks.push_back(std::move(r));
    }
    j.attempts[attempt->number] = std::move(attempt);
    j.ranks_loaded = true;
    Attempt& a = *j.last();
    for (Rank& r : a.ranks) {
      if (r.state == v1::RANK_STATE_ASSIGNED || r.state == v1::RANK_STATE_RUNNING) {
        OccupyLocked(j, a, r);
      }
    }
    active_.insert(job_id);
    // Its store keys too: a barrier the ranks were in (or enter while we were down) completes.
    MESHRUN_RETURN_IF_ERROR(store_.RestoreAttempt(job_id, a.number));
    spdlog::info("job {} restored RUNNING (attempt {}); waiting for its workers to report", job_id,
                 a.number);
  }
  // Persist the advanced sequence reservations before any new event uses them.
  WriteBatch batch;
  for (const auto& [id, job] : jobs_) batch.jobs.push_back(job->row);
  return db_->Commit(batch, Durability::kDurable);
}

void JobManager::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (auto& [id, job] : jobs_) {
    job->events.FinishWatchers(
        UnavailableError("the coordinator is stopping (hint: reconnect from the last sequence "
                         "seen + 1)"));
  }
}

}  // namespace meshrun::coordinator
