// JobManager, part 1: the client RPCs (submit, get, list, cancel, watch, logs), job and rank
// state changes, and restoring state after a restart. Placement, attempts and worker messages
// are in job_manager_lifecycle.cc.
#include "coordinator/job_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <unordered_set>

#include "common/escape.h"
#include "common/job_spec.h"
#include "coordinator/proto_time.h"
#include "proto/mesh_axis.h"
#include "proto/spec_convert.h"

namespace meshrun::coordinator {

namespace {

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
    : workers_(workers),
      store_(store),
      clock_(clock),
      config_(std::move(config)),
      journal_(db, clock, config_.events),
      restarts_(config_.restart_backoff, config_.restart_backoff_max),
      stops_(config_.stop_resend, config_.max_stops_per_worker),
      metrics_(config_.rank_series),
      ingest_(db, clock, config_.events, config_.rank_series) {}

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

v1::Job JobManager::ToProtoLocked(Job& job, bool detail, bool with_ranks) {
  job.SyncProgress();  // the ingest path's figures
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
  if (!job.ranks_loaded && journal_.db() != nullptr && row.attempt > 0) {
    // A finished job restored after a restart: read its last attempt's ranks once.
    auto ranks = journal_.LoadRanks(row.job_id, row.attempt);
    if (ranks.ok()) {
      auto attempt = std::make_unique<Attempt>();
      attempt->number = row.attempt;
      attempt->ranks = std::move(*ranks);
      RecountLocked(*attempt);
      job.attempts[row.attempt] = std::move(attempt);
      job.ranks_loaded = true;
    }
  }
  FillMeshesLocked(job, &j);
  if (const Attempt* last = job.last(); last != nullptr && with_ranks) {
    for (const Rank& r : last->ranks) FillRankInfo(r, job.mesh, j.add_ranks());
  }
  return j;
}

// ---- State changes ------------------------------------------------------------------------------

void JobManager::SetJobStateLocked(Txn& txn, v1::JobState state, const std::string& reason) {
  JobRow& row = txn.job.row;
  const auto previous = static_cast<v1::JobState>(row.state);
  row.state = state;
  row.message = reason;
  const int64_t now = ToMillis(clock_.Now());
  if (state == v1::JOB_STATE_RUNNING && row.started_ms == 0) row.started_ms = now;
  if (txn.job.terminal()) row.finished_ms = now;
  if (txn.job.terminal()) metrics_.JobFinished(row.job_id);
  if (txn.job.terminal() && previous != v1::JOB_STATE_SUCCEEDED &&
      previous != v1::JOB_STATE_FAILED && previous != v1::JOB_STATE_CANCELLED) {
    NoteFinishedLocked(row.job_id);
  }
  txn.job_dirty = true;
  if (state == v1::JOB_STATE_PENDING) {
    if (previous != v1::JOB_STATE_PENDING) txn.job.pending_since = clock_.Monotonic();
    txn.job.pending_reason = reason;
    queue_.Add(row.seq, row.job_id, txn.job.device(), txn.job.owner);
  } else {
    queue_.Remove(row.seq);
  }
  v1::JobStateChanged* e = journal_.AddEvent(txn)->mutable_state_changed();
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
  --attempt.state_counts[static_cast<size_t>(rank.state) % attempt.state_counts.size()];
  ++attempt.state_counts[static_cast<size_t>(state) % attempt.state_counts.size()];
  ChangedLocked();
  rank.state = state;
  txn.batch.ranks.push_back(ToRankRow(txn.job, attempt, rank));
  v1::RankStateChanged* e = journal_.AddEvent(txn)->mutable_rank_state_changed();
  e->set_attempt(attempt.number);
  FillRankInfo(rank, txn.job.mesh, e->mutable_rank());
}

// ---- Client RPCs --------------------------------------------------------------------------------

StatusOr<std::string> JobManager::Submit(const v1::SubmitJobRequest& request,
                                         const std::string& caller) {
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
  const auto t_start = std::chrono::steady_clock::now();
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, ValidateProtoJobSpec(request.spec()));
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
  // Stored and sent to the ranks with the defaults applied: a client may leave fields unset.
  v1::JobSpec resolved = ResolvedJobSpecProto(request.spec(), spec);

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
  if (!caller.empty() && queue_.CountOf(caller) >= config_.max_queued_jobs_per_caller) {
    return ResourceExhaustedError(
        "--max-pending-jobs-per-caller: this caller (token, or host without tokens) already "
        "has " +
        std::to_string(queue_.CountOf(caller)) +
        " jobs PENDING, the coordinator's limit per caller (hint: wait for some to start, "
        "cancel some, or ask the operator to raise --max-pending-jobs-per-caller)");
  }
  const std::vector<LiveWorker> live = workers_.LiveWorkers();
  // An elastic job starts on fewer ranks than its spec's world when only those fit (decision
  // 0056): only a tp group wider than every worker is refused here.
  MESHRUN_RETURN_IF_ERROR(CheckAdmission(live, spec.resources.device, mesh,
                                         request.wait_for_capacity() || spec.resources.elastic()));

  if (request.dry_run()) {
    return DescribeDryRun(live, slots_, spec.resources.device, mesh,
                          queue_.CountFor(spec.resources.device));
  }

  JobRow row;
  row.seq = next_seq_;
  char id[32];
  std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(row.seq));
  row.job_id = id;
  row.name = spec.name;
  row.state = v1::JOB_STATE_UNSPECIFIED;
  row.spec = resolved.SerializeAsString();
  row.request_id = request.request_id();
  row.submitted_ms = ToMillis(clock_.Now());
  row.world_size = mesh.world_size();
  auto job = std::make_unique<Job>(std::move(row), std::move(resolved), mesh, config_.events);
  job->owner = caller;
  Txn txn(*job);
  SetJobStateLocked(txn, v1::JOB_STATE_PENDING, "submitted");
  const auto t_commit = std::chrono::steady_clock::now();
  Status status = journal_.Commit(txn, Durability::kDurable);
  if (!status.ok()) {
    queue_.Remove(job->row.seq);
    return status;
  }
  const auto t_committed = std::chrono::steady_clock::now();
  ++next_seq_;
  const std::string job_id = job->row.job_id;
  if (!job->row.request_id.empty()) request_ids_[job->row.request_id] = job_id;
  by_seq_[job->row.seq] = job_id;
  jobs_[job_id] = std::move(job);
  deferring_assignments_ = config_.defer_submit_assignments;
  ScheduleLocked();
  deferring_assignments_ = false;
  const auto ms = [](auto from, auto to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  };
  spdlog::info(
      "job {} ({}) submitted: {} ranks, {} (checks {:.1f} ms, commit {:.1f} ms, "
      "scheduling {:.1f} ms)",
      job_id, spec.name, mesh.world_size(), mesh.ToString(), ms(t_start, t_commit),
      ms(t_commit, t_committed), ms(t_committed, std::chrono::steady_clock::now()));
  return job_id;
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

Status JobManager::Get(const v1::GetJobRequest& request, v1::GetJobResponse* response) {
  if (request.job_id().empty()) {
    return InvalidArgumentError("job_id: is empty (hint: pass a job id from `meshrun jobs`)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  // The summary still loads a restored finished job's ranks once (their counts).
  *response->mutable_job() =
      ToProtoLocked(*job, /*detail=*/true, /*with_ranks=*/!request.summary());
  if (const Attempt* last = job->last()) {
    for (size_t state = 1; state < last->state_counts.size(); ++state) {
      if (last->state_counts[state] <= 0) continue;
      v1::RankStateCount* count = response->add_rank_states();
      count->set_state(static_cast<v1::RankState>(state));
      count->set_ranks(last->state_counts[state]);
    }
    response->set_workers_used(last->workers_used);
  }
  return OkStatus();
}

namespace {

// The first rank ≥ `from` whose coordinates match `fixed` (-1: any) on a mesh of `sizes`,
// outermost axis first (global rank order is lexicographic in the coordinates); -1 if none.
int64_t NextMatchingRank(int64_t from, const std::array<int, 5>& sizes,
                         const std::array<int, 5>& fixed) {
  std::array<int64_t, 5> d{};
  int64_t rest = from;
  for (int i = 4; i >= 0; --i) {
    d[i] = rest % sizes[i];
    rest /= sizes[i];
  }
  if (rest > 0) return -1;  // past the last rank
  auto lowest_from = [&](int i) {
    for (int k = i; k < 5; ++k) d[k] = fixed[k] >= 0 ? fixed[k] : 0;
  };
  for (int i = 0; i < 5; ++i) {
    if (fixed[i] < 0 || d[i] == fixed[i]) continue;
    if (d[i] < fixed[i]) {
      lowest_from(i);
      break;
    }
    // d[i] > fixed[i]: carry into the nearest free axis before i that can still grow.
    int j = i - 1;
    while (j >= 0 && (fixed[j] >= 0 || d[j] + 1 >= sizes[j])) --j;
    if (j < 0) return -1;
    ++d[j];
    lowest_from(j + 1);
    break;
  }
  int64_t g = 0;
  for (int i = 0; i < 5; ++i) g = g * sizes[i] + d[i];
  return g;
}

Status BadRankToken(const std::string& token) {
  return InvalidArgumentError("page_token: '" + token.substr(0, 64) +
                              "' was not issued by this coordinator (hint: leave it empty for "
                              "the first page)");
}

}  // namespace

Status JobManager::ListRanks(const v1::ListRanksRequest& request, v1::ListRanksResponse* response) {
  if (request.job_id().empty()) {
    return InvalidArgumentError("job_id: is empty (hint: pass a job id from `meshrun jobs`)");
  }
  if (request.page_size() < 0) {
    return InvalidArgumentError("page_size: must be ≥ 0, got " +
                                std::to_string(request.page_size()) + " (hint: 0 for the default)");
  }
  const int page = request.page_size() == 0 ? config_.default_page_size
                                            : std::min(request.page_size(), config_.max_page_size);
  // "a<attempt>r<rank>": the next rank to look at, of that attempt.
  int token_attempt = 0;
  int64_t from = 0;
  if (!request.page_token().empty()) {
    long long a = 0, r = 0;
    char tail = 0;
    if (std::sscanf(request.page_token().c_str(), "a%lldr%lld%c", &a, &r, &tail) != 2 || a < 1 ||
        r < 0) {
      return BadRankToken(request.page_token());
    }
    token_attempt = static_cast<int>(a);
    from = r;
  }
  std::unordered_set<int> states(request.states().begin(), request.states().end());
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindLocked(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  if (!job->ranks_loaded) (void)ToProtoLocked(*job, /*detail=*/true, /*with_ranks=*/false);
  Attempt* attempt = job->last();
  if (attempt == nullptr) return OkStatus();
  response->set_attempt(attempt->number);
  if (token_attempt != 0 && token_attempt != attempt->number) {
    return AbortedError("page_token: of attempt " + std::to_string(token_attempt) + "; job " +
                        job->row.job_id + " runs attempt " + std::to_string(attempt->number) +
                        " now (hint: list its ranks again from the first page)");
  }
  // The mesh's own axes, outermost first (pp, dp_replicate, dp_shard, cp, tp).
  const std::array<int, 5> sizes = {job->mesh.pp(), job->mesh.dp_replicate(), job->mesh.dp_shard(),
                                    job->mesh.cp(), job->mesh.tp()};
  std::array<int, 5> fixed = {-1, -1, -1, -1, -1};
  if (request.has_coords()) {
    const v1::MeshCoordsFilter& c = request.coords();
    const char* names[] = {"coords.pp", "coords.dp_replicate", "coords.dp_shard", "coords.cp",
                           "coords.tp"};
    const bool has[] = {c.has_pp(), c.has_dp_replicate(), c.has_dp_shard(), c.has_cp(), c.has_tp()};
    const int values[] = {c.pp(), c.dp_replicate(), c.dp_shard(), c.cp(), c.tp()};
    for (int i = 0; i < 5; ++i) {
      if (!has[i]) continue;
      if (values[i] < 0 || values[i] >= sizes[i]) {
        return InvalidArgumentError(std::string(names[i]) + ": " + std::to_string(values[i]) +
                                    " is outside the mesh (size " + std::to_string(sizes[i]) +
                                    ") (hint: use 0 to " + std::to_string(sizes[i] - 1) + ")");
      }
      fixed[i] = values[i];
    }
    // The list form: each entry an axis of the mesh (in `sizes`' order) and its index.
    const std::array<MeshAxis, 5> order = {MeshAxis::kPp, MeshAxis::kDpReplicate,
                                           MeshAxis::kDpShard, MeshAxis::kCp, MeshAxis::kTp};
    for (int e = 0; e < c.axes_size(); ++e) {
      const v1::MeshAxisCoord& a = c.axes(e);
      const std::string field = "coords.axes[" + std::to_string(e) + "]";
      const std::optional<MeshAxis> axis = MeshAxisFromProto(a.axis());
      const auto at = axis ? std::find(order.begin(), order.end(), *axis) : order.end();
      if (at == order.end()) {
        return InvalidArgumentError(field + ".axis: " + v1::MeshAxis_Name(a.axis()) +
                                    " is not one of the mesh's own axes (hint: pp, dp_replicate, "
                                    "dp_shard, cp or tp)");
      }
      const int i = static_cast<int>(at - order.begin());
      if (a.index() < 0 || a.index() >= sizes[i]) {
        return InvalidArgumentError(field + ".index: " + std::to_string(a.index()) +
                                    " is outside the mesh's " + MeshAxisName(*axis) + " (size " +
                                    std::to_string(sizes[i]) + ") (hint: use 0 to " +
                                    std::to_string(sizes[i] - 1) + ")");
      }
      if (fixed[i] >= 0 && fixed[i] != a.index()) {
        return InvalidArgumentError(field + ": " + MeshAxisName(*axis) + "=" +
                                    std::to_string(a.index()) + " contradicts " + names[i] + "=" +
                                    std::to_string(fixed[i]) +
                                    " (hint: give each axis once, or the same index in both)");
      }
      fixed[i] = a.index();
    }
  }
  const int64_t world = static_cast<int64_t>(attempt->ranks.size());
  // With a worker filter only that worker's ranks are visited (an index built once).
  const std::vector<int>* on_worker = nullptr;
  if (!request.worker().empty()) {
    if (attempt->ranks_by_worker.empty()) {
      for (const Rank& r : attempt->ranks) attempt->ranks_by_worker[r.worker_id].push_back(r.rank);
    }
    auto it = attempt->ranks_by_worker.find(request.worker());
    if (it == attempt->ranks_by_worker.end()) {
      // A worker name: its id from any of its ranks.
      for (const auto& [id, ranks] : attempt->ranks_by_worker) {
        if (!ranks.empty() && attempt->ranks[ranks.front()].worker_name == request.worker()) {
          it = attempt->ranks_by_worker.find(id);
          break;
        }
      }
    }
    if (it == attempt->ranks_by_worker.end()) return OkStatus();  // no rank there
    on_worker = &it->second;
  }
  auto matches = [&](const Rank& r) {
    if (!states.empty() && states.count(r.state) == 0) return false;
    if (fixed[0] >= 0 && r.coords.pp != fixed[0]) return false;
    if (fixed[1] >= 0 && r.coords.dp_replicate != fixed[1]) return false;
    if (fixed[2] >= 0 && r.coords.dp_shard != fixed[2]) return false;
    if (fixed[3] >= 0 && r.coords.cp != fixed[3]) return false;
    if (fixed[4] >= 0 && r.coords.tp != fixed[4]) return false;
    return true;
  };
  size_t bytes = 0;
  auto take = [&](const Rank& r) {
    // Ends the page before it would pass its size or its bytes (at least one rank per page).
    if (response->ranks_size() >= page) return false;
    v1::RankInfo info;
    FillRankInfo(r, job->mesh, &info);
    const size_t size = info.ByteSizeLong() + 4;  // with its tag and length
    if (response->ranks_size() > 0 && bytes + size > config_.max_page_bytes) return false;
    bytes += size;
    *response->add_ranks() = std::move(info);
    return true;
  };
  auto next_token = [&](int64_t rank) {
    response->set_next_page_token("a" + std::to_string(attempt->number) + "r" +
                                  std::to_string(rank));
  };
  if (on_worker != nullptr) {
    auto it = std::lower_bound(on_worker->begin(), on_worker->end(), from);
    for (; it != on_worker->end(); ++it) {
      const Rank& r = attempt->ranks[*it];
      if (!matches(r)) continue;
      if (!take(r)) {
        next_token(*it);
        break;
      }
    }
    return OkStatus();
  }
  for (int64_t g = from; g < world;) {
    if (fixed != std::array<int, 5>{-1, -1, -1, -1, -1}) {
      g = NextMatchingRank(g, sizes, fixed);
      if (g < 0 || g >= world) break;
    }
    const Rank& r = attempt->ranks[static_cast<size_t>(g)];
    if (matches(r) && !take(r)) {
      next_token(g);
      break;
    }
    ++g;
  }
  return OkStatus();
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
  // Kept as the job's message, shown by `status` and `submit --follow` to every token holder:
  // one line of printable text (decision 0031).
  if (!IsPlainText(request.reason())) {
    return InvalidArgumentError(
        "reason: " + QuoteForMessage(request.reason()) +
        " holds control characters (C0, DEL, C1, bidirectional) or invalid UTF-8 (hint: say it "
        "in one line of plain text)");
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
  MESHRUN_RETURN_IF_ERROR(journal_.Commit(txn, Durability::kDurable));
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
  // The number of open streams is bounded by the gRPC adapter (--max-watch-streams and
  // --max-watch-streams-per-caller), which counts each call until it ends.
  const bool keep = !job->terminal() && !request.replay_only();
  const uint64_t from = std::max<uint64_t>(1, request.from_sequence());
  const WatchFilter filter = WatchFilter::FromRequest(request);
  // The log held from replay to AddWatcher: a rank sample published by the ingest path (which
  // does not take mu_) in between would be missed otherwise.
  auto hold = job->events.Hold();
  // Durable events older than the ones in memory come back from StateDb.
  const std::vector<v1::JobEvent> older =
      journal_.StoredEvents(job->row.job_id, from, job->events.first_retained_durable());
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
  if (memory.lines_size() > 0) return memory;
  // Nothing in memory: the coordinator restarted, or the job's events were released. The lines
  // StateDb kept answer instead.
  std::optional<v1::GetJobLogsResponse> stored = journal_.StoredLogs(*job, request);
  return stored ? *std::move(stored) : memory;
}

// ---- Restore ------------------------------------------------------------------------------------

Status JobManager::Load() {
  StateDb* const db = journal_.db();
  if (db == nullptr) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(std::vector<JobRow> rows, db->LoadJobs());
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
    j.row.seq_reserved += JobJournal::kSequenceBlock;
    j.events.set_reserved(j.row.seq_reserved);
    if (j.row.state == v1::JOB_STATE_PENDING) queue_.Add(j.row.seq, job_id, j.device());
    j.ranks_loaded = j.row.attempt == 0;
    if (j.row.state != v1::JOB_STATE_RUNNING && j.row.state != v1::JOB_STATE_PENDING) continue;
    // The attempts a re-mesh ended, which are not restarts (the restart budget and `restarts`
    // leave them out), from their rows.
    MESHRUN_ASSIGN_OR_RETURN(std::vector<AttemptRow> attempts, db->LoadAttempts(job_id));
    for (const AttemptRow& a : attempts) {
      if (a.state == static_cast<int>(AttemptState::kRemeshed)) ++j.remesh_attempts;
    }
    if (j.row.state != v1::JOB_STATE_RUNNING) continue;

    // A running attempt: its ranks keep their slots and wait for their workers' reports.
    MESHRUN_ASSIGN_OR_RETURN(std::vector<RankRecord> ranks,
                             journal_.LoadRanks(job_id, j.row.attempt));
    auto attempt = std::make_unique<Attempt>();
    attempt->number = j.row.attempt;
    for (const AttemptRow& a : attempts) {
      if (a.attempt == j.row.attempt) attempt->started_ms = a.started_ms;
    }
    attempt->aggregator = MetricsIngest::NewAggregator(j.spec, j.mesh.world_size());
    for (Rank& r : ranks) {
      r.confirmed = false;
      if (r.state == v1::RANK_STATE_SUCCEEDED) ++attempt->succeeded;
      attempt->ranks.push_back(std::move(r));
    }
    RecountLocked(*attempt);
    j.attempts[attempt->number] = std::move(attempt);
    j.ranks_loaded = true;
    Attempt& a = *j.last();
    StartIngestLocked(j, a);
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
  return db->Commit(batch, Durability::kDurable);
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
