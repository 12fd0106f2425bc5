// JobManager, part 2: the queue and placement, attempts and the restart policy, and what the
// workers report on their sessions (rank starts and exits, running lists, metrics, logs,
// checkpoints, lost workers).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"
#include "coordinator/proto_time.h"
#include "engine/io/checkpoint.h"

namespace meshrun::coordinator {
namespace {

// "rank 3 on worker a exited with code 1: <error>", and the other ways a rank ends.
std::string DescribeExit(const v1::RankExited& e, const std::string& worker_name) {
  std::string out = "rank " + std::to_string(e.rank()) + " on worker " + worker_name;
  if (e.signal() != 0) {
    out += " was killed by signal " + std::to_string(e.signal());
  } else if (e.exit_code() == -1) {
    out += " could not be started";
  } else if (e.stopped()) {
    out += " was stopped";
  } else {
    out += " exited with code " + std::to_string(e.exit_code());
  }
  if (!e.error().empty()) out += ": " + e.error().substr(0, 512);
  return out;
}

// "1.5 s", for messages.
std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

std::chrono::milliseconds JobManager::RestartBackoff(int restart) const {
  using std::chrono::milliseconds;
  if (config_.restart_backoff.count() <= 0) return milliseconds(0);
  // Doubling in int64 milliseconds stops well before it could overflow.
  milliseconds wait = config_.restart_backoff;
  for (int k = 1; k < restart && wait < config_.restart_backoff_max; ++k) wait *= 2;
  return std::min(wait, std::max(config_.restart_backoff, config_.restart_backoff_max));
}

std::string NewestCompleteCheckpoint(const std::string& dir) {
  // The engine's rule (engine/io/checkpoint.h), the one `meshrun train` decides with too.
  std::vector<std::string> warnings;
  StatusOr<LatestCheckpoint> latest = FindLatestComplete(dir, &warnings);
  for (const std::string& w : warnings) spdlog::warn("checkpoint.dir {}: {}", dir, w);
  return latest.ok() ? latest->step_dir : std::string();
}

// ---- Slots --------------------------------------------------------------------------------------

void JobManager::OccupyLocked(const Job& job, const Attempt& attempt, Rank& rank) {
  if (rank.occupying) return;
  rank.occupying = true;
  by_worker_[rank.worker_id].insert({job.row.job_id, attempt.number, rank.rank});
  active_.insert(job.row.job_id);
}

void JobManager::ReleaseLocked(const Job& job, const Attempt& attempt, Rank& rank) {
  if (!rank.occupying) return;
  rank.occupying = false;
  auto it = by_worker_.find(rank.worker_id);
  if (it == by_worker_.end()) return;
  it->second.erase({job.row.job_id, attempt.number, rank.rank});
  if (it->second.empty()) by_worker_.erase(it);
}

void JobManager::PruneAttemptsLocked(Job& job) {
  bool holding = false;
  for (auto it = job.attempts.begin(); it != job.attempts.end();) {
    Attempt& a = *it->second;
    const bool occupied =
        std::any_of(a.ranks.begin(), a.ranks.end(), [](const Rank& r) { return r.occupying; });
    holding = holding || occupied || a.state == AttemptState::kRunning;
    if (!occupied && a.state != AttemptState::kRunning && &a != job.last()) {
      it = job.attempts.erase(it);
    } else {
      ++it;
    }
  }
  if (!holding) active_.erase(job.row.job_id);
}

std::unordered_map<std::string, int> JobManager::SlotsInUse() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_map<std::string, int> out;
  for (const auto& [worker, refs] : by_worker_) out[worker] += static_cast<int>(refs.size());
  for (const auto& [worker, n] : foreign_) out[worker] += n;
  return out;
}

JobManager::Rank* JobManager::FindRankLocked(const std::string& worker_id,
                                             const std::string& job_id, int attempt, int rank,
                                             Job** job_out, Attempt** attempt_out) {
  Job* job = FindLocked(job_id);
  if (job == nullptr) return nullptr;
  Attempt* a = FindAttemptLocked(*job, attempt);
  if (a == nullptr || rank < 0 || rank >= static_cast<int>(a->ranks.size())) return nullptr;
  Rank& r = a->ranks[rank];
  if (r.worker_id != worker_id) return nullptr;
  *job_out = job;
  *attempt_out = a;
  return &r;
}

void JobManager::SendStopLocked(const std::string& worker_id, const std::string& job_id,
                                int attempt, v1::StopReason reason, const std::string& message,
                                std::chrono::milliseconds grace, bool force) {
  const auto key = std::make_tuple(worker_id, job_id, attempt);
  const MonoTime now = clock_.Monotonic();
  auto it = stops_sent_.find(key);
  if (!force && it != stops_sent_.end() && now - it->second < config_.stop_resend) return;
  if (it == stops_sent_.end()) ++stops_per_worker_[worker_id];
  stops_sent_[key] = now;
  v1::WorkerSessionResponse msg;
  v1::StopOrder* stop = msg.mutable_stop();
  stop->set_job_id(job_id);
  stop->set_attempt(attempt);
  stop->set_reason(reason);
  stop->set_message(message);
  SetDuration(grace, stop->mutable_grace_period());
  workers_.Send(worker_id, msg);
}

// ---- Queue and placement ------------------------------------------------------------------------

void JobManager::Schedule() {
  std::lock_guard<std::mutex> lock(mu_);
  ScheduleLocked();
}

void JobManager::SetWaitMessageLocked(Job& job, const std::string& wait) {
  const std::string message =
      job.pending_reason == "submitted" ? wait : job.pending_reason + "; " + wait;
  if (job.row.message == message) return;
  job.row.message = message;
  if (db_ != nullptr) {
    WriteBatch batch;
    batch.jobs.push_back(job.row);
    (void)db_->Commit(batch, Durability::kFast);
  }
}

void JobManager::ScheduleLocked() {
  if (queue_.empty() || shut_down_) return;
  struct Candidates {
    std::vector<LiveWorker> live;
    std::vector<PlacementWorker> placement;
    std::vector<int> slots;
    std::string blocked_by;  // FIFO: the first job of this device that did not fit
  };
  std::map<std::string, Candidates> by_device;
  for (LiveWorker& w : workers_.LiveWorkers()) {
    Candidates& c = by_device[w.device];
    int used = 0;
    if (auto it = by_worker_.find(w.worker_id); it != by_worker_.end()) {
      used += static_cast<int>(it->second.size());
    }
    if (auto it = foreign_.find(w.worker_id); it != foreign_.end()) used += it->second;
    c.placement.push_back({w.worker_id, w.slots, std::max(0, w.slots - used)});
    c.slots.push_back(w.slots);
    c.live.push_back(std::move(w));
  }
  const auto queued = std::vector<std::pair<int64_t, std::string>>(queue_.begin(), queue_.end());
  for (const auto& [seq, job_id] : queued) {
    Job& job = *jobs_.at(job_id);
    Candidates& c = by_device[job.device()];
    if (c.live.empty()) {
      // No live worker offers this device's slots (e.g. a cuda job on a cpu-only cluster).
      SetWaitMessageLocked(job, "waiting for a " + job.device() +
                                    " worker to register: no live worker offers " + job.device() +
                                    " slots (hint: start meshrun-worker --device " + job.device() +
                                    " on a node that has them)");
      continue;
    }
    if (clock_.Monotonic() < job.not_before) {
      // Backing off after a failure; it does not hold up the jobs behind it.
      SetWaitMessageLocked(job, "waiting out the restart backoff (" + Seconds(job.backoff) + ")");
      continue;
    }
    const PlaceabilityVerdict verdict = CheckPlaceable(job.mesh, c.slots);
    if (verdict.verdict == Placeability::kTpGroupTooLarge) {
      Txn txn(job);
      SetJobStateLocked(txn, v1::JOB_STATE_FAILED, verdict.message);
      (void)CommitLocked(txn, Durability::kDurable);
      spdlog::warn("job {} FAILED: {}", job_id, verdict.message);
      continue;
    }
    if (verdict.verdict == Placeability::kTooFewSlots) {
      // It cannot run until more workers register; it does not hold up the jobs behind it.
      SetWaitMessageLocked(job, verdict.message);
      continue;
    }
    if (!c.blocked_by.empty()) {
      SetWaitMessageLocked(job, "queued behind job " + c.blocked_by);
      continue;
    }
    StatusOr<Placement> placement = PlaceJob(job.mesh, c.placement);
    if (!placement.ok()) {
      SetWaitMessageLocked(job, placement.status().message() + "; waiting for slots to free up");
      c.blocked_by = job_id;
      continue;
    }
    StartAttemptLocked(job, *placement, c.live);
    for (size_t w = 0; w < c.placement.size(); ++w) {
      c.placement[w].free_slots -= placement->local_world_size[w];
    }
  }
}

// The one decision of an attempt's resume checkpoint, with no filesystem access under the lock:
// the newest complete checkpoint found when the job was submitted, moved on by every
// CheckpointSaved its rank 0 reports (complete by the engine's rule when reported).
std::string JobManager::ResumeCheckpointLocked(const Job& job) const {
  const v1::CheckpointSpec& ckpt = job.spec.checkpoint();
  if (ckpt.resume() != "auto" || ckpt.dir().empty()) return "";
  return job.row.last_checkpoint;
}

void JobManager::StartAttemptLocked(Job& job, const Placement& placement,
                                    const std::vector<LiveWorker>& workers) {
  const JobRow saved = job.row;
  auto attempt = std::make_unique<Attempt>();
  Attempt& a = *attempt;
  a.number = job.row.attempt + 1;
  a.started_ms = ToMillis(clock_.Now());
  a.aggregator = std::make_unique<StepAggregator>(
      job.mesh.world_size(), job.spec.train().global_batch_size() * job.spec.model().seq_len());
  a.ranks.resize(job.mesh.world_size());
  for (int g = 0; g < job.mesh.world_size(); ++g) {
    Rank& r = a.ranks[g];
    const RankPlacement& p = placement.ranks[g];
    r.rank = g;
    r.coords = job.mesh.CoordsOf(g);
    r.worker_id = workers[p.worker].worker_id;
    r.worker_name = workers[p.worker].name;
    r.local_rank = p.local_rank;
    r.local_world_size = placement.local_world_size[p.worker];
  }
  job.row.attempt = a.number;
  job.row.restarts = a.number - 1;
  Txn txn(job);
  txn.batch.attempts.push_back(ToRow(job, a));
  for (Rank& r : a.ranks) SetRankStateLocked(txn, a, r, v1::RANK_STATE_ASSIGNED);
  const std::string reason = "attempt " + std::to_string(a.number) + " placed on " +
                             std::to_string(placement.workers_used) + " worker" +
                             (placement.workers_used == 1 ? "" : "s");
  SetJobStateLocked(txn, v1::JOB_STATE_RUNNING, reason);
  if (!CommitLocked(txn, Durability::kDurable).ok()) {
    job.row = saved;
    queue_.insert({job.row.seq, job.row.job_id});
    return;
  }
  const std::string job_id = job.row.job_id;
  job.attempts[a.number] = std::move(attempt);
  for (Rank& r : a.ranks) OccupyLocked(job, a, r);
  store_.OpenAttempt(job_id, a.number);
  spdlog::info("job {}: {} ({} ranks)", job_id, reason, job.mesh.world_size());

  // One assignment per rank; every rank of the attempt loads the same checkpoint.
  v1::WorkerSessionResponse msg;
  v1::RankAssignment* as = msg.mutable_assign();
  as->set_job_id(job_id);
  as->set_attempt(a.number);
  as->set_world_size(job.mesh.world_size());
  v1::MeshShape* shape = as->mutable_mesh();
  shape->set_dp_replicate_size(job.mesh.dp_replicate());
  shape->set_dp_shard_size(job.mesh.dp_shard());
  shape->set_cp_size(job.mesh.cp());
  shape->set_tp_size(job.mesh.tp());
  *as->mutable_spec() = job.spec;
  as->mutable_store()->set_address(config_.store_address);
  as->mutable_store()->set_prefix(job_id + "/" + std::to_string(a.number) + "/");
  as->set_resume_checkpoint(ResumeCheckpointLocked(job));
  for (const Rank& r : a.ranks) {
    as->set_rank(r.rank);
    as->mutable_coords()->set_dp_replicate(r.coords.dp_replicate);
    as->mutable_coords()->set_dp_shard(r.coords.dp_shard);
    as->mutable_coords()->set_cp(r.coords.cp);
    as->mutable_coords()->set_tp(r.coords.tp);
    as->set_local_rank(r.local_rank);
    as->set_local_world_size(r.local_world_size);
    workers_.Send(r.worker_id, msg);
  }
}

// ---- Attempts -----------------------------------------------------------------------------------

void JobManager::EndAttemptLocked(Txn& txn, Attempt& attempt, AttemptState state,
                                  const std::string& reason, v1::StopReason stop_reason,
                                  std::chrono::milliseconds grace) {
  attempt.state = state;
  attempt.reason = reason;
  attempt.ended_ms = ToMillis(clock_.Now());
  txn.batch.attempts.push_back(ToRow(txn.job, attempt));
  std::set<std::string> holders;
  for (const Rank& r : attempt.ranks) {
    if (r.occupying) holders.insert(r.worker_id);
  }
  for (const std::string& w : holders) {
    SendStopLocked(w, txn.job.row.job_id, attempt.number, stop_reason, reason, grace,
                   /*force=*/true);
  }
  store_.CloseAttempt(txn.job.row.job_id, attempt.number);
}

void JobManager::FailAttemptLocked(Txn& txn, Attempt& attempt, const std::string& reason) {
  if (attempt.state != AttemptState::kRunning) return;
  EndAttemptLocked(txn, attempt, AttemptState::kFailed, reason, v1::STOP_REASON_PEER_FAILED,
                   config_.default_grace);
  const int max_restarts = txn.job.spec.restart().max_restarts();
  const int used = attempt.number - 1;
  if (used < max_restarts) {
    const std::chrono::milliseconds wait = RestartBackoff(used + 1);
    txn.job.not_before = clock_.Monotonic() + wait;
    txn.job.backoff = wait;
    SetJobStateLocked(txn, v1::JOB_STATE_PENDING,
                      "attempt " + std::to_string(attempt.number) + " failed: " + reason +
                          "; restart " + std::to_string(used + 1) + " of " +
                          std::to_string(max_restarts) + " queued" +
                          (wait.count() > 0 ? " after a backoff of " + Seconds(wait) : ""));
  } else {
    SetJobStateLocked(txn, v1::JOB_STATE_FAILED,
                      max_restarts > 0
                          ? reason + " (all " + std::to_string(max_restarts) + " restarts used)"
                          : reason);
  }
  spdlog::warn("job {} attempt {} failed: {}", txn.job.row.job_id, attempt.number, reason);
}

void JobManager::SucceedAttemptLocked(Txn& txn, Attempt& attempt) {
  attempt.state = AttemptState::kSucceeded;
  attempt.reason = "every rank exited 0";
  attempt.ended_ms = ToMillis(clock_.Now());
  txn.batch.attempts.push_back(ToRow(txn.job, attempt));
  store_.CloseAttempt(txn.job.row.job_id, attempt.number);
  SetJobStateLocked(txn, v1::JOB_STATE_SUCCEEDED,
                    "all " + std::to_string(attempt.ranks.size()) + " ranks of attempt " +
                        std::to_string(attempt.number) + " exited 0");
  spdlog::info("job {} SUCCEEDED", txn.job.row.job_id);
}

// ---- Worker reports -----------------------------------------------------------------------------

Status JobManager::OnRunning(const std::string& worker_id,
                             const google::protobuf::RepeatedPtrField<v1::RunningRank>& running) {
  std::lock_guard<std::mutex> lock(mu_);
  // Every (job, attempt) of the list this coordinator does not count gets a StopOrder and an
  // entry in stops_sent_; a worker naming made-up attempts must not grow them without bound.
  {
    std::set<std::pair<std::string, int>> new_stops;
    for (const v1::RunningRank& rr : running) {
      Job* job = nullptr;
      Attempt* a = nullptr;
      Rank* r = FindRankLocked(worker_id, rr.job_id(), rr.attempt(), rr.rank(), &job, &a);
      if (r != nullptr && r->occupying && a->state == AttemptState::kRunning) continue;
      if (stops_sent_.count(std::make_tuple(worker_id, rr.job_id(), rr.attempt()))) continue;
      new_stops.insert({rr.job_id(), rr.attempt()});
    }
    const size_t outstanding =
        stops_per_worker_.count(worker_id) ? stops_per_worker_.at(worker_id) : 0;
    if (!new_stops.empty() && outstanding + new_stops.size() > config_.max_stops_per_worker) {
      spdlog::warn(
          "worker {} reports {} unknown attempts running ({} stop orders outstanding); "
          "refused",
          worker_id, new_stops.size(), outstanding);
      return ResourceExhaustedError(
          "--max-stops-per-worker: the running list names " + std::to_string(new_stops.size()) +
          " attempts this coordinator does not run, and " + std::to_string(outstanding) +
          " stop orders are outstanding for this worker, over the limit of " +
          std::to_string(config_.max_stops_per_worker) +
          " (hint: a worker lists only the ranks it runs; raise --max-stops-per-worker on the "
          "coordinator only if a worker really runs that many stale attempts)");
    }
  }
  std::set<RankRef> reported;
  int foreign = 0;
  for (const v1::RunningRank& rr : running) {
    reported.insert({rr.job_id(), rr.attempt(), rr.rank()});
    Job* job = nullptr;
    Attempt* a = nullptr;
    Rank* r = FindRankLocked(worker_id, rr.job_id(), rr.attempt(), rr.rank(), &job, &a);
    if (r != nullptr && r->occupying) {
      r->misses = 0;
      r->confirmed = true;
      if (a->state == AttemptState::kRunning && r->state == v1::RANK_STATE_ASSIGNED) {
        Txn txn(*job);
        r->pid = rr.pid();
        SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_RUNNING);
        (void)CommitLocked(txn, Durability::kFast);
      } else if (a->state != AttemptState::kRunning) {
        SendStopLocked(
            worker_id, rr.job_id(), rr.attempt(), v1::STOP_REASON_SUPERSEDED,
            "attempt " + std::to_string(rr.attempt()) + " of job " + rr.job_id() + " has ended",
            config_.default_grace, /*force=*/false);
      }
      continue;
    }
    // A rank this coordinator does not count: it holds a slot, and it must stop.
    ++foreign;
    SendStopLocked(worker_id, rr.job_id(), rr.attempt(), v1::STOP_REASON_SUPERSEDED,
                   "attempt " + std::to_string(rr.attempt()) + " of job " + rr.job_id() +
                       " is not a current attempt",
                   config_.default_grace, /*force=*/false);
  }
  if (foreign > 0) {
    foreign_[worker_id] = foreign;
  } else {
    foreign_.erase(worker_id);
  }

  // Ranks the worker should run but did not report.
  auto holders_it = by_worker_.find(worker_id);
  if (holders_it == by_worker_.end()) return OkStatus();
  const std::set<RankRef> holders = holders_it->second;
  bool released = false;
  for (const RankRef& ref : holders) {
    if (reported.count(ref)) continue;
    Job* job = nullptr;
    Attempt* a = nullptr;
    Rank* r = FindRankLocked(worker_id, ref.job_id, ref.attempt, ref.rank, &job, &a);
    if (r == nullptr) continue;
    const bool running = a->state == AttemptState::kRunning;
    // A fresh assignment may still be on its way; everything else must show up.
    const bool expected = r->state == v1::RANK_STATE_RUNNING || !r->confirmed || !running;
    if (!expected || ++r->misses < config_.max_missed_reports) continue;
    Txn txn(*job);
    ReleaseLocked(*job, *a, *r);
    released = true;
    if (running) {
      r->error = "no longer running on worker " + r->worker_name;
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_LOST);
      FailAttemptLocked(txn, *a,
                        "rank " + std::to_string(r->rank) + " is no longer running on worker " +
                            r->worker_name + " (missing from " +
                            std::to_string(config_.max_missed_reports) + " reports)");
    } else if (r->state == v1::RANK_STATE_ASSIGNED || r->state == v1::RANK_STATE_RUNNING) {
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_STOPPED);
    }
    (void)CommitLocked(txn, Durability::kFast);
    PruneAttemptsLocked(*job);
  }
  if (released) ScheduleLocked();
  return OkStatus();
}

void JobManager::OnRankStarted(const std::string& worker_id, const v1::RankStarted& m) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = nullptr;
  Attempt* a = nullptr;
  Rank* r = FindRankLocked(worker_id, m.job_id(), m.attempt(), m.rank(), &job, &a);
  if (r == nullptr || a->state != AttemptState::kRunning) {
    // A stale attempt (or one that just ended): drop the report, stop the process.
    SendStopLocked(worker_id, m.job_id(), m.attempt(), v1::STOP_REASON_SUPERSEDED,
                   "attempt " + std::to_string(m.attempt()) + " of job " + m.job_id() +
                       " is not a current attempt",
                   config_.default_grace, /*force=*/false);
    return;
  }
  r->pid = m.pid();
  r->confirmed = true;
  r->misses = 0;
  if (r->state != v1::RANK_STATE_ASSIGNED) return;
  Txn txn(*job);
  SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_RUNNING);
  (void)CommitLocked(txn, Durability::kFast);
}

void JobManager::OnRankExited(const std::string& worker_id, const v1::RankExited& m) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = nullptr;
  Attempt* a = nullptr;
  Rank* r = FindRankLocked(worker_id, m.job_id(), m.attempt(), m.rank(), &job, &a);
  if (r == nullptr || !r->occupying) return;  // unknown, or already accounted for
  Txn txn(*job);
  ReleaseLocked(*job, *a, *r);
  r->exit_code = m.exit_code();
  r->signal = m.signal();
  r->error = m.error().substr(0, 4096);
  const bool clean = m.exit_code() == 0 && m.signal() == 0 && !m.stopped();
  if (a->state == AttemptState::kRunning) {
    if (clean) {
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_SUCCEEDED);
      if (++a->succeeded == static_cast<int>(a->ranks.size())) SucceedAttemptLocked(txn, *a);
    } else {
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_FAILED);
      FailAttemptLocked(txn, *a, DescribeExit(m, r->worker_name));
    }
  } else {
    SetRankStateLocked(txn, *a, *r,
                       m.stopped() ? v1::RANK_STATE_STOPPED
                                   : (clean ? v1::RANK_STATE_SUCCEEDED : v1::RANK_STATE_FAILED));
  }
  (void)CommitLocked(txn, Durability::kFast);
  PruneAttemptsLocked(*job);
  ScheduleLocked();
}

void JobManager::OnRankMetrics(const std::string& worker_id, const v1::RankMetrics& m) {
  const v1::MetricsSample& s = m.sample();
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = nullptr;
  Attempt* a = nullptr;
  Rank* r = FindRankLocked(worker_id, s.job_id(), s.attempt(), s.rank(), &job, &a);
  if (r == nullptr || a->state != AttemptState::kRunning) return;
  r->latest = std::make_unique<v1::MetricsSample>(s);
  if (config_.rank_series) {
    config_.rank_series->Add({r->worker_name, r->coords, job->device(), r->local_rank}, s);
  }
  Txn txn(*job);
  *AddEvent(txn)->mutable_metrics() = s;
  if (std::optional<v1::MetricsSample> step = a->aggregator->Add(s)) {
    JobRow& row = job->row;
    row.step = step->step();
    row.loss = step->loss();
    row.tokens_per_second = step->tokens_per_second();
    row.mfu = step->mfu();
    job->step_time_skew = a->aggregator->last_skew();
    job->tokens_total += static_cast<double>(job->spec.train().global_batch_size()) *
                         static_cast<double>(job->spec.model().seq_len());
    txn.job_dirty = true;
    *AddEvent(txn)->mutable_metrics() = std::move(*step);
  }
  (void)CommitLocked(txn, Durability::kFast);
}

void JobManager::OnLogs(const std::string& worker_id, const v1::LogBatch& logs) {
  std::lock_guard<std::mutex> lock(mu_);
  // A line is kept only when its rank is one of a known attempt's (the running one, or an
  // ended one whose ranks still hold slots: a failed attempt's last words matter) placed on
  // the sending worker. Anything else is forged or stale and dropped, so one worker cannot
  // write into, or push the real lines out of, another worker's job.
  Job* job = nullptr;
  std::unique_ptr<Txn> txn;
  size_t dropped = 0;
  for (const v1::LogLine& line : logs.lines()) {
    Job* line_job = nullptr;
    Attempt* line_attempt = nullptr;
    if (FindRankLocked(worker_id, line.job_id(), line.attempt(), line.rank(), &line_job,
                       &line_attempt) == nullptr) {
      ++dropped;
      continue;
    }
    if (job != line_job) {
      if (txn) (void)CommitLocked(*txn, Durability::kFast);
      job = line_job;
      txn = std::make_unique<Txn>(*job);
    }
    *AddEvent(*txn)->mutable_log() = line;
  }
  if (txn) (void)CommitLocked(*txn, Durability::kFast);
  if (dropped > 0) {
    spdlog::warn(
        "worker {}: dropped {} log lines of ranks not placed on it (or of attempts "
        "no longer known)",
        worker_id, dropped);
  }
}

void JobManager::OnCheckpointSaved(const std::string& worker_id, const v1::CheckpointSaved& saved) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(saved.job_id());
  if (job == nullptr || saved.attempt() != job->row.attempt) return;
  // Only a worker running a rank of the attempt reports its checkpoints.
  Attempt* a = FindAttemptLocked(*job, saved.attempt());
  if (a == nullptr || std::none_of(a->ranks.begin(), a->ranks.end(),
                                   [&](const Rank& r) { return r.worker_id == worker_id; })) {
    return;
  }
  Txn txn(*job);
  job->row.last_checkpoint = saved.path();
  txn.job_dirty = true;
  *AddEvent(txn)->mutable_checkpoint_saved() = saved;
  (void)CommitLocked(txn, Durability::kDurable);
}

void JobManager::OnWorkerLost(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerLostLocked(worker_id, "no heartbeat for longer than its lease");
}

void JobManager::WorkerLostLocked(const std::string& worker_id, const std::string& why) {
  foreign_.erase(worker_id);
  auto holders_it = by_worker_.find(worker_id);
  if (holders_it == by_worker_.end()) return;
  const std::set<RankRef> holders = holders_it->second;
  for (const RankRef& ref : holders) {
    Job* job = nullptr;
    Attempt* a = nullptr;
    Rank* r = FindRankLocked(worker_id, ref.job_id, ref.attempt, ref.rank, &job, &a);
    if (r == nullptr) continue;
    Txn txn(*job);
    ReleaseLocked(*job, *a, *r);
    if (r->state == v1::RANK_STATE_ASSIGNED || r->state == v1::RANK_STATE_RUNNING) {
      r->error = "worker " + r->worker_name + " was lost: " + why;
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_LOST);
    }
    FailAttemptLocked(txn, *a, "worker " + r->worker_name + " was lost (" + why + ")");
    (void)CommitLocked(txn, Durability::kFast);
    PruneAttemptsLocked(*job);
  }
  by_worker_.erase(worker_id);
  ScheduleLocked();
}

void JobManager::OnWorkerReregistered(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  foreign_.erase(worker_id);
  auto it = by_worker_.find(worker_id);
  if (it == by_worker_.end()) return;
  for (const RankRef& ref : it->second) {
    Job* job = nullptr;
    Attempt* a = nullptr;
    if (Rank* r = FindRankLocked(worker_id, ref.job_id, ref.attempt, ref.rank, &job, &a)) {
      r->confirmed = false;
      r->misses = 0;
    }
  }
}

void JobManager::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  // Ranks whose worker is neither live nor lost any more (e.g. it never came back after a
  // coordinator restart and was not in the database) are lost too.
  std::set<std::string> live;
  for (const LiveWorker& w : workers_.LiveWorkers()) live.insert(w.worker_id);
  std::vector<std::string> gone;
  for (const auto& [worker, refs] : by_worker_) {
    if (!live.count(worker)) gone.push_back(worker);
  }
  for (const std::string& w : gone) WorkerLostLocked(w, "it is not registered");
  const MonoTime now = clock_.Monotonic();
  for (auto it = stops_sent_.begin(); it != stops_sent_.end();) {
    if (now - it->second <= 10 * config_.stop_resend) {
      ++it;
      continue;
    }
    const std::string& worker = std::get<0>(it->first);
    if (auto n = stops_per_worker_.find(worker); n != stops_per_worker_.end() && --n->second == 0) {
      stops_per_worker_.erase(n);
    }
    it = stops_sent_.erase(it);
  }
  ScheduleLocked();
}

JobsSnapshot JobManager::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  JobsSnapshot out;
  int finished_listed = 0;
  for (auto it = by_seq_.rbegin(); it != by_seq_.rend(); ++it) {
    const Job& job = *jobs_.at(it->second);
    const auto state = static_cast<v1::JobState>(job.row.state);
    ++out.jobs_by_state[state];
    if (job.terminal() && ++finished_listed > 100) continue;
    out.jobs.push_back({job.row.job_id, job.row.name, state, job.row.step,
                        job.row.tokens_per_second, job.row.mfu, job.step_time_skew,
                        job.row.restarts, job.tokens_total});
    out.jobs.back().predicted_step_seconds = job.spec.predicted_step_seconds();
    out.jobs.back().predicted_peak_memory_bytes =
        static_cast<double>(job.spec.predicted_peak_memory_bytes());
  }
  return out;
}

}  // namespace meshrun::coordinator
