// JobManager, part 3: elastic jobs and drains (docs/job-spec.md "Elastic jobs", decision 0056).
// An elastic job's mesh changes between attempts: it shrinks when a lost worker's replacement
// does not come within resources.elastic.wait_seconds, grows when a worker registers, and moves
// off a drained worker. Grow and drain ask the ranks to checkpoint now (StopOrder REMESH: the
// ranks' SIGTERM stop checkpoints at the next step boundary and exits 130), so no step is lost;
// the next attempt resumes from that checkpoint on the new mesh.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>

#include "common/job_spec.h"
#include "coordinator/job_manager.h"
#include "coordinator/placement.h"
#include "coordinator/proto_time.h"
#include "engine/train/planner.h"
#include "proto/spec_convert.h"

namespace meshrun::coordinator {
namespace {

std::array<int, 4> SizesOfMesh(const ParallelDims& m) {
  return {m.dp_replicate(), m.dp_shard(), m.cp(), m.tp()};
}

int WorldOfSizes(const std::array<int, 4>& s) {
  return s[0] * s[1] * s[2] * s[3];
}

// "dp_shard 2 × tp 2 (world 4)".
std::string ElasticMeshText(const std::array<int, 4>& s) {
  ParallelismSpec p;
  p.dp_replicate_size = s[0];
  p.dp_shard_size = s[1];
  p.cp_size = s[2];
  p.tp_size = s[3];
  return MeshName(p) + " (world " + std::to_string(WorldOfSizes(s)) + ")";
}

void SetMeshShape(const std::array<int, 4>& s, v1::MeshShape* out) {
  out->set_dp_replicate_size(s[0]);
  out->set_dp_shard_size(s[1]);
  out->set_cp_size(s[2]);
  out->set_tp_size(s[3]);
}

// The sizes of `world` ranks for the job: the planner's choice when the job was submitted with
// parallelism.auto (its stored spec keeps auto_choice), else tp and cp kept and the data axes
// resized (ElasticDataAxesMesh). nullopt when no valid mesh has `world` ranks.
std::optional<std::array<int, 4>> ElasticSizesFor(const v1::JobSpec& stored, const JobSpec& spec,
                                                  int world) {
  auto to_sizes = [](const ParallelismSpec& p) {
    return std::array<int, 4>{p.dp_replicate_size, p.dp_shard_size, p.cp_size, p.tp_size};
  };
  if (!stored.auto_choice().empty()) {
    JobSpec asked = spec;
    asked.parallelism.auto_mesh = true;
    asked.parallelism.dp_replicate_size = asked.parallelism.dp_shard_size = 1;
    asked.parallelism.cp_size = asked.parallelism.tp_size = 1;
    asked.resources.elastic_min_ranks = asked.resources.elastic_max_ranks = 0;
    asked.resources.elastic_wait_seconds = 60;
    StatusOr<DeviceProfile> device =
        DeviceProfileNamed(spec.resources.device == "cuda" ? "h100" : "cpu");
    if (device.ok()) {
      ClusterShape cluster;
      cluster.nodes = 1;
      cluster.per_node = world;
      cluster.device = *device;
      StatusOr<MeshChoice> choice = ChooseMesh(asked, cluster);
      if (choice.ok()) return to_sizes(choice->spec.parallelism);
    }
  }
  std::optional<ParallelismSpec> p = ElasticDataAxesMesh(spec, world);
  if (!p) return std::nullopt;
  return to_sizes(*p);
}

// Keeps the newest kMaxMeshEpochs meshes of `job`; what the older ones cost goes to its totals.
void TrimMeshHistory(JobRecord& job) {
  if (job.meshes.size() <= kMaxMeshEpochs) return;
  const size_t drop = job.meshes.size() - kMaxMeshEpochs;
  for (size_t i = 0; i < drop; ++i) {
    const MeshEpoch& e = job.meshes[i];
    if (e.from_step >= 0 && e.step_before >= 0) {
      job.dropped_steps_lost += std::max<int64_t>(0, e.step_before - e.from_step);
    }
    if (e.idle_seconds > 0) job.dropped_seconds_without_training += e.idle_seconds;
  }
  job.meshes_dropped += static_cast<int>(drop);
  job.meshes.erase(job.meshes.begin(), job.meshes.begin() + static_cast<std::ptrdiff_t>(drop));
}

}  // namespace

std::vector<LiveWorker> JobManager::PlaceableWorkersLocked() const {
  std::vector<LiveWorker> live = workers_.LiveWorkers();
  std::erase_if(live, [](const LiveWorker& w) { return w.drained; });
  return live;
}

std::optional<std::array<int, 4>> JobManager::BestElasticMeshLocked(const Job& job,
                                                                    bool own) const {
  StatusOr<JobSpec> spec = JobSpecFromProto(job.spec);
  if (!spec.ok()) return std::nullopt;
  std::vector<PlacementWorker> free;
  int total = 0;
  for (const LiveWorker& w : PlaceableWorkersLocked()) {
    if (w.device != job.device()) continue;
    int used = slots_.Used(w.worker_id);
    if (own) {
      for (const auto& [n, a] : job.attempts) {
        for (const Rank& r : a->ranks) used -= r.occupying && r.worker_id == w.worker_id;
      }
    }
    const int f = std::max(0, w.slots - used);
    free.push_back({w.worker_id, w.slots, f});
    total += f;
  }
  const int lo = std::max(1, spec->resources.elastic_min_ranks);
  for (int world = std::min(spec->resources.elastic_max_ranks, total); world >= lo; --world) {
    std::optional<std::array<int, 4>> sizes = ElasticSizesFor(job.spec, *spec, world);
    if (!sizes) continue;
    StatusOr<ParallelDims> mesh =
        ParallelDims::Create((*sizes)[0], (*sizes)[1], (*sizes)[2], (*sizes)[3]);
    if (mesh.ok() && PlaceJob(*mesh, free).ok()) return sizes;
    // The planner's choice may not place (a tp group wider than a worker): the data-axes rule.
    std::optional<ParallelismSpec> p = ElasticDataAxesMesh(*spec, world);
    if (!p) continue;
    mesh = ParallelDims::Create(p->dp_replicate_size, p->dp_shard_size, p->cp_size, p->tp_size);
    if (mesh.ok() && PlaceJob(*mesh, free).ok()) {
      return std::array<int, 4>{p->dp_replicate_size, p->dp_shard_size, p->cp_size, p->tp_size};
    }
  }
  return std::nullopt;
}

void JobManager::SetJobMeshLocked(Job& job, const std::array<int, 4>& sizes, RemeshCause cause) {
  StatusOr<ParallelDims> mesh = ParallelDims::Create(sizes[0], sizes[1], sizes[2], sizes[3]);
  if (!mesh.ok()) return;
  const std::array<int, 4> previous = SizesOfMesh(job.mesh);
  job.SyncProgress();
  Txn txn(job);
  v1::ParallelismSpec* p = job.spec.mutable_parallelism();
  p->set_dp_replicate_size(sizes[0]);
  p->set_dp_shard_size(sizes[1]);
  p->set_cp_size(sizes[2]);
  p->set_tp_size(sizes[3]);
  job.mesh = *mesh;
  job.row.world_size = mesh->world_size();
  job.row.spec = job.spec.SerializeAsString();
  job.next_cause = cause;
  txn.job_dirty = true;
  v1::JobRemeshed* e = journal_.AddEvent(txn)->mutable_remeshed();
  e->set_attempt(job.row.attempt + 1);
  SetMeshShape(previous, e->mutable_previous_mesh());
  SetMeshShape(sizes, e->mutable_mesh());
  e->set_cause(RemeshCauseName(cause));
  e->set_step(job.row.step);
  ChangedLocked();
  (void)journal_.Commit(txn, Durability::kDurable);
  spdlog::info("job {}: re-meshed ({}) from {} to {}", job.row.job_id, RemeshCauseName(cause),
               ElasticMeshText(previous), ElasticMeshText(sizes));
}

bool JobManager::ElasticPrepareLocked(Job& job) {
  // An older attempt's ranks still hold slots: they may be writing the checkpoint the next
  // attempt resumes from (a grow or drain), and the free capacity is not known yet.
  for (const auto& [n, a] : job.attempts) {
    if (a->state == AttemptState::kRunning) continue;
    if (std::any_of(a->ranks.begin(), a->ranks.end(), [](const Rank& r) { return r.occupying; })) {
      SetWaitMessageLocked(job, "waiting for the ranks of attempt " + std::to_string(n) +
                                    " to exit (they checkpoint first)");
      return false;
    }
  }
  if (clock_.Monotonic() < job.not_before) return true;  // the restart backoff: Consider says so
  const std::optional<std::array<int, 4>> best = BestElasticMeshLocked(job, /*own=*/false);
  if (!best) return true;  // not even min_ranks fit: Consider's message says what it waits for
  const int world = job.mesh.world_size();
  const int best_world = WorldOfSizes(*best);
  if (best_world == world) return true;
  if (best_world > world) {
    SetJobMeshLocked(job, *best, RemeshCause::kGrown);
    return true;
  }
  // Shrinking: at once after a drain, else once the wait for a replacement is over.
  const auto wait = std::chrono::seconds(job.spec.resources().elastic_wait_seconds());
  if (job.next_cause != RemeshCause::kDrained && clock_.Monotonic() - job.pending_since < wait) {
    return true;
  }
  const RemeshCause cause = job.next_cause == RemeshCause::kDrained ? RemeshCause::kDrained
                            : job.row.attempt > 0                   ? RemeshCause::kLostWorker
                                                                    : RemeshCause::kCapacity;
  SetJobMeshLocked(job, *best, cause);
  return true;
}

void JobManager::RemeshLocked(Job& job, Attempt& attempt, RemeshCause cause) {
  if (attempt.remeshing != RemeshCause::kNone || attempt.state != AttemptState::kRunning) return;
  attempt.remeshing = cause;
  job.next_cause = cause;
  ChangedLocked();
  const std::string why = cause == RemeshCause::kDrained ? "a worker it runs on is drained"
                                                         : "more capacity is free: it grows";
  Txn txn(job);
  job.row.message = "attempt " + std::to_string(attempt.number) +
                    " checkpoints at the next step and stops to re-mesh (" + why + ")";
  txn.job_dirty = true;
  (void)journal_.Commit(txn, Durability::kDurable);
  // The step in flight, the stop agreement and the checkpoint write: the collective bound
  // covers a hung peer, and the rest is a step and a write.
  const std::chrono::milliseconds grace = std::max(
      config_.default_grace,
      std::chrono::milliseconds(1000LL * (job.spec.parallelism().comm_timeout_seconds() + 120)));
  std::set<std::string> holders;
  for (const Rank& r : attempt.ranks) {
    if (r.occupying) holders.insert(r.worker_id);
  }
  for (const std::string& w : holders) {
    SendStopLocked(w, job.row.job_id, attempt.number, v1::STOP_REASON_REMESH, job.row.message,
                   grace, /*force=*/true);
  }
  spdlog::info("job {}: {}", job.row.job_id, job.row.message);
}

void JobManager::FinishRemeshLocked(Txn& txn, Attempt& attempt) {
  Job& job = txn.job;
  const std::string cause = RemeshCauseName(attempt.remeshing);
  job.SyncProgress();
  const std::string reason = "attempt " + std::to_string(attempt.number) +
                             " checkpointed at step " + std::to_string(job.row.step) +
                             " and stopped to re-mesh (" + cause + ")";
  EndAttemptLocked(txn, attempt, AttemptState::kRemeshed, reason, v1::STOP_REASON_REMESH,
                   config_.default_grace);
  ++job.remesh_attempts;
  job.not_before = MonoTime{};
  job.backoff = std::chrono::milliseconds(0);
  SetJobStateLocked(txn, v1::JOB_STATE_PENDING, reason);
  spdlog::info("job {}: {}", job.row.job_id, reason);
}

void JobManager::ElasticTickLocked() {
  std::set<std::string> drained;  // usually none: no copy of every live worker per tick
  for (std::string& id : workers_.DrainedWorkers()) drained.insert(std::move(id));
  const MonoTime now = clock_.Monotonic();
  const std::vector<std::string> active(active_.begin(), active_.end());
  for (const std::string& job_id : active) {
    Job* job = FindLocked(job_id);
    if (job == nullptr || job->row.state != v1::JOB_STATE_RUNNING) continue;
    Attempt* a = job->last();
    if (a == nullptr || a->state != AttemptState::kRunning || a->remeshing != RemeshCause::kNone) {
      continue;
    }
    if (!drained.empty() && std::any_of(a->ranks.begin(), a->ranks.end(), [&](const Rank& r) {
          return r.occupying && drained.count(r.worker_id) > 0;
        })) {
      RemeshLocked(*job, *a, RemeshCause::kDrained);
      continue;
    }
    if (!job->elastic() || now < job->next_grow_check) continue;
    job->next_grow_check = now + std::chrono::seconds(1);
    if (job->mesh.world_size() >= job->spec.resources().elastic_max_ranks()) continue;
    // Only an attempt that has trained a step (not one still starting) is worth stopping.
    {
      std::lock_guard<std::mutex> progress(job->progress.mu);
      if (job->progress.first_step_attempt != a->number) continue;
    }
    const std::optional<std::array<int, 4>> best = BestElasticMeshLocked(*job, /*own=*/true);
    if (best && WorldOfSizes(*best) > job->mesh.world_size()) {
      RemeshLocked(*job, *a, RemeshCause::kGrown);
    }
  }
}

std::vector<std::string> JobManager::OnWorkerDrained(const std::string& worker_id, bool drained) {
  std::lock_guard<std::mutex> lock(mu_);
  ChangedLocked();
  std::vector<std::string> jobs;
  if (drained) {
    std::set<std::string> seen;
    for (const RankRef& ref : slots_.Holders(worker_id)) {
      if (!seen.insert(ref.job_id).second) continue;
      Job* job = FindLocked(ref.job_id);
      if (job == nullptr) continue;
      Attempt* a = FindAttemptLocked(*job, ref.attempt);
      if (a == nullptr || a->state != AttemptState::kRunning) continue;
      jobs.push_back(ref.job_id);
      RemeshLocked(*job, *a, RemeshCause::kDrained);
    }
  }
  ScheduleLocked();
  return jobs;
}

void JobManager::NoteAttemptMeshLocked(Job& job, Attempt& attempt) {
  if (!job.elastic()) return;
  const std::array<int, 4> sizes = SizesOfMesh(job.mesh);
  attempt.mesh_text = ElasticMeshText(sizes);
  attempt.spec_bytes = job.spec.SerializeAsString();
  const bool changed = job.meshes.empty() || job.meshes.back().sizes != sizes ||
                       job.next_cause == RemeshCause::kGrown ||
                       job.next_cause == RemeshCause::kDrained;
  if (!changed) {
    attempt.cause = "restart";
    return;
  }
  MeshEpoch e;
  e.attempt = attempt.number;
  e.sizes = sizes;
  e.started_ms = attempt.started_ms;
  if (job.meshes.empty()) {
    e.cause =
        job.next_cause == RemeshCause::kCapacity ? RemeshCause::kCapacity : RemeshCause::kSubmitted;
    e.from_step = job.row.attempt > 0 ? -1 : 0;
  } else {
    e.cause = job.next_cause != RemeshCause::kNone ? job.next_cause : RemeshCause::kLostWorker;
    e.step_before = job.ended_step;
    e.previous_end_ms = job.ended_ms;
  }
  attempt.cause = RemeshCauseName(e.cause);
  job.meshes.push_back(e);
  TrimMeshHistory(job);
  job.next_cause = RemeshCause::kNone;
}

void JobManager::FillMeshesLocked(Job& job, v1::Job* out) {
  if (!job.elastic()) return;
  int first_step_attempt = 0;
  int64_t first_step_ms = 0;
  {
    std::lock_guard<std::mutex> progress(job.progress.mu);
    first_step_attempt = job.progress.first_step_attempt;
    first_step_ms = job.progress.first_step_ms;
  }
  for (MeshEpoch& e : job.meshes) {
    // The first step on this mesh: the newest attempt that reported one, when it is this
    // epoch's (a later attempt on the same mesh would be a restart after a failure).
    if (e.idle_seconds < 0 && e.previous_end_ms > 0 && first_step_attempt == e.attempt) {
      e.idle_seconds = static_cast<double>(first_step_ms - e.previous_end_ms) / 1000.0;
    }
    v1::JobMesh* m = out->add_meshes();
    m->set_attempt(e.attempt);
    SetMeshShape(e.sizes, m->mutable_mesh());
    m->set_world_size(WorldOfSizes(e.sizes));
    m->set_from_step(e.from_step);
    m->set_cause(RemeshCauseName(e.cause));
    SetTimestampMillis(e.started_ms, m->mutable_started_at());
    m->set_steps_lost(e.from_step >= 0 && e.step_before >= 0
                          ? std::max<int64_t>(0, e.step_before - e.from_step)
                          : -1);
    m->set_seconds_without_training(e.idle_seconds);
  }
}

}  // namespace meshrun::coordinator
