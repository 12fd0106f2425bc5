#include "coordinator/job_journal.h"

#include <spdlog/spdlog.h>

#include "proto/mesh_axis.h"

namespace meshrun::coordinator {

v1::JobEvent* JobJournal::AddEvent(JobTxn& txn) {
  // Stamped in Commit, under the log's mutex, so that events reach watchers in order.
  return &txn.events.emplace_back();
}

bool JobJournal::StampReserving(JobEventLog& log, v1::JobEvent* event, WallTime now,
                                int64_t block) {
  log.Stamp(event, now);
  if (static_cast<int64_t>(event->sequence()) <= log.reserved()) return false;
  log.set_reserved(static_cast<int64_t>(event->sequence()) + std::max(kSequenceBlock, block));
  return true;
}

Status JobJournal::Commit(JobTxn& txn, Durability durability) {
  JobRecord& job = txn.job;
  // Stamp, write and publish under the log's mutex: the ingest path's rank samples (IngestBook)
  // take it too, and no event may reach a watcher before one with a lower sequence.
  auto hold = job.events.Hold();
  const WallTime now = clock_.Now();
  for (v1::JobEvent& e : txn.events) {
    if (StampReserving(job.events, &e, now)) txn.job_dirty = true;
  }
  if (txn.job_dirty) {
    job.SyncProgress();
    txn.batch.jobs.push_back(job.row);
  }
  bool finished = false;
  const size_t cut_before = job.cut_lines;
  const size_t unstored_before = job.unstored_lines + job.unstored_events;
  for (v1::JobEvent& e : txn.events) {
    // Filled in by now: cut to the limits before anything keeps it. Only what a worker sent
    // can carry unknown fields or long lines; the coordinator's own state and rank events
    // (one per rank at a placement) skip the pass.
    if ((e.has_log() || e.has_metrics() || e.has_checkpoint_saved()) && job.events.Cut(&e)) {
      ++job.cut_lines;
    }
    const size_t bytes = e.ByteSizeLong();
    bool store = false;
    if (e.has_log()) {
      // Log lines too (kFast like the rest of their batch, bounded per job): GetJobLogs reads
      // them back once the memory tier is gone (a restart, or a job's events released).
      store = job.persisted_logs < limits_.logs &&
              job.persisted_log_bytes + bytes <= limits_.stored_log_bytes;
      if (store) {
        ++job.persisted_logs;
        job.persisted_log_bytes += bytes;
      } else if (job.persisted_logs < limits_.logs) {
        ++job.unstored_lines;
      }
    } else if (e.has_checkpoint_saved() || e.has_metrics()) {
      // What a worker can send without end: within the job's budget.
      store = JobEventLog::IsDurable(e) &&
              job.persisted_event_bytes + bytes <= limits_.stored_event_bytes;
      if (store) {
        job.persisted_event_bytes += bytes;
      } else if (JobEventLog::IsDurable(e)) {
        ++job.unstored_events;
      }
    } else {
      store = JobEventLog::IsDurable(e);  // state and rank changes: bounded by the attempts
    }
    if (store) {
      txn.batch.events.push_back(
          {job.row.job_id, static_cast<int64_t>(e.sequence()), e.SerializeAsString()});
    }
    if (e.has_state_changed()) {
      const v1::JobState s = e.state_changed().state();
      finished =
          s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
      // Every job state change is on disk before anyone sees it.
      durability = Durability::kDurable;
    }
  }
  if (db_ != nullptr) {
    Status status = db_->Commit(txn.batch, durability);
    if (!status.ok()) {
      spdlog::error("job {}: cannot persist a change: {}", job.row.job_id, status.ToString());
      return status;
    }
  }
  if (cut_before == 0 && job.cut_lines > 0) {
    spdlog::warn(
        "job {}: log lines over {} bytes are cut (the first of them here; counted in "
        "the job's cut lines)",
        job.row.job_id, limits_.max_log_line_bytes);
  }
  if (unstored_before == 0 && job.unstored_lines + job.unstored_events > 0) {
    spdlog::warn(
        "job {}: its stored events reached their budget ({} bytes of log lines, {} bytes of "
        "checkpoint and metrics events): newer ones are kept in memory only",
        job.row.job_id, limits_.stored_log_bytes, limits_.stored_event_bytes);
  }
  for (const v1::JobEvent& e : txn.events) job.events.Publish(e);
  // The stream of a finished job ends right after the event that finished it.
  if (finished) {
    job.events.FinishWatchers(OkStatus());
    job.events.ReleaseRankMetrics();
  }
  txn.batch = WriteBatch{};
  txn.events.clear();
  txn.job_dirty = false;
  return OkStatus();
}

void JobJournal::WriteJobRow(const JobRow& row) {
  if (db_ == nullptr) return;
  WriteBatch batch;
  batch.jobs.push_back(row);
  (void)db_->Commit(batch, Durability::kFast);
}

void JobJournal::WriteJobRow(JobRecord& job) {
  if (db_ == nullptr) return;
  auto hold = job.events.Hold();
  job.SyncProgress();
  WriteBatch batch;
  batch.jobs.push_back(job.row);
  (void)db_->Commit(batch, Durability::kFast);
}

std::vector<v1::JobEvent> JobJournal::StoredEvents(const std::string& job_id, uint64_t from,
                                                   uint64_t to) const {
  std::vector<v1::JobEvent> out;
  if (db_ == nullptr || from >= to) return out;
  auto rows = db_->LoadEvents(job_id, static_cast<int64_t>(from), static_cast<int64_t>(to),
                              static_cast<int>(limits_.durable));
  if (!rows.ok()) return out;
  for (const EventRow& row : *rows) {
    v1::JobEvent e;
    // Stored log lines are GetJobLogs' (the memory tier may hold the same ones).
    if (e.ParseFromString(row.event) && !e.has_log()) out.push_back(std::move(e));
  }
  return out;
}

std::optional<v1::GetJobLogsResponse> JobJournal::StoredLogs(
    const JobRecord& job, const v1::GetJobLogsRequest& request) const {
  if (db_ == nullptr) return std::nullopt;
  auto rows = db_->LoadEvents(job.row.job_id, 1, INT64_MAX, kStoredEventsRead);
  if (!rows.ok()) return std::nullopt;
  std::vector<v1::LogLine> lines;
  for (const EventRow& row : *rows) {
    v1::JobEvent e;
    if (!e.ParseFromString(row.event) || !e.has_log()) continue;
    if (request.has_rank() && e.log().rank() != request.rank()) continue;
    if (request.attempt() > 0 && e.log().attempt() != request.attempt()) continue;
    lines.push_back(std::move(*e.mutable_log()));
  }
  if (lines.empty()) return std::nullopt;
  v1::GetJobLogsResponse stored;
  size_t begin = 0;
  if (request.tail_lines() > 0 && lines.size() > static_cast<size_t>(request.tail_lines())) {
    begin = lines.size() - request.tail_lines();
  }
  std::vector<const v1::LogLine*> refs;
  refs.reserve(lines.size());
  for (const v1::LogLine& line : lines) refs.push_back(&line);
  const size_t first = NewestThatFit(refs, begin, limits_.max_logs_response_bytes);
  for (size_t i = first; i < lines.size(); ++i) *stored.add_lines() = std::move(lines[i]);
  stored.set_truncated(first > begin || job.persisted_logs >= limits_.logs ||
                       job.unstored_lines > 0);
  return stored;
}

StatusOr<std::vector<RankRecord>> JobJournal::LoadRanks(const std::string& job_id,
                                                        int attempt) const {
  if (db_ == nullptr) return std::vector<RankRecord>{};
  MESHRUN_ASSIGN_OR_RETURN(std::vector<RankRow> rows, db_->LoadRanks(job_id, attempt));
  std::vector<RankRecord> out;
  out.reserve(rows.size());
  for (const RankRow& row : rows) out.push_back(RankFromRow(row));
  return out;
}

RankRecord RankFromRow(const RankRow& rr) {
  RankRecord r;
  r.rank = rr.rank;
  r.coords = rr.coords;
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

RankRow ToRankRow(const JobRecord& job, const AttemptRecord& attempt, const RankRecord& r) {
  RankRow row;
  row.job_id = job.row.job_id;
  row.attempt = attempt.number;
  row.rank = r.rank;
  row.worker_id = r.worker_id;
  row.worker_name = r.worker_name;
  row.local_rank = r.local_rank;
  row.local_world_size = r.local_world_size;
  row.coords = r.coords;
  row.state = r.state;
  row.pid = r.pid;
  row.exit_code = r.exit_code;
  row.signal = r.signal;
  row.error = r.error;
  return row;
}

AttemptRow ToAttemptRow(const JobRecord& job, const AttemptRecord& a) {
  return {job.row.job_id, a.number,   static_cast<int>(a.state),
          a.started_ms,   a.ended_ms, a.reason,
          a.mesh_text,    a.cause,    a.spec_bytes};
}

void FillRankInfo(const RankRecord& r, const ParallelDims& mesh, v1::RankInfo* info) {
  info->set_rank(r.rank);
  SetProtoCoords(r.coords, info->mutable_coords());
  AddMeshAxes(mesh, r.coords, info->mutable_axes());
  info->set_worker_id(r.worker_id);
  info->set_worker_name(r.worker_name);
  info->set_local_rank(r.local_rank);
  info->set_state(r.state);
  info->set_pid(r.pid);
  info->set_exit_code(r.exit_code);
  info->set_signal(r.signal);
  info->set_error(r.error);
}

}  // namespace meshrun::coordinator
