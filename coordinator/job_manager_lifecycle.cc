// JobManager, part 2: scheduling rounds and attempt starts, attempt ends with the restart
// policy, and what the workers report on their sessions (rank starts and exits, running lists,
// metrics, logs, checkpoints, lost workers). The rules live in scheduler.h, restart_policy.h
// and metrics_ingest.h; this file applies them to the records under the lock.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <unordered_set>

#include "common/escape.h"
#include "coordinator/job_manager.h"
#include "coordinator/proto_time.h"
#include "proto/mesh_axis.h"

namespace meshrun::coordinator {

// ---- Slots --------------------------------------------------------------------------------------

void JobManager::OccupyLocked(const Job& job, const Attempt& attempt, Rank& rank) {
  if (rank.occupying) return;
  ChangedLocked();
  rank.occupying = true;
  slots_.Occupy(rank.worker_id, {job.row.job_id, attempt.number, rank.rank});
  active_.insert(job.row.job_id);
}

void JobManager::ReleaseLocked(const Job& job, const Attempt& attempt, Rank& rank) {
  if (!rank.occupying) return;
  ChangedLocked();
  rank.occupying = false;
  slots_.Release(rank.worker_id, {job.row.job_id, attempt.number, rank.rank});
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
  return slots_.InUse();
}

std::vector<int> JobManager::SlotsInUseOf(const std::vector<std::string>& worker_ids) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  out.reserve(worker_ids.size());
  for (const std::string& id : worker_ids) out.push_back(slots_.Used(id));
  return out;
}

void JobManager::RecountLocked(Attempt& attempt) {
  attempt.state_counts.fill(0);
  std::unordered_set<std::string> workers;
  for (const Rank& r : attempt.ranks) {
    ++attempt.state_counts[static_cast<size_t>(r.state) % attempt.state_counts.size()];
    workers.insert(r.worker_id);
  }
  attempt.workers_used = static_cast<int>(workers.size());
  attempt.ranks_by_worker.clear();
}

void JobManager::StartIngestLocked(Job& job, Attempt& attempt) {
  auto in = std::make_shared<JobIngest>();
  in->job_id = job.row.job_id;
  in->attempt = attempt.number;
  in->ranks.reserve(attempt.ranks.size());
  for (const Rank& r : attempt.ranks) {
    in->ranks.push_back({r.worker_id, {r.worker_name, r.coords, job.device(), r.local_rank}});
  }
  in->steps = attempt.aggregator ? std::move(attempt.aggregator)
                                 : MetricsIngest::NewAggregator(job.spec, job.mesh.world_size());
  in->tokens_per_step = static_cast<double>(job.spec.train().global_batch_size()) *
                        static_cast<double>(job.spec.model().seq_len());
  in->job = &job;
  ingest_.Start(std::move(in));
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
  if (!stops_.ShouldSend(worker_id, job_id, attempt, clock_.Monotonic(), force)) return;
  // An assignment a placement deferred goes first: a stop must never overtake it.
  FlushAssignmentsLocked();
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
  journal_.WriteJobRow(job);
}

void JobManager::ScheduleLocked() {
  if (!deferring_assignments_) FlushAssignmentsLocked();
  if (queue_.empty() || shut_down_) return;
  // Drained workers take no new ranks (decision 0056).
  SchedulingRound round(PlaceableWorkersLocked(), slots_);
  for (const std::string& job_id : queue_.InOrder()) {
    Job& job = *jobs_.at(job_id);
    if (job.elastic() && !ElasticPrepareLocked(job)) continue;
    const bool backing_off = clock_.Monotonic() < job.not_before;
    ScheduleDecision d = round.Consider(job_id, job.device(), job.mesh,
                                        backing_off ? job.backoff : std::chrono::milliseconds(0));
    switch (d.kind) {
      case ScheduleDecision::kWait: SetWaitMessageLocked(job, d.message); break;
      case ScheduleDecision::kFail: {
        Txn txn(job);
        SetJobStateLocked(txn, v1::JOB_STATE_FAILED, d.message);
        (void)journal_.Commit(txn, Durability::kDurable);
        spdlog::warn("job {} FAILED: {}", job_id, d.message);
        break;
      }
      case ScheduleDecision::kPlace: StartAttemptLocked(job, d.placement, d.workers); break;
    }
  }
}

void JobManager::StartAttemptLocked(Job& job, const Placement& placement,
                                    const std::vector<LiveWorker>& workers) {
  const auto t_start = std::chrono::steady_clock::now();
  const JobRow saved = job.row;
  auto attempt = std::make_unique<Attempt>();
  Attempt& a = *attempt;
  a.number = job.row.attempt + 1;
  a.started_ms = ToMillis(clock_.Now());
  a.aggregator = MetricsIngest::NewAggregator(job.spec, job.mesh.world_size());
  a.ranks.resize(job.mesh.world_size());
  a.state_counts[v1::RANK_STATE_ASSIGNED] = job.mesh.world_size();
  a.workers_used = placement.workers_used;
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
  // Restarts are the attempts a failure ended; a re-mesh's stop is not one (decision 0056).
  job.row.restarts = a.number - 1 - job.remesh_attempts;
  NoteAttemptMeshLocked(job, a);
  Txn txn(job);
  txn.batch.attempts.push_back(ToAttemptRow(job, a));
  // One row per rank, ASSIGNED, and no event per rank: the job's change to RUNNING ("attempt N
  // placed on K workers") stands for the assignments, ListRanks pages them (decision 0049).
  // Their start, exit or loss are events as before.
  txn.batch.ranks.reserve(a.ranks.size());
  for (const Rank& r : a.ranks) txn.batch.ranks.push_back(ToRankRow(job, a, r));
  ChangedLocked();
  const std::string reason = "attempt " + std::to_string(a.number) + " placed on " +
                             std::to_string(placement.workers_used) + " worker" +
                             (placement.workers_used == 1 ? "" : "s");
  SetJobStateLocked(txn, v1::JOB_STATE_RUNNING, reason);
  const auto t_commit = std::chrono::steady_clock::now();
  if (!journal_.Commit(txn, Durability::kDurable).ok()) {
    job.row = saved;
    queue_.Add(job.row.seq, job.row.job_id, job.device(), job.owner);
    return;
  }
  const auto t_committed = std::chrono::steady_clock::now();
  const std::string job_id = job.row.job_id;
  job.attempts[a.number] = std::move(attempt);
  for (Rank& r : a.ranks) OccupyLocked(job, a, r);
  StartIngestLocked(job, a);
  store_.OpenAttempt(job_id, a.number);
  const auto t_assign = std::chrono::steady_clock::now();

  if (deferring_assignments_) {
    unsent_assignments_.emplace_back(job_id, a.number);
    has_unsent_assignments_ = true;
  } else {
    SendAssignmentsLocked(job, a);
  }
  const auto ms = [](auto from, auto to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  };
  const auto t_end = std::chrono::steady_clock::now();
  spdlog::info(
      "job {}: {} ({} ranks; rows {:.1f} ms, commit {:.1f} ms, slots {:.1f} ms, "
      "assignments {:.1f} ms)",
      job_id, reason, job.mesh.world_size(), ms(t_start, t_commit), ms(t_commit, t_committed),
      ms(t_committed, t_assign), ms(t_assign, t_end));
}

void JobManager::SendAssignmentsLocked(const Job& job, const Attempt& attempt) {
  // One assignment per rank; every rank of the attempt loads the same checkpoint.
  v1::WorkerSessionResponse msg;
  v1::RankAssignment* as = msg.mutable_assign();
  as->set_job_id(job.row.job_id);
  as->set_attempt(attempt.number);
  as->set_world_size(job.mesh.world_size());
  v1::MeshShape* shape = as->mutable_mesh();
  shape->set_dp_replicate_size(job.mesh.dp_replicate());
  shape->set_dp_shard_size(job.mesh.dp_shard());
  shape->set_cp_size(job.mesh.cp());
  shape->set_tp_size(job.mesh.tp());
  shape->set_pp_size(job.mesh.pp());
  *as->mutable_spec() = job.spec;
  as->mutable_store()->set_address(config_.store_address);
  as->mutable_store()->set_prefix(job.row.job_id + "/" + std::to_string(attempt.number) + "/");
  // No resume decision here: rank 0 makes it where checkpoint.dir is readable and reports it
  // (CheckpointSaved.resumed; decision 0048).
  for (const Rank& r : attempt.ranks) {
    as->set_rank(r.rank);
    SetProtoCoords(r.coords, as->mutable_coords());
    as->clear_axes();
    AddMeshAxes(job.mesh, r.coords, as->mutable_axes());
    as->set_local_rank(r.local_rank);
    as->set_local_world_size(r.local_world_size);
    workers_.Send(r.worker_id, msg);
  }
}

void JobManager::FlushAssignments() {
  if (!has_unsent_assignments_) return;
  std::lock_guard<std::mutex> lock(mu_);
  FlushAssignmentsLocked();
}

void JobManager::FlushAssignmentsLocked() {
  if (unsent_assignments_.empty()) return;
  std::vector<std::pair<std::string, int>> unsent = std::move(unsent_assignments_);
  unsent_assignments_.clear();
  has_unsent_assignments_ = false;
  for (const auto& [job_id, number] : unsent) {
    Job* job = FindLocked(job_id);
    if (job == nullptr) continue;
    const Attempt* a = FindAttemptLocked(*job, number);
    if (a != nullptr) SendAssignmentsLocked(*job, *a);
  }
}

// ---- Attempts -----------------------------------------------------------------------------------

void JobManager::EndAttemptLocked(Txn& txn, Attempt& attempt, AttemptState state,
                                  const std::string& reason, v1::StopReason stop_reason,
                                  std::chrono::milliseconds grace) {
  attempt.state = state;
  attempt.reason = reason;
  attempt.ended_ms = ToMillis(clock_.Now());
  if (txn.job.elastic()) {  // its next mesh counts steps lost and idle time from here
    txn.job.SyncProgress();
    txn.job.ended_step = txn.job.row.step;
    txn.job.ended_ms = attempt.ended_ms;
  }
  ChangedLocked();
  ingest_.Stop(txn.job.row.job_id, attempt.number);
  txn.batch.attempts.push_back(ToAttemptRow(txn.job, attempt));
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
  const RestartPolicy::Outcome next = restarts_.AfterFailure(
      attempt.number, txn.job.spec.restart().max_restarts(), reason, txn.job.remesh_attempts);
  if (next.restart) {
    txn.job.not_before = clock_.Monotonic() + next.wait;
    txn.job.backoff = next.wait;
    SetJobStateLocked(txn, v1::JOB_STATE_PENDING, next.message);
  } else {
    SetJobStateLocked(txn, v1::JOB_STATE_FAILED, next.message);
  }
  spdlog::warn("job {} attempt {} failed: {}", txn.job.row.job_id, attempt.number, reason);
}

void JobManager::SucceedAttemptLocked(Txn& txn, Attempt& attempt) {
  attempt.state = AttemptState::kSucceeded;
  attempt.reason = "every rank exited 0";
  attempt.ended_ms = ToMillis(clock_.Now());
  ChangedLocked();
  ingest_.Stop(txn.job.row.job_id, attempt.number);
  txn.batch.attempts.push_back(ToAttemptRow(txn.job, attempt));
  store_.CloseAttempt(txn.job.row.job_id, attempt.number);
  SetJobStateLocked(txn, v1::JOB_STATE_SUCCEEDED,
                    "all " + std::to_string(attempt.ranks.size()) + " ranks of attempt " +
                        std::to_string(attempt.number) + " exited 0");
  spdlog::info("job {} SUCCEEDED", txn.job.row.job_id);
}

// ---- Worker reports -----------------------------------------------------------------------------

Status JobManager::OnRunning(const std::string& worker_id,
                             const google::protobuf::RepeatedPtrField<v1::RunningRank>& running) {
  // The fast path: the same list as the last heartbeat that changed nothing, and nothing
  // changed since: answered without mu_ (what the slow path would do is nothing).
  std::vector<RankRef> listed;
  listed.reserve(static_cast<size_t>(running.size()));
  for (const v1::RunningRank& rr : running)
    listed.push_back({rr.job_id(), rr.attempt(), rr.rank()});
  std::sort(listed.begin(), listed.end());
  {
    std::lock_guard<std::mutex> cache(heartbeat_mu_);
    auto it = heartbeats_.find(worker_id);
    if (it != heartbeats_.end() && it->second.generation == generation_.load() &&
        it->second.ranks == listed) {
      return OkStatus();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t generation = generation_.load();
  // Whether this list changed nothing: every rank it names RUNNING in a running attempt,
  // occupying its slot and confirmed, no other rank holding a slot on the worker.
  bool clean = true;
  struct Remember {
    JobManager* self;
    const std::string& worker_id;
    std::vector<RankRef>& listed;
    const bool& clean;
    uint64_t generation;
    ~Remember() {
      std::lock_guard<std::mutex> cache(self->heartbeat_mu_);
      if (clean && self->generation_.load() == generation) {
        self->heartbeats_[worker_id] = {generation, std::move(listed)};
      } else {
        self->heartbeats_.erase(worker_id);
      }
    }
  } remember{this, worker_id, listed, clean, generation};
  // Every (job, attempt) of the list this coordinator does not count gets a StopOrder and an
  // entry in the StopLedger; a worker naming made-up attempts must not grow it without bound.
  {
    std::set<std::pair<std::string, int>> new_stops;
    for (const v1::RunningRank& rr : running) {
      Job* job = nullptr;
      Attempt* a = nullptr;
      Rank* r = FindRankLocked(worker_id, rr.job_id(), rr.attempt(), rr.rank(), &job, &a);
      if (r != nullptr && r->occupying && a->state == AttemptState::kRunning) continue;
      if (stops_.Outstanding(worker_id, rr.job_id(), rr.attempt())) continue;
      new_stops.insert({rr.job_id(), rr.attempt()});
    }
    const size_t outstanding = stops_.OutstandingFor(worker_id);
    if (stops_.WouldExceed(worker_id, new_stops.size())) {
      clean = false;
      spdlog::warn(
          "worker {} reports {} unknown attempts running ({} stop orders outstanding); "
          "refused",
          worker_id, new_stops.size(), outstanding);
      return ResourceExhaustedError(
          "--max-stops-per-worker: the running list names " + std::to_string(new_stops.size()) +
          " attempts this coordinator does not run, and " + std::to_string(outstanding) +
          " stop orders are outstanding for this worker, over the limit of " +
          std::to_string(stops_.max_per_worker()) +
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
      if (r->misses != 0 || !r->confirmed || a->state != AttemptState::kRunning ||
          r->state != v1::RANK_STATE_RUNNING) {
        clean = false;
      }
      r->misses = 0;
      r->confirmed = true;
      if (a->state == AttemptState::kRunning && r->state == v1::RANK_STATE_ASSIGNED) {
        Txn txn(*job);
        r->pid = rr.pid();
        SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_RUNNING);
        (void)journal_.Commit(txn, Durability::kFast);
      } else if (a->state != AttemptState::kRunning) {
        SendStopLocked(
            worker_id, rr.job_id(), rr.attempt(), v1::STOP_REASON_SUPERSEDED,
            "attempt " + std::to_string(rr.attempt()) + " of job " + rr.job_id() + " has ended",
            config_.default_grace, /*force=*/false);
      }
      continue;
    }
    // A rank this coordinator does not count: it holds a slot, and it must stop.
    clean = false;
    ++foreign;
    SendStopLocked(worker_id, rr.job_id(), rr.attempt(), v1::STOP_REASON_SUPERSEDED,
                   "attempt " + std::to_string(rr.attempt()) + " of job " + rr.job_id() +
                       " is not a current attempt",
                   config_.default_grace, /*force=*/false);
  }
  slots_.SetForeign(worker_id, foreign);

  // Ranks the worker should run but did not report.
  const std::set<RankRef> holders = slots_.Holders(worker_id);
  if (holders.empty()) return OkStatus();
  bool released = false;
  for (const RankRef& ref : holders) {
    if (reported.count(ref)) continue;
    clean = false;
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
    (void)journal_.Commit(txn, Durability::kFast);
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
  ChangedLocked();
  r->pid = m.pid();
  r->confirmed = true;
  r->misses = 0;
  if (r->state != v1::RANK_STATE_ASSIGNED) return;
  Txn txn(*job);
  SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_RUNNING);
  (void)journal_.Commit(txn, Durability::kFast);
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
  r->error = std::string(CutUtf8(m.error(), 4096));  // cut whole: a proto3 string stays UTF-8
  const bool clean = m.exit_code() == 0 && m.signal() == 0 && !m.stopped();
  // A re-mesh's checkpoint-now stop: the rank checkpointed and exited 130 (decision 0008).
  const bool remesh_stop = a->state == AttemptState::kRunning &&
                           a->remeshing != RemeshCause::kNone && m.stopped() && m.signal() == 0 &&
                           m.exit_code() == 130;
  if (remesh_stop) {
    SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_STOPPED);
    ++a->stopped_for_remesh;
    if (a->succeeded + a->stopped_for_remesh == static_cast<int>(a->ranks.size())) {
      FinishRemeshLocked(txn, *a);
    }
  } else if (a->state == AttemptState::kRunning) {
    if (clean) {
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_SUCCEEDED);
      if (++a->succeeded == static_cast<int>(a->ranks.size())) {
        SucceedAttemptLocked(txn, *a);
      } else if (a->remeshing != RemeshCause::kNone &&
                 a->succeeded + a->stopped_for_remesh == static_cast<int>(a->ranks.size())) {
        FinishRemeshLocked(txn, *a);
      }
    } else {
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_FAILED);
      FailAttemptLocked(txn, *a, DescribeExit(m, r->worker_name));
      // A runtime error exit (not a signal, not exit 2: invalid input is a cause of its own)
      // while peers ran on other workers may be this rank noticing a peer that died first:
      // keep room for the real cause.
      const bool peers_elsewhere =
          std::any_of(a->ranks.begin(), a->ranks.end(),
                      [&](const Rank& peer) { return peer.worker_id != r->worker_id; });
      a->cause_may_follow =
          m.signal() == 0 && m.exit_code() > 0 && m.exit_code() != 2 && peers_elsewhere;
      a->failed_message = job->row.message;
    }
  } else {
    SetRankStateLocked(txn, *a, *r,
                       m.stopped() ? v1::RANK_STATE_STOPPED
                                   : (clean ? v1::RANK_STATE_SUCCEEDED : v1::RANK_STATE_FAILED));
    // A rank killed by a signal it was not sent by a stop order: the first cause of a failure
    // a peer reported first.
    if (m.signal() != 0 && !m.stopped()) {
      NameFirstCauseLocked(txn, *a, DescribeExit(m, r->worker_name));
    }
  }
  (void)journal_.Commit(txn, Durability::kFast);
  PruneAttemptsLocked(*job);
  ScheduleLocked();
}

void JobManager::OnRankMetrics(const std::string& worker_id, const v1::RankMetrics& m) {
  // The ingest path: matched, aggregated and published under the job's own ingest lock,
  // never under mu_ (IngestBook). A batch (RankMetrics.samples) as one sample after another.
  if (m.has_sample() || m.samples().empty()) (void)ingest_.Add(worker_id, m.sample());
  if (!m.samples().empty()) (void)ingest_.AddAll(worker_id, m.samples());
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
      if (txn) (void)journal_.Commit(*txn, Durability::kFast);
      job = line_job;
      txn = std::make_unique<Txn>(*job);
    }
    *journal_.AddEvent(*txn)->mutable_log() = line;
  }
  if (txn) (void)journal_.Commit(*txn, Durability::kFast);
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
  // Only a folder of the job's own checkpoint.dir is ever resumed from.
  if (Status own = CheckReportedCheckpoint(job->spec, saved.step(), saved.path()); !own.ok()) {
    const size_t n = ++job->totals.refused_checkpoints;
    if (std::has_single_bit(n)) {  // said at 1, 2, 4, …
      spdlog::warn("worker {}: refused checkpoint report {} of job {}: {}", worker_id, n,
                   job->row.job_id, own.message());
    }
    return;
  }
  Txn txn(*job);
  job->row.last_checkpoint = saved.path();
  txn.job_dirty = true;
  if (saved.resumed() && !job->meshes.empty() && job->meshes.back().attempt == saved.attempt()) {
    job->meshes.back().from_step = saved.step();
  }
  if (saved.resumed()) {
    spdlog::info("job {}: attempt {} resumed from {} (step {})", job->row.job_id, saved.attempt(),
                 saved.path(), saved.step());
  }
  *journal_.AddEvent(txn)->mutable_checkpoint_saved() = saved;
  (void)journal_.Commit(txn, Durability::kDurable);
}

void JobManager::OnWorkerLost(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerLostLocked(worker_id, "no heartbeat for longer than its lease");
}

void JobManager::WorkerLostLocked(const std::string& worker_id, const std::string& why) {
  slots_.SetForeign(worker_id, 0);
  const std::set<RankRef> holders = slots_.Holders(worker_id);
  if (holders.empty()) return;
  for (const RankRef& ref : holders) {
    Job* job = nullptr;
    Attempt* a = nullptr;
    Rank* r = FindRankLocked(worker_id, ref.job_id, ref.attempt, ref.rank, &job, &a);
    if (r == nullptr) continue;
    Txn txn(*job);
    ReleaseLocked(*job, *a, *r);
    const bool was_running =
        r->state == v1::RANK_STATE_ASSIGNED || r->state == v1::RANK_STATE_RUNNING;
    if (was_running) {
      r->error = "worker " + r->worker_name + " was lost: " + why;
      SetRankStateLocked(txn, *a, *r, v1::RANK_STATE_LOST);
    }
    const std::string cause = "worker " + r->worker_name + " was lost (" + why + ")";
    // Its ranks never reported an exit after the attempt failed: the worker was gone already,
    // and the failure a peer reported was its echo.
    if (was_running) NameFirstCauseLocked(txn, *a, cause);
    FailAttemptLocked(txn, *a, cause);
    (void)journal_.Commit(txn, Durability::kFast);
    PruneAttemptsLocked(*job);
  }
  slots_.ForgetHolders(worker_id);
  ScheduleLocked();
}

void JobManager::NameFirstCauseLocked(Txn& txn, Attempt& attempt, const std::string& cause) {
  if (attempt.state != AttemptState::kFailed || !attempt.cause_may_follow) return;
  attempt.cause_may_follow = false;
  const std::string echo = attempt.reason;
  attempt.reason = cause + "; before that was known, " + echo;
  txn.batch.attempts.push_back(ToAttemptRow(txn.job, attempt));
  // The job's message (and the reason a pending job waits with) while they still start with
  // what that failure set.
  JobRow& row = txn.job.row;
  auto rewrite = [&](std::string& text) {
    const size_t at = text.find(echo);
    if (text.rfind(attempt.failed_message, 0) != 0 || at == std::string::npos) return false;
    text.replace(at, echo.size(), attempt.reason);
    return true;
  };
  if (row.attempt == attempt.number) {
    rewrite(txn.job.pending_reason);
    if (rewrite(row.message)) txn.job_dirty = true;
  }
  spdlog::warn("job {} attempt {}: first cause {}", row.job_id, attempt.number, cause);
}

void JobManager::OnWorkerReregistered(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ChangedLocked();
  slots_.SetForeign(worker_id, 0);
  for (const RankRef& ref : slots_.Holders(worker_id)) {
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
  // Only when the workers or the jobs changed since the last look (and every 50th tick, 5 s,
  // as a backstop): at 4,096 workers the look held this lock 7–12 ms of every 100 ms tick,
  // which GetJob and ListRanks waited behind. (The ids are views into slots_: the lost ones are
  // copied out before any is forgotten.)
  const uint64_t roster = workers_.RosterGeneration();
  if (roster != holders_checked_roster_ || generation_.load() != holders_checked_jobs_ ||
      ++ticks_since_holders_check_ >= 50) {
    for (const std::string& w : workers_.NotLive(slots_.WorkerIdsWithHolders())) {
      WorkerLostLocked(w, "it is not registered");
    }
    holders_checked_roster_ = roster;
    holders_checked_jobs_ = generation_.load();
    ticks_since_holders_check_ = 0;
  }
  stops_.Expire(clock_.Monotonic());
  ElasticTickLocked();
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
    std::unique_lock<std::mutex> progress(job.progress.mu);
    const JobProgress& p = job.progress;
    out.jobs.push_back({job.row.job_id, job.row.name, state, p.step, p.tokens_per_second, p.mfu,
                        p.step_time_skew, job.row.restarts, p.tokens_total});
    progress.unlock();
    out.jobs.back().predicted_step_seconds = job.spec.predicted_step_seconds();
    out.jobs.back().predicted_peak_memory_bytes =
        static_cast<double>(job.spec.predicted_peak_memory_bytes());
    JobsSnapshot::JobLine& line = out.jobs.back();
    line.world_size = job.mesh.world_size();
    line.elastic = job.elastic();
    line.remeshes = std::max(0, job.meshes_dropped + static_cast<int>(job.meshes.size()) - 1);
    line.remesh_steps_lost = job.dropped_steps_lost;
    line.remesh_seconds_without_training = job.dropped_seconds_without_training;
    for (const MeshEpoch& e : job.meshes) {
      if (e.from_step >= 0 && e.step_before >= 0) {
        line.remesh_steps_lost += std::max<int64_t>(0, e.step_before - e.from_step);
      }
      if (e.idle_seconds > 0) line.remesh_seconds_without_training += e.idle_seconds;
    }
  }
  return out;
}

}  // namespace meshrun::coordinator
