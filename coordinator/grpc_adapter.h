// The thin gRPC adapter: CoordinatorService's callback API turned into calls of the pure
// handler interface (coordinator_service.h). No logic beyond translation: statuses, the write
// queues behind WatchJobStream and WorkerSessionStream, the call deadline of StoreGet, and
// what the Authorizer (auth.h) needs of a call: its bearer token and its client certificate.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "common/status.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator_service.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "rpc/grpc_status.h"

namespace meshrun::coordinator {

struct AdapterLimits {
  // Events queued for one WatchJob client before it counts as fallen behind (UNAVAILABLE).
  size_t max_watch_queue = 100'000;
  // Messages queued for one worker's session before the stream is ended (UNAVAILABLE); the
  // worker reopens and its outbox resumes.
  size_t max_session_queue = 1'000'000;
  // Open WatchJob streams, all callers together (--max-watch-streams) and of one caller: one
  // bearer token, or one peer host without --token-file (--max-watch-streams-per-caller). A
  // stream's slot is freed as soon as its call ends (client cancel or disconnect included).
  size_t max_watch_streams = 1'024;
  size_t max_watch_streams_per_caller = 128;
  // How long an event for a WatchJob client with batch_events waits for the events behind it
  // before it is written (0: written at once, as without batch_events): one write per linger
  // instead of one per event (decision 0073).
  std::chrono::microseconds watch_linger{5'000};
};

// The open WatchJob calls and the `authorization` header each was accepted with, so that a
// token taken out of --token-file (SIGHUP) also ends the streams opened with it. Thread-safe.
class WatchRegistry {
 public:
  using Stop = std::function<void(const Status&)>;
  using Check = std::function<Status(const std::optional<std::string_view>& authorization)>;
  // Registers one stream of `caller`; RESOURCE_EXHAUSTED (naming the flag) when `max_total`
  // streams are open, or `max_per_caller` of this caller.
  StatusOr<uint64_t> Add(std::optional<std::string> authorization, const std::string& caller,
                         Stop stop, size_t max_total, size_t max_per_caller);
  void Remove(uint64_t id);
  // Calls `stop` (outside the lock) of every watch whose header `check` no longer accepts.
  // Returns how many were stopped.
  size_t Recheck(const Check& check);
  size_t size() const;
  size_t count_of(const std::string& caller) const;

 private:
  struct Entry {
    std::optional<std::string> authorization;
    std::string caller;
    Stop stop;
  };
  mutable std::mutex mu_;
  uint64_t next_ = 1;
  std::map<uint64_t, Entry> entries_;                  // guarded by mu_
  std::unordered_map<std::string, size_t> by_caller_;  // open entries per caller, guarded by mu_
};

// Ends the linger of WatchJob streams with batch_events (decision 0073): one thread wakes each
// lingering stream `linger` after it asked, so that the events that queued meanwhile go out in
// one write. A stream gone by then is skipped. Thread-safe.
class LingerTimer {
 public:
  class Lingering {
   public:
    virtual ~Lingering() = default;
    virtual void LingerEnded() = 0;
  };
  explicit LingerTimer(std::chrono::microseconds linger);
  ~LingerTimer();
  LingerTimer(const LingerTimer&) = delete;
  LingerTimer& operator=(const LingerTimer&) = delete;

  // Calls who->LingerEnded() on the timer's thread `linger` from now, if `who` still lives.
  void After(std::weak_ptr<Lingering> who);

 private:
  struct Due {
    std::chrono::steady_clock::time_point when;
    std::weak_ptr<Lingering> stream;
  };
  void Run();

  const std::chrono::microseconds linger_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Due> due_;  // in deadline order (every one is its request's time + linger_)
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

class CoordinatorGrpcService final : public v1::CoordinatorService::CallbackService {
 public:
  // `auth` null: every call is allowed (tests of the handler path).
  CoordinatorGrpcService(CoordinatorServiceHandler& handler, AdapterLimits limits,
                         const Authorizer* auth = nullptr)
      : handler_(handler),
        limits_(limits),
        auth_(auth),
        linger_(limits.watch_linger.count() > 0 ? std::make_unique<LingerTimer>(limits.watch_linger)
                                                : nullptr) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* ctx,
                                        const v1::DrainWorkerRequest* request,
                                        v1::DrainWorkerResponse* response) override;
  grpc::ServerUnaryReactor* GetJobLogs(grpc::CallbackServerContext* ctx,
                                       const v1::GetJobLogsRequest* request,
                                       v1::GetJobLogsResponse* response) override;
  grpc::ServerUnaryReactor* ListRanks(grpc::CallbackServerContext* ctx,
                                      const v1::ListRanksRequest* request,
                                      v1::ListRanksResponse* response) override;
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerBidiReactor<v1::WorkerSessionRequest, v1::WorkerSessionResponse>* WorkerSession(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* ctx,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* ctx,
                                     const v1::StoreGetRequest* request,
                                     v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* ctx,
                                     const v1::StoreAddRequest* request,
                                     v1::StoreAddResponse* response) override;

  // Ends, with UNAUTHENTICATED, the WatchJob streams whose token is no longer accepted (call
  // after Authorizer::ReloadTokens). Returns how many ended.
  size_t RecheckWatches();
  // Open WatchJob calls (all callers).
  size_t watch_count() const { return watches_.size(); }

 private:
  CoordinatorServiceHandler& handler_;
  const AdapterLimits limits_;
  const Authorizer* const auth_;
  WatchRegistry watches_;
  std::unique_ptr<LingerTimer> linger_;  // null: no linger
};

}  // namespace meshrun::coordinator
