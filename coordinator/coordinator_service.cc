// CoordinatorServiceImpl: each handler validates what the managers do not, calls one manager
// method and fills the response. The session protocol (open first, exactly once) lives here.
#include "coordinator/coordinator_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_set>

#include "coordinator/proto_time.h"

namespace meshrun::coordinator {
namespace {

Status Stopping() {
  return UnavailableError("the coordinator is stopping (hint: retry with backoff)");
}

Status Missing(const std::string& field) {
  return InvalidArgumentError(field +
                              ": required field is missing or invalid (hint: see the "
                              "message's contract in worker.proto)");
}

std::string Decimal(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

// Checks the paths the spec names against the cluster's roots; relative ones are made absolute
// against their root (decision 0004), the others are left as named (each worker resolves them
// again, symlinks included, before it starts a rank).
Status ConfineSpecPaths(const PathPolicy& paths, v1::JobSpec* proto) {
  JobSpec spec;
  spec.data.train = proto->data().train();
  spec.data.val = proto->data().val();
  spec.data.tokenizer = proto->data().tokenizer();
  spec.model.init_from = proto->model().init_from();
  spec.checkpoint.dir = proto->checkpoint().dir();
  for (const v1::DataSource& source : proto->data().train_sources()) {
    spec.data.train_sources.push_back({source.path(), source.weight()});
  }
  MESHRUN_RETURN_IF_ERROR(paths.ConfineJobSpec(&spec, PathPolicy::Rewrite::kAbsolute));
  for (int i = 0; i < proto->data().train_sources_size(); ++i) {
    const std::string& path = spec.data.train_sources[static_cast<size_t>(i)].path;
    if (proto->data().train_sources(i).path() != path) {
      proto->mutable_data()->mutable_train_sources(i)->set_path(path);
    }
  }
  if (proto->data().train() != spec.data.train) proto->mutable_data()->set_train(spec.data.train);
  if (proto->data().val() != spec.data.val) proto->mutable_data()->set_val(spec.data.val);
  if (proto->data().tokenizer() != spec.data.tokenizer)
    proto->mutable_data()->set_tokenizer(spec.data.tokenizer);
  if (proto->model().init_from() != spec.model.init_from)
    proto->mutable_model()->set_init_from(spec.model.init_from);
  if (proto->checkpoint().dir() != spec.checkpoint.dir)
    proto->mutable_checkpoint()->set_dir(spec.checkpoint.dir);
  return OkStatus();
}

// Unset planning figures are this host's.
ServiceOptions WithPlanningHost(ServiceOptions options) {
  const PlanningHost here = ThisPlanningHost();
  if (options.planning_host.memory_bytes <= 0)
    options.planning_host.memory_bytes = here.memory_bytes;
  if (!options.planning_host.gemm_flops) options.planning_host.gemm_flops = here.gemm_flops;
  return options;
}

}  // namespace

CoordinatorServiceImpl::CoordinatorServiceImpl(JobManager& jobs, WorkerManager& workers,
                                               StoreManager& store, const Clock& clock,
                                               ServiceOptions options)
    : jobs_(jobs),
      workers_(workers),
      store_(store),
      clock_(clock),
      options_(WithPlanningHost(std::move(options))),
      submit_limiter_(clock, options_.submit_rate) {}

// ---- Client-facing ------------------------------------------------------------------------------

void CoordinatorServiceImpl::HandleSubmitJob(const v1::SubmitJobRequest& request,
                                             const std::string& caller,
                                             v1::SubmitJobResponse* response, ReplyCallback done) {
  if (stopping_) return done(Stopping());
  if (std::optional<std::chrono::milliseconds> wait = submit_limiter_.TryAcquire(caller)) {
    const RateLimit& limit = options_.submit_rate;
    return done(ResourceExhaustedError(
        "--submit-rate: more than " + Decimal(limit.per_second) +
        " submissions per second (burst " + Decimal(limit.burst) + ") from " +
        (caller.empty() || caller.rfind(kTokenCallerPrefix, 0) == 0 ? "this caller" : caller) +
        " (hint: retry in " + Decimal(static_cast<double>(wait->count()) / 1000) +
        " s, or ask the operator to raise the coordinator's --submit-rate/--submit-burst)"));
  }
  // The one planning of a submission (decision 0048): parallelism.auto chosen for the
  // registered workers when the spec leaves it unresolved, and the prediction of every spec
  // whose sizes are known here.
  v1::SubmitJobRequest submitted = request;
  if (options_.paths.confined()) {
    Status paths = ConfineSpecPaths(options_.paths, submitted.mutable_spec());
    if (!paths.ok()) return done(paths);
  }
  std::string choice;
  const auto t_plan = std::chrono::steady_clock::now();
  StatusOr<std::vector<v1::WorkerInfo>> workers = Workers();
  const auto t_workers = std::chrono::steady_clock::now();
  Status planned =
      PlanSubmission(workers, options_.planning_host, submitted.mutable_spec(), &choice);
  if (!planned.ok()) return done(planned);
  if (!choice.empty()) spdlog::info("SubmitJob: {}", choice);
  const auto ms = [](auto from, auto to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  };
  spdlog::info("SubmitJob: planning {:.1f} ms (workers {:.1f} ms)",
               ms(t_plan, std::chrono::steady_clock::now()), ms(t_plan, t_workers));
  StatusOr<std::string> id = jobs_.Submit(submitted, caller);
  if (id.ok()) {
    if (request.dry_run()) {
      response->set_placement(*id);
      *response->mutable_spec() = submitted.spec();
    } else {
      response->set_job_id(*id);
    }
  }
  done(id.status());
}

void CoordinatorServiceImpl::HandleGetJob(const v1::GetJobRequest& request,
                                          v1::GetJobResponse* response, ReplyCallback done) {
  if (stopping_) return done(Stopping());
  done(jobs_.Get(request, response));
}

void CoordinatorServiceImpl::HandleListRanks(const v1::ListRanksRequest& request,
                                             v1::ListRanksResponse* response, ReplyCallback done) {
  if (stopping_) return done(Stopping());
  done(jobs_.ListRanks(request, response));
}

void CoordinatorServiceImpl::HandleListJobs(const v1::ListJobsRequest& request,
                                            v1::ListJobsResponse* response, ReplyCallback done) {
  if (stopping_) return done(Stopping());
  StatusOr<v1::ListJobsResponse> list = jobs_.List(request);
  if (list.ok()) *response = std::move(*list);
  done(list.status());
}

void CoordinatorServiceImpl::HandleCancelJob(const v1::CancelJobRequest& request,
                                             v1::CancelJobResponse* response, ReplyCallback done) {
  if (stopping_) return done(Stopping());
  StatusOr<v1::Job> job = jobs_.Cancel(request);
  if (job.ok()) *response->mutable_job() = std::move(*job);
  done(job.status());
}

void CoordinatorServiceImpl::HandleWatchJob(const v1::WatchJobRequest& request,
                                            std::shared_ptr<WatchJobStream> stream) {
  if (stopping_) return stream->Finish(Stopping());
  Status status = jobs_.Watch(request, stream);
  if (!status.ok()) stream->Finish(status);
}

std::vector<v1::WorkerInfo> CoordinatorServiceImpl::Workers() const {
  const std::unordered_map<std::string, int> used = jobs_.SlotsInUse();
  std::vector<v1::WorkerInfo> out;
  for (WorkerSnapshot& s : workers_.List()) {
    v1::WorkerInfo& info = s.info;
    if (info.state() != v1::WORKER_STATE_LOST) {
      auto it = used.find(info.worker_id());
      const int n = it == used.end() ? 0 : it->second;
      info.set_slots_in_use(n);
      info.set_state(n > 0 ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_READY);
    }
    out.push_back(std::move(info));
  }
  return out;
}

void CoordinatorServiceImpl::HandleDrainWorker(const v1::DrainWorkerRequest& request,
                                               v1::DrainWorkerResponse* response,
                                               ReplyCallback done) {
  if (stopping_) return done(Stopping());
  if (request.name().empty()) {
    return done(
        InvalidArgumentError("name: is empty (hint: pass a worker's name from `meshrun workers`)"));
  }
  StatusOr<std::string> id = workers_.SetDrained(request.name(), request.drain());
  if (!id.ok()) return done(id.status());
  for (std::string& job : jobs_.OnWorkerDrained(*id, request.drain())) {
    response->add_jobs(std::move(job));
  }
  for (v1::WorkerInfo& info : Workers()) {
    if (info.worker_id() == *id) *response->mutable_worker() = std::move(info);
  }
  spdlog::info("worker {} {} ({} jobs move off it)", request.name(),
               request.drain() ? "drained" : "undrained", response->jobs_size());
  done(OkStatus());
}

void CoordinatorServiceImpl::HandleListWorkers(const v1::ListWorkersRequest& request,
                                               v1::ListWorkersResponse* response,
                                               ReplyCallback done) {
  if (stopping_) return done(Stopping());
  if (request.page_size() < 0) {
    return done(InvalidArgumentError("page_size: must be ≥ 0, got " +
                                     std::to_string(request.page_size()) +
                                     " (hint: 0 for every worker in one answer)"));
  }
  std::string after;
  if (!request.page_token().empty()) {
    if (request.page_token().rfind("after:", 0) != 0) {
      return done(InvalidArgumentError("page_token: '" + request.page_token().substr(0, 64) +
                                       "' was not issued by this coordinator (hint: leave it "
                                       "empty for the first page)"));
    }
    after = request.page_token().substr(6);
  }
  std::unordered_set<int> states(request.states().begin(), request.states().end());
  // 0: every worker (clients from before paging); else at most kMaxWorkersPage.
  const size_t page = request.page_size() == 0
                          ? SIZE_MAX
                          : static_cast<size_t>(std::min(request.page_size(), kMaxWorkersPage));
  // Workers are read a chunk at a time in name order, their slots asked for that chunk only,
  // until the page is full: a page costs what it holds (plus the workers its filter skips).
  const size_t chunk = page == SIZE_MAX ? SIZE_MAX : std::max<size_t>(page, 64);
  while (true) {
    std::vector<WorkerSnapshot> batch = workers_.List(after, chunk);
    if (batch.empty()) break;
    std::vector<std::string> ids;
    ids.reserve(batch.size());
    for (const WorkerSnapshot& s : batch) ids.push_back(s.info.worker_id());
    const std::vector<int> used = jobs_.SlotsInUseOf(ids);
    bool full = false;
    for (size_t i = 0; i < batch.size(); ++i) {
      v1::WorkerInfo& info = batch[i].info;
      after = info.name();
      if (info.state() != v1::WORKER_STATE_LOST) {
        info.set_slots_in_use(used[i]);
        info.set_state(used[i] > 0 ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_READY);
      }
      if (!states.empty() && !states.count(info.state())) continue;
      if (static_cast<size_t>(response->workers_size()) == page) {
        // One more matches: the next page starts after the last one sent.
        response->set_next_page_token("after:" + response->workers().rbegin()->name());
        full = true;
        break;
      }
      *response->add_workers() = std::move(info);
    }
    if (full || batch.size() < chunk) break;
  }
  done(OkStatus());
}

void CoordinatorServiceImpl::HandleGetJobLogs(const v1::GetJobLogsRequest& request,
                                              v1::GetJobLogsResponse* response,
                                              ReplyCallback done) {
  if (stopping_) return done(Stopping());
  StatusOr<v1::GetJobLogsResponse> logs = jobs_.Logs(request);
  if (logs.ok()) *response = std::move(*logs);
  done(logs.status());
}

// ---- Workers ------------------------------------------------------------------------------------

void CoordinatorServiceImpl::HandleRegisterWorker(const v1::RegisterWorkerRequest& request,
                                                  v1::RegisterWorkerResponse* response,
                                                  ReplyCallback done) {
  if (stopping_) return done(Stopping());
  if (const size_t bytes = request.calibration().ByteSizeLong(); bytes > kMaxCalibrationBytes) {
    return done(
        InvalidArgumentError("calibration: " + std::to_string(bytes) +
                             " bytes, over the limit of " + std::to_string(kMaxCalibrationBytes) +
                             " (hint: send the HostCalibration fields of types.proto only)"));
  }
  StatusOr<WorkerManager::Registered> reg = workers_.Register(request);
  if (!reg.ok()) return done(reg.status());
  *response = reg->response;
  spdlog::info("worker {} registered as {} ({} {} slots at '{}')", request.name(),
               response->worker_id(), request.slots(), request.device(), request.address());
  if (reg->replaced_live) jobs_.OnWorkerReregistered(response->worker_id());
  jobs_.Schedule();
  done(OkStatus());
}

Status CoordinatorServiceImpl::CheckRunningList(const std::string& kind, int ranks) const {
  if (static_cast<size_t>(ranks) <= options_.max_ranks_per_report) return OkStatus();
  return ResourceExhaustedError(
      "--max-ranks-per-report: " + kind + ".running lists " + std::to_string(ranks) +
      " ranks, over the limit of " + std::to_string(options_.max_ranks_per_report) +
      " (hint: a worker lists only the ranks it runs, at most its slots; raise "
      "--max-ranks-per-report on the coordinator for workers with more slots)");
}

Status CoordinatorServiceImpl::ValidateSessionMessage(const v1::WorkerSessionRequest& r) {
  auto rank_fields = [](const std::string& kind, const std::string& job_id, int attempt,
                        int rank) -> Status {
    if (job_id.empty()) return Missing(kind + ".job_id");
    if (attempt < 1) return Missing(kind + ".attempt");
    if (rank < 0) return Missing(kind + ".rank");
    return OkStatus();
  };
  switch (r.kind_case()) {
    case v1::WorkerSessionRequest::kOpen:
    case v1::WorkerSessionRequest::kHeartbeat: return OkStatus();
    case v1::WorkerSessionRequest::kRankStarted: {
      const auto& m = r.rank_started();
      return rank_fields("rank_started", m.job_id(), m.attempt(), m.rank());
    }
    case v1::WorkerSessionRequest::kRankExited: {
      const auto& m = r.rank_exited();
      return rank_fields("rank_exited", m.job_id(), m.attempt(), m.rank());
    }
    case v1::WorkerSessionRequest::kMetrics: {
      const v1::RankMetrics& m = r.metrics();
      // One sample (`sample`), or a batch (`samples`, `sample` then optional: decision 0063).
      if (m.has_sample() || m.samples().empty()) {
        const auto& s = m.sample();
        if (!s.has_rank()) return Missing("metrics.sample.rank");
        MESHRUN_RETURN_IF_ERROR(rank_fields("metrics.sample", s.job_id(), s.attempt(), s.rank()));
      }
      const int total = m.samples_size() + (m.has_sample() ? 1 : 0);
      if (total > kMaxMetricsBatch) {
        return ResourceExhaustedError(
            "metrics.samples: " + std::to_string(total) +
            " samples in one message, over the limit of " + std::to_string(kMaxMetricsBatch) +
            " (hint: a worker batches at most " + std::to_string(kMaxMetricsBatch) +
            " samples per RankMetrics; send the rest in another)");
      }
      for (const v1::MetricsSample& s : m.samples()) {
        if (!s.has_rank()) return Missing("metrics.samples.rank");
        MESHRUN_RETURN_IF_ERROR(rank_fields("metrics.samples", s.job_id(), s.attempt(), s.rank()));
      }
      return OkStatus();
    }
    case v1::WorkerSessionRequest::kLogs:
      for (const v1::LogLine& line : r.logs().lines()) {
        MESHRUN_RETURN_IF_ERROR(
            rank_fields("logs.lines", line.job_id(), line.attempt(), line.rank()));
      }
      return OkStatus();
    case v1::WorkerSessionRequest::kCheckpointSaved: {
      const auto& c = r.checkpoint_saved();
      if (c.path().empty()) return Missing("checkpoint_saved.path");
      if (c.path().size() > kMaxCheckpointPathBytes) {
        return InvalidArgumentError(
            "checkpoint_saved.path: " + std::to_string(c.path().size()) +
            " bytes, over the limit of " + std::to_string(kMaxCheckpointPathBytes) +
            " (hint: a checkpoint folder is a path of at most PATH_MAX bytes)");
      }
      return rank_fields("checkpoint_saved", c.job_id(), c.attempt(), 0);
    }
    default:
      return InvalidArgumentError(
          "kind: the message is empty or of an unknown kind (hint: send one of open, heartbeat, "
          "rank_started, rank_exited, metrics, logs, checkpoint_saved)");
  }
}

void CoordinatorServiceImpl::HandleWorkerSessionRequest(
    const std::shared_ptr<WorkerSessionStream>& stream, const v1::WorkerSessionRequest& request) {
  if (stopping_) return stream->Finish(Stopping());
  bool opened;
  {
    std::lock_guard<std::mutex> lock(mu_);
    opened = opened_.count(stream.get()) > 0;
  }
  if (request.has_open()) {
    if (opened) {
      return stream->Finish(FailedPreconditionError(
          "open: sent twice on one session (hint: send `open` once, as the first message)"));
    }
    if (Status listed = CheckRunningList("open", request.open().running_size()); !listed.ok()) {
      return stream->Finish(listed);
    }
    StatusOr<std::string> id = workers_.OpenSession(request.open(), stream);
    if (!id.ok()) return stream->Finish(id.status());
    {
      std::lock_guard<std::mutex> lock(mu_);
      opened_.insert(stream.get());
    }
    if (Status s = jobs_.OnRunning(*id, request.open().running()); !s.ok()) {
      return stream->Finish(s);
    }
    jobs_.Schedule();
    return;
  }
  if (!opened) {
    return stream->Finish(FailedPreconditionError(
        "open: the first message of a session must be `open` (hint: send open with worker_id "
        "and session_token first)"));
  }
  StatusOr<std::string> id = workers_.Touch(stream.get());
  if (!id.ok()) return stream->Finish(id.status());
  Status valid = ValidateSessionMessage(request);
  if (!valid.ok()) return stream->Finish(valid);
  switch (request.kind_case()) {
    case v1::WorkerSessionRequest::kHeartbeat: {
      Status listed = CheckRunningList("heartbeat", request.heartbeat().running_size());
      if (listed.ok()) listed = jobs_.OnRunning(*id, request.heartbeat().running());
      if (!listed.ok()) return stream->Finish(listed);
      break;
    }
    case v1::WorkerSessionRequest::kRankStarted:
      jobs_.OnRankStarted(*id, request.rank_started());
      break;
    case v1::WorkerSessionRequest::kRankExited:
      jobs_.OnRankExited(*id, request.rank_exited());
      break;
    case v1::WorkerSessionRequest::kMetrics: {
      jobs_.OnRankMetrics(*id, request.metrics());
      // A heartbeat riding on the batch (decision 0070): after its samples, as one of its own.
      if (request.metrics().has_heartbeat()) {
        const v1::Heartbeat& beat = request.metrics().heartbeat();
        Status listed = CheckRunningList("metrics.heartbeat", beat.running_size());
        if (listed.ok()) listed = jobs_.OnRunning(*id, beat.running());
        if (!listed.ok()) return stream->Finish(listed);
      }
      break;
    }
    case v1::WorkerSessionRequest::kLogs: jobs_.OnLogs(*id, request.logs()); break;
    case v1::WorkerSessionRequest::kCheckpointSaved:
      jobs_.OnCheckpointSaved(*id, request.checkpoint_saved());
      break;
    default: break;
  }
}

void CoordinatorServiceImpl::HandleWorkerSessionClosed(
    const std::shared_ptr<WorkerSessionStream>& stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    opened_.erase(stream.get());
  }
  workers_.CloseSession(stream.get());
}

// ---- Store --------------------------------------------------------------------------------------

Status CoordinatorServiceImpl::CheckStoreCall(const std::string& job_id, int attempt,
                                              const std::string& key) const {
  if (stopping_) return Stopping();
  if (job_id.empty())
    return InvalidArgumentError("job_id: is empty (hint: use the job_id of the RankAssignment)");
  if (attempt < 1) {
    return InvalidArgumentError("attempt: must be ≥ 1, got " + std::to_string(attempt) +
                                " (hint: use the attempt of the RankAssignment)");
  }
  if (key.empty()) return InvalidArgumentError("key: is empty (hint: name the key)");
  if (!jobs_.Exists(job_id)) {
    return NotFoundError("job " + job_id +
                         " not found (hint: use the job_id of the RankAssignment)");
  }
  return OkStatus();
}

void CoordinatorServiceImpl::HandleStoreSet(const v1::StoreSetRequest& request,
                                            v1::StoreSetResponse* /*response*/,
                                            ReplyCallback done) {
  Status status = CheckStoreCall(request.job_id(), request.attempt(), request.key());
  if (!status.ok()) return done(status);
  done(store_.Set(request.job_id(), request.attempt(), request.key(), request.value()));
}

void CoordinatorServiceImpl::HandleStoreGet(const v1::StoreGetRequest& request,
                                            v1::StoreGetResponse* response,
                                            std::optional<WallTime> deadline, ReplyCallback done,
                                            const StoreCallContext& call) {
  Status status = CheckStoreCall(request.job_id(), request.attempt(), request.key());
  if (!status.ok()) return done(status);
  std::chrono::milliseconds timeout{0};
  if (request.has_timeout()) {
    timeout = DurationToMillis(request.timeout());
    if (timeout.count() < 0) {
      return done(
          InvalidArgumentError("timeout: is negative (hint: leave it unset for the default)"));
    }
  }
  std::optional<MonoTime> call_deadline;
  if (deadline) {
    call_deadline = clock_.Monotonic() +
                    std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - clock_.Now());
  }
  store_.Get(
      request.job_id(), request.attempt(), request.key(), request.wait(), timeout, call_deadline,
      [response, done = std::move(done)](StatusOr<std::optional<std::string>> result) {
        if (!result.ok()) return done(result.status());
        response->set_found(result->has_value());
        if (result->has_value()) response->set_value(**result);
        done(OkStatus());
      },
      call.owner, call.cancel.get());
}

void CoordinatorServiceImpl::HandleStoreAdd(const v1::StoreAddRequest& request,
                                            v1::StoreAddResponse* response, ReplyCallback done) {
  Status status = CheckStoreCall(request.job_id(), request.attempt(), request.key());
  if (!status.ok()) return done(status);
  StatusOr<int64_t> value = store_.Add(request.job_id(), request.attempt(), request.key(),
                                       request.delta(), request.request_id());
  if (value.ok()) response->set_value(*value);
  done(value.status());
}

// ---- Lifecycle ----------------------------------------------------------------------------------

void CoordinatorServiceImpl::Tick() {
  for (const std::string& id : workers_.ExpireLeases()) {
    spdlog::warn("worker {} missed its lease: LOST", id);
    jobs_.OnWorkerLost(id);
  }
  jobs_.Tick();
  store_.ExpireWaiters();
}

void CoordinatorServiceImpl::Shutdown() {
  stopping_ = true;
  store_.Shutdown();
  jobs_.Shutdown();
  workers_.Shutdown();
}

}  // namespace meshrun::coordinator
