// CoordinatorService as a pure handler interface (one HandleXxx per RPC of coordinator.proto),
// and CoordinatorServiceImpl, which implements it over the managers. The gRPC adapter
// (grpc_adapter.h) only translates between gRPC and this interface; tests call it directly
// with fake streams.
//
// Unary handlers answer through `done`, which they may call before returning or later from
// another thread (StoreGet with wait). Stream handlers get the stream object and write to it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "common/path_policy.h"
#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/job_manager.h"
#include "coordinator/plan_submission.h"
#include "coordinator/rate_limiter.h"
#include "coordinator/store_manager.h"
#include "coordinator/streams.h"
#include "coordinator/worker_manager.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

using ReplyCallback = std::function<void(const Status&)>;

// What the adapter knows of a StoreGet call beyond its request: whose wait it is (the worker of
// the client certificate, or the peer's host; --max-store-waits-per-worker counts per owner) and
// its cancellation (a parked wait is dropped when the client cancels or goes away).
struct StoreCallContext {
  std::string owner;
  std::shared_ptr<CallCancellation> cancel;
};

class CoordinatorServiceHandler {
 public:
  virtual ~CoordinatorServiceHandler() = default;

  // Client-facing. `caller` names who submits, for the rate limit: the bearer token's
  // identity or the peer's host (see CallerOfPeer); "" when unknown (all such share one bucket).
  virtual void HandleSubmitJob(const v1::SubmitJobRequest& request, const std::string& caller,
                               v1::SubmitJobResponse* response, ReplyCallback done) = 0;
  void HandleSubmitJob(const v1::SubmitJobRequest& request, v1::SubmitJobResponse* response,
                       ReplyCallback done) {
    HandleSubmitJob(request, std::string(), response, std::move(done));
  }
  virtual void HandleGetJob(const v1::GetJobRequest& request, v1::GetJobResponse* response,
                            ReplyCallback done) = 0;
  virtual void HandleListJobs(const v1::ListJobsRequest& request, v1::ListJobsResponse* response,
                              ReplyCallback done) = 0;
  virtual void HandleCancelJob(const v1::CancelJobRequest& request, v1::CancelJobResponse* response,
                               ReplyCallback done) = 0;
  // Writes the events to `stream` and finishes it (now or when the job ends).
  virtual void HandleWatchJob(const v1::WatchJobRequest& request,
                              std::shared_ptr<WatchJobStream> stream) = 0;
  virtual void HandleListWorkers(const v1::ListWorkersRequest& request,
                                 v1::ListWorkersResponse* response, ReplyCallback done) = 0;
  virtual void HandleGetJobLogs(const v1::GetJobLogsRequest& request,
                                v1::GetJobLogsResponse* response, ReplyCallback done) = 0;
  // `meshrun workers drain/undrain` (decision 0056); a handler without it answers UNIMPLEMENTED.
  virtual void HandleDrainWorker(const v1::DrainWorkerRequest& /*request*/,
                                 v1::DrainWorkerResponse* /*response*/, ReplyCallback done) {
    done(Status(StatusCode::kUnimplemented, "DrainWorker: not served here"));
  }
  // A handler without paged ranks answers UNIMPLEMENTED.
  virtual void HandleListRanks(const v1::ListRanksRequest& /*request*/,
                               v1::ListRanksResponse* /*response*/, ReplyCallback done) {
    done(Status(StatusCode::kUnimplemented, "ListRanks: not served here"));
  }

  // Worker-facing. Each message of a session stream, in order; then Closed once.
  virtual void HandleRegisterWorker(const v1::RegisterWorkerRequest& request,
                                    v1::RegisterWorkerResponse* response, ReplyCallback done) = 0;
  virtual void HandleWorkerSessionRequest(const std::shared_ptr<WorkerSessionStream>& stream,
                                          const v1::WorkerSessionRequest& request) = 0;
  virtual void HandleWorkerSessionClosed(const std::shared_ptr<WorkerSessionStream>& stream) = 0;

  // Rendezvous store. `deadline` is the call's own deadline, if it has one.
  virtual void HandleStoreSet(const v1::StoreSetRequest& request, v1::StoreSetResponse* response,
                              ReplyCallback done) = 0;
  virtual void HandleStoreGet(const v1::StoreGetRequest& request, v1::StoreGetResponse* response,
                              std::optional<WallTime> deadline, ReplyCallback done,
                              const StoreCallContext& call = {}) = 0;
  virtual void HandleStoreAdd(const v1::StoreAddRequest& request, v1::StoreAddResponse* response,
                              ReplyCallback done) = 0;
};

// What the handlers check before a manager sees a request (docs/security.md).
struct ServiceOptions {
  PathPolicy paths;       // --data-root, --checkpoint-root: checked at SubmitJob
  RateLimit submit_rate;  // --submit-rate, --submit-burst: SubmitJob per caller
  // --max-ranks-per-report: ranks one `open` or heartbeat may list (a worker runs at most its
  // slots); a longer list ends the session with RESOURCE_EXHAUSTED.
  size_t max_ranks_per_report = 4'096;
  // What SubmitJob plans `parallelism.auto` with for figures the workers did not report (this
  // host's memory, and its GEMM rate when no worker calibrated); memory 0: this host's.
  PlanningHost planning_host;
};

// The handlers over JobManager, WorkerManager and StoreManager: validation of session
// messages, the session protocol (open first, once), the confined paths and the submit rate
// limit, and the glue between managers (a lost worker fails its jobs' attempts). Thread-safe;
// owns no job or worker state itself.
class CoordinatorServiceImpl final : public CoordinatorServiceHandler {
 public:
  CoordinatorServiceImpl(JobManager& jobs, WorkerManager& workers, StoreManager& store,
                         const Clock& clock, ServiceOptions options = {});

  using CoordinatorServiceHandler::HandleSubmitJob;
  void HandleSubmitJob(const v1::SubmitJobRequest& request, const std::string& caller,
                       v1::SubmitJobResponse* response, ReplyCallback done) override;
  void HandleGetJob(const v1::GetJobRequest& request, v1::GetJobResponse* response,
                    ReplyCallback done) override;
  void HandleListJobs(const v1::ListJobsRequest& request, v1::ListJobsResponse* response,
                      ReplyCallback done) override;
  void HandleCancelJob(const v1::CancelJobRequest& request, v1::CancelJobResponse* response,
                       ReplyCallback done) override;
  void HandleWatchJob(const v1::WatchJobRequest& request,
                      std::shared_ptr<WatchJobStream> stream) override;
  void HandleListWorkers(const v1::ListWorkersRequest& request, v1::ListWorkersResponse* response,
                         ReplyCallback done) override;
  void HandleDrainWorker(const v1::DrainWorkerRequest& request, v1::DrainWorkerResponse* response,
                         ReplyCallback done) override;
  void HandleGetJobLogs(const v1::GetJobLogsRequest& request, v1::GetJobLogsResponse* response,
                        ReplyCallback done) override;
  void HandleListRanks(const v1::ListRanksRequest& request, v1::ListRanksResponse* response,
                       ReplyCallback done) override;
  void HandleRegisterWorker(const v1::RegisterWorkerRequest& request,
                            v1::RegisterWorkerResponse* response, ReplyCallback done) override;
  void HandleWorkerSessionRequest(const std::shared_ptr<WorkerSessionStream>& stream,
                                  const v1::WorkerSessionRequest& request) override;
  void HandleWorkerSessionClosed(const std::shared_ptr<WorkerSessionStream>& stream) override;
  void HandleStoreSet(const v1::StoreSetRequest& request, v1::StoreSetResponse* response,
                      ReplyCallback done) override;
  void HandleStoreGet(const v1::StoreGetRequest& request, v1::StoreGetResponse* response,
                      std::optional<WallTime> deadline, ReplyCallback done,
                      const StoreCallContext& call = {}) override;
  void HandleStoreAdd(const v1::StoreAddRequest& request, v1::StoreAddResponse* response,
                      ReplyCallback done) override;

  // Periodic work (the server's ticker): expired leases fail their attempts; the queue is
  // retried; store waits time out.
  void Tick();
  // The RankAssignments of SubmitJob's placements (JobManager::FlushAssignments); every tick.
  void FlushAssignments() { jobs_.FlushAssignments(); }
  // Refuses new calls with UNAVAILABLE and ends every stream and wait.
  void Shutdown();

  // ListWorkers' view, also read by the metrics exporter.
  std::vector<v1::WorkerInfo> Workers() const;

  // The longest checkpoint_saved.path accepted (Linux's PATH_MAX); longer ends the session.
  static constexpr size_t kMaxCheckpointPathBytes = 4096;
  // The largest RegisterWorkerRequest.calibration accepted (its fields take about 40 bytes;
  // the registration is kept in memory and in the state database for as long as the worker).
  static constexpr size_t kMaxCalibrationBytes = 1024;
  // The most samples one RankMetrics may carry (`sample` and `samples` together); more ends
  // the session. A worker batches what queued behind one write: its ranks' samples of a step
  // or a few (decision 0063).
  static constexpr int kMaxMetricsBatch = 256;
  // The largest ListWorkers page (a larger page_size gets this many).
  static constexpr int kMaxWorkersPage = 1000;

 private:
  // INVALID_ARGUMENT naming the first missing field of a session message, or OK.
  static Status ValidateSessionMessage(const v1::WorkerSessionRequest& request);
  // RESOURCE_EXHAUSTED naming --max-ranks-per-report when `kind`.running is too long.
  Status CheckRunningList(const std::string& kind, int ranks) const;
  // Common checks of the Store* requests; NOT_FOUND for an unknown job.
  Status CheckStoreCall(const std::string& job_id, int attempt, const std::string& key) const;

  JobManager& jobs_;
  WorkerManager& workers_;
  StoreManager& store_;
  const Clock& clock_;
  const ServiceOptions options_;
  RateLimiter submit_limiter_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::unordered_set<const WorkerSessionStream*> opened_;  // guarded by mu_
};

}  // namespace meshrun::coordinator
