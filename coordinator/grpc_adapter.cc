// CoordinatorGrpcService: unary calls through the default reactor; WatchJob and WorkerSession
// through reactors with a write queue (gRPC allows one write in flight per stream).
#include "coordinator/grpc_adapter.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>

#include "common/tls.h"

namespace meshrun::coordinator {

namespace {

// ---- What the Authorizer needs of a call ----------------------------------------------------

// The "authorization" metadata of the call, nullopt when it has none.
std::optional<std::string_view> AuthorizationHeader(grpc::CallbackServerContext* ctx) {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kAuthorizationHeader);
  if (it == metadata.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

// The subject CN of the peer's client certificate, verified against --tls-ca during the
// handshake; nullopt when the peer presented none (or the connection is plaintext).
std::optional<std::string> PeerCommonName(grpc::CallbackServerContext* ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return std::nullopt;
  for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
    return std::string(cn.data(), cn.size());
  }
  return std::nullopt;
}

// Client API: the bearer token.
Status CheckClient(const Authorizer* auth, grpc::CallbackServerContext* ctx) {
  return auth == nullptr ? OkStatus() : auth->CheckClient(AuthorizationHeader(ctx));
}

// The worker the peer's certificate names ("" without TLS), or UNAUTHENTICATED.
StatusOr<std::string> WorkerIdentity(const Authorizer* auth, grpc::CallbackServerContext* ctx) {
  if (auth == nullptr) return std::string();
  return auth->WorkerIdentity(PeerCommonName(ctx));
}

// Store calls: the certificate's worker must have a rank of (job_id, attempt).
Status CheckStoreCall(const Authorizer* auth, grpc::CallbackServerContext* ctx,
                      const std::string& job_id, int attempt, const std::string& what) {
  if (auth == nullptr) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(std::string identity, WorkerIdentity(auth, ctx));
  return auth->CheckAttempt(identity, job_id, attempt, what);
}

// Session messages: `open` only for the certificate's own worker id, reports only about its
// own attempts. Heartbeats carry nothing to check (ranks they list that are not the worker's
// are stopped by JobManager).
Status CheckSessionMessage(const Authorizer& auth, const std::string& identity,
                           const v1::WorkerSessionRequest& r) {
  switch (r.kind_case()) {
    case v1::WorkerSessionRequest::kOpen: return auth.CheckOpen(identity, r.open().worker_id());
    case v1::WorkerSessionRequest::kRankStarted:
      return auth.CheckAttempt(identity, r.rank_started().job_id(), r.rank_started().attempt(),
                               "rank_started");
    case v1::WorkerSessionRequest::kRankExited:
      return auth.CheckAttempt(identity, r.rank_exited().job_id(), r.rank_exited().attempt(),
                               "rank_exited");
    case v1::WorkerSessionRequest::kMetrics:
      if (r.metrics().has_sample() || r.metrics().samples().empty()) {
        MESHRUN_RETURN_IF_ERROR(auth.CheckAttempt(identity, r.metrics().sample().job_id(),
                                                  r.metrics().sample().attempt(), "metrics"));
      }
      for (int i = 0; i < r.metrics().samples_size(); ++i) {
        const v1::MetricsSample& s = r.metrics().samples(i);
        if (i > 0 && s.attempt() == r.metrics().samples(i - 1).attempt() &&
            s.job_id() == r.metrics().samples(i - 1).job_id()) {
          continue;  // the same attempt as the sample before: checked
        }
        MESHRUN_RETURN_IF_ERROR(auth.CheckAttempt(identity, s.job_id(), s.attempt(), "metrics"));
      }
      return OkStatus();
    case v1::WorkerSessionRequest::kLogs:
      for (const v1::LogLine& line : r.logs().lines()) {
        MESHRUN_RETURN_IF_ERROR(auth.CheckAttempt(identity, line.job_id(), line.attempt(), "logs"));
      }
      return OkStatus();
    case v1::WorkerSessionRequest::kCheckpointSaved:
      return auth.CheckAttempt(identity, r.checkpoint_saved().job_id(),
                               r.checkpoint_saved().attempt(), "checkpoint_saved");
    default: return OkStatus();
  }
}

// Runs `call(done)` and finishes the default reactor exactly once with what `done` reports;
// an exception (never expected: handlers return Status) becomes INTERNAL.
template <typename Call>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Call&& call) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  ReplyCallback done = [reactor, finished](const Status& status) {
    if (!finished->exchange(true)) reactor->Finish(ToGrpcStatus(status));
  };
  try {
    call(done);
  } catch (const std::exception& e) {
    spdlog::error("handler threw: {}", e.what());
    done(InternalError(std::string("unexpected failure: ") + e.what()));
  }
  return reactor;
}

}  // namespace

// ---- LingerTimer --------------------------------------------------------------------------------

LingerTimer::LingerTimer(std::chrono::microseconds linger)
    : linger_(linger), thread_([this] { Run(); }) {}

LingerTimer::~LingerTimer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void LingerTimer::After(std::weak_ptr<Lingering> stream) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = due_.empty();
    due_.push_back({std::chrono::steady_clock::now() + linger_, std::move(stream)});
  }
  if (was_empty) cv_.notify_one();
}

void LingerTimer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (due_.empty()) {
      cv_.wait(lock);
      continue;
    }
    // Every deadline is now + linger_, so the queue is in deadline order.
    const auto when = due_.front().when;
    if (std::chrono::steady_clock::now() < when) {
      cv_.wait_until(lock, when);
      continue;
    }
    std::weak_ptr<Lingering> weak = std::move(due_.front().stream);
    due_.pop_front();
    lock.unlock();
    if (std::shared_ptr<Lingering> stream = weak.lock()) stream->LingerEnded();
    lock.lock();
  }
}

namespace {

// Folds the responses queued behind `into` into it (WatchJobRequest.batch_events), up to
// kMaxCoalescedBytes of events; returns how many it took from the front of `rest`.
constexpr size_t kMaxCoalescedBytes = 1u << 20;
size_t CoalesceWatchResponses(v1::WatchJobResponse& into, std::deque<v1::WatchJobResponse>& rest,
                              size_t first) {
  size_t bytes = into.ByteSizeLong();
  size_t taken = 0;
  for (size_t i = first; i < rest.size(); ++i) {
    v1::WatchJobResponse& r = rest[i];
    const size_t more = r.ByteSizeLong();
    if (bytes + more > kMaxCoalescedBytes) break;
    bytes += more;
    *into.add_more_events() = std::move(*r.mutable_event());
    for (v1::JobEvent& e : *r.mutable_more_events()) *into.add_more_events() = std::move(e);
    ++taken;
  }
  return taken;
}

// The write side shared by both stream reactors: a queue drained one StartWrite at a time,
// and a Finish that waits for the queue to drain. `Reactor` provides StartWrite and Finish.
// `coalesce` (WatchJob with batch_events): what queued behind a write in flight goes out in
// one response when that write is done, one sendmsg instead of one each (decision 0063).
// `linger` (set with coalesce): an event that finds no write in flight waits for the events
// behind it until `linger` calls LingerEnded (LingerTimer: a few milliseconds later) or
// kLingerFlushResponses are queued, so that a watcher of 32,768 ranks' samples gets a write
// every few milliseconds instead of one per worker message (decision 0073).
inline constexpr size_t kLingerFlushResponses = 512;

template <typename Reactor, typename Response>
class WriteQueue {
 public:
  WriteQueue(Reactor* reactor, size_t max_queue, bool coalesce = false,
             std::function<void()> linger = nullptr)
      : reactor_(reactor), max_queue_(max_queue), coalesce_(coalesce), linger_(std::move(linger)) {}

  // False once finishing; ends the stream with UNAVAILABLE when the queue overflows.
  template <typename Message>
  bool Send(Message&& message) {
    const Response* start = nullptr;
    bool overflow = false;
    bool linger = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finishing_) return false;
      if (queue_.size() >= max_queue_) {
        overflow = true;
      } else {
        queue_.push_back(std::forward<Message>(message));
        if (!writing_) {
          if (!linger_) {
            writing_ = true;
            start = &queue_.front();
          } else if (lingering_ && queue_.size() >= kLingerFlushResponses) {
            lingering_ = false;  // the timer, when it comes, finds nothing to do
            start = StartCoalescedLocked();
          } else if (!lingering_) {
            lingering_ = linger = true;
          }
        }
      }
    }
    if (overflow) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the client fell too far behind (hint: reconnect from the last "
                          "sequence seen + 1)"));
      return false;
    }
    if (linger) linger_();
    if (start != nullptr) reactor_->StartWrite(start);
    return true;
  }

  // The linger is over: what queued goes out in one response (and the stream finishes after
  // it when Finish came meanwhile).
  void LingerEnded() {
    const Response* start = nullptr;
    bool finish = false;
    grpc::Status final;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!lingering_) return;
      lingering_ = false;
      if (writing_) return;
      if (!queue_.empty()) {
        start = StartCoalescedLocked();
      } else if (finishing_ && !finish_called_) {
        finish_called_ = finish = true;
        final = final_;
      }
    }
    if (start != nullptr) reactor_->StartWrite(start);
    if (finish) reactor_->Finish(final);
  }

  void Finish(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finishing_) return;
      finishing_ = true;
      final_ = status;
      // OnWriteDone finishes once the queue drains; LingerEnded writes what lingers first.
      if (writing_ || lingering_) return;
      finish_called_ = true;
    }
    reactor_->Finish(status);
  }

  void OnWriteDone(bool ok) {
    const Response* next = nullptr;
    bool finish = false;
    bool linger = false;
    grpc::Status final;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      if (!ok) {
        // The client is gone: drop the rest and end the call.
        queue_.clear();
        if (!finishing_) {
          finishing_ = true;
          final_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        }
      }
      writing_ = false;  // and lingering_ is false: never both
      if (queue_.empty()) {
        if (finishing_ && !finish_called_) {
          finish_called_ = finish = true;
          final = final_;
        }
      } else if (linger_ && !finishing_ && queue_.size() < kLingerFlushResponses) {
        lingering_ = linger = true;
      } else {
        next = StartCoalescedLocked();
      }
    }
    if (linger) linger_();
    if (next != nullptr) reactor_->StartWrite(next);
    if (finish) reactor_->Finish(final);
  }

  bool finishing() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finishing_;
  }

 private:
  // Marks a write in flight and folds what queued behind the front into it (with coalesce);
  // returns the response to write. The queue is not empty.
  const Response* StartCoalescedLocked() {
    writing_ = true;
    if constexpr (std::is_same_v<Response, v1::WatchJobResponse>) {
      if (coalesce_ && queue_.size() > 1) {
        const size_t taken = CoalesceWatchResponses(queue_.front(), queue_, 1);
        queue_.erase(queue_.begin() + 1, queue_.begin() + 1 + static_cast<long>(taken));
      }
    }
    return &queue_.front();
  }

  Reactor* const reactor_;
  const size_t max_queue_;
  const bool coalesce_;
  const std::function<void()> linger_;  // empty: every event is written at once
  mutable std::mutex mu_;
  std::deque<Response> queue_;  // front is in flight while writing_
  bool writing_ = false;
  bool lingering_ = false;  // queued events wait for LingerEnded (never while writing_)
  bool finishing_ = false;
  bool finish_called_ = false;
  grpc::Status final_;
};

// ---- WatchJob -----------------------------------------------------------------------------------

class WatchReactor;

// The handler's view of one WatchJob call. Outlives the reactor when a manager still holds it;
// after OnDone every Send returns false.
class WatchStream final : public WatchJobStream,
                          public LingerTimer::Lingering,
                          public std::enable_shared_from_this<WatchStream> {
 public:
  // `timer` null: no linger (every event written at once).
  WatchStream(WatchReactor* reactor, size_t max_queue, bool coalesce, LingerTimer* timer);
  void LingerEnded() override { queue_.LingerEnded(); }
  bool Send(const v1::WatchJobResponse& message) override;
  bool Send(v1::WatchJobResponse&& message) override;
  void Finish(const Status& status) override;
  void OnWriteDone(bool ok) { queue_.OnWriteDone(ok); }
  void FinishGrpc(const grpc::Status& status) { queue_.Finish(status); }
  bool ended() const override { return queue_.finishing(); }

 private:
  WriteQueue<WatchReactor, v1::WatchJobResponse> queue_;
};

class WatchReactor final : public grpc::ServerWriteReactor<v1::WatchJobResponse> {
 public:
  // `allowed`: the Authorizer's verdict; the call ends with it at once when it is not OK.
  // Otherwise the call is in `registry` (with its header) until OnDone, so that revoking its
  // token ends it.
  // `caller` (the token, or the peer's host) is what --max-watch-streams-per-caller counts.
  WatchReactor(CoordinatorServiceHandler& handler, const v1::WatchJobRequest& request,
               const AdapterLimits& limits, const Status& allowed, WatchRegistry& registry,
               std::optional<std::string> authorization, const std::string& caller,
               LingerTimer* timer)
      : stream_(std::make_shared<WatchStream>(this, limits.max_watch_queue, request.batch_events(),
                                              timer)),
        registry_(registry) {
    if (!allowed.ok()) {
      stream_->Finish(allowed);
      return;
    }
    std::weak_ptr<WatchStream> weak = stream_;
    StatusOr<uint64_t> registered = registry_.Add(
        std::move(authorization), caller,
        [weak](const Status& why) {
          if (std::shared_ptr<WatchStream> s = weak.lock()) s->Finish(why);
        },
        limits.max_watch_streams, limits.max_watch_streams_per_caller);
    if (!registered.ok()) {
      stream_->Finish(registered.status());
      return;
    }
    registered_ = *registered;
    try {
      handler.HandleWatchJob(request, stream_);
    } catch (const std::exception& e) {
      stream_->Finish(InternalError(std::string("unexpected failure: ") + e.what()));
    }
  }
  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  // The client cancelled or went away: gRPC tells at once, so the stream's slot is freed now,
  // not at the job's next event.
  void OnCancel() override {
    stream_->FinishGrpc(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  void OnDone() override {
    if (registered_ != 0) registry_.Remove(registered_);
    delete this;
  }

 private:
  std::shared_ptr<WatchStream> stream_;
  WatchRegistry& registry_;
  uint64_t registered_ = 0;
};

WatchStream::WatchStream(WatchReactor* reactor, size_t max_queue, bool coalesce, LingerTimer* timer)
    : queue_(reactor, max_queue, coalesce,
             coalesce && timer != nullptr
                 ? std::function<void()>([this, timer] { timer->After(weak_from_this()); })
                 : nullptr) {}
bool WatchStream::Send(const v1::WatchJobResponse& message) {
  return queue_.Send(message);
}
bool WatchStream::Send(v1::WatchJobResponse&& message) {
  return queue_.Send(std::move(message));
}
void WatchStream::Finish(const Status& status) {
  queue_.Finish(ToGrpcStatus(status));
}

// ---- WorkerSession ------------------------------------------------------------------------------

class SessionReactor;

class SessionStream final : public WorkerSessionStream {
 public:
  SessionStream(SessionReactor* reactor, size_t max_queue, std::string peer)
      : queue_(reactor, max_queue), peer_(std::move(peer)) {}
  bool Send(const v1::WorkerSessionResponse& message) override { return queue_.Send(message); }
  void Finish(const Status& status) override { queue_.Finish(ToGrpcStatus(status)); }
  std::string Peer() const override { return peer_; }
  void OnWriteDone(bool ok) { queue_.OnWriteDone(ok); }
  void FinishGrpc(const grpc::Status& status) { queue_.Finish(status); }
  bool finishing() const { return queue_.finishing(); }

 private:
  WriteQueue<SessionReactor, v1::WorkerSessionResponse> queue_;
  const std::string peer_;
};

class SessionReactor final
    : public grpc::ServerBidiReactor<v1::WorkerSessionRequest, v1::WorkerSessionResponse> {
 public:
  // `auth` null: no checks. `identity`: the worker the client certificate names ("" without
  // TLS), or why the peer is not authenticated (the stream then ends at once).
  SessionReactor(CoordinatorServiceHandler& handler, size_t max_queue, std::string peer,
                 const Authorizer* auth, StatusOr<std::string> identity)
      : handler_(handler),
        stream_(std::make_shared<SessionStream>(this, max_queue, std::move(peer))),
        auth_(auth != nullptr && auth->tls() ? auth : nullptr) {
    if (!identity.ok()) {
      stream_->FinishGrpc(ToGrpcStatus(identity.status()));
      return;
    }
    identity_ = std::move(identity).value();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker closed its side or the connection broke.
      stream_->FinishGrpc(grpc::Status::OK);
      return;
    }
    if (auth_ != nullptr) {
      Status allowed = CheckSessionMessage(*auth_, identity_, request_);
      if (!allowed.ok()) {
        spdlog::warn("worker session from {} ({}): {}", stream_->Peer(), identity_,
                     allowed.message());
        stream_->FinishGrpc(ToGrpcStatus(allowed));
        return;
      }
    }
    try {
      handler_.HandleWorkerSessionRequest(stream_, request_);
    } catch (const std::exception& e) {
      spdlog::error("session handler threw: {}", e.what());
      stream_->Finish(InternalError(std::string("unexpected failure: ") + e.what()));
    }
    if (!stream_->finishing()) StartRead(&request_);
  }
  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override {
    stream_->FinishGrpc(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the worker"));
  }
  void OnDone() override {
    handler_.HandleWorkerSessionClosed(stream_);
    delete this;
  }

 private:
  CoordinatorServiceHandler& handler_;
  std::shared_ptr<SessionStream> stream_;
  const Authorizer* const auth_;  // null: no checks (no TLS, or no Authorizer)
  std::string identity_;
  v1::WorkerSessionRequest request_;
};

// ---- StoreGet ----------------------------------------------------------------------------------

// A unary reactor that tells the handler when the client cancels or goes away, so that a
// parked wait is dropped at once (StoreManager) rather than at its timeout.
class StoreGetReactor final : public grpc::ServerUnaryReactor {
 public:
  StoreGetReactor() : cancel_(std::make_shared<CallCancellation>()) {}
  // Finishes the call once; later calls do nothing (and do not touch the reactor).
  ReplyCallback Done() {
    auto finished = std::make_shared<std::atomic<bool>>(false);
    return [this, finished](const Status& status) {
      if (!finished->exchange(true)) Finish(ToGrpcStatus(status));
    };
  }
  const std::shared_ptr<CallCancellation>& cancellation() const { return cancel_; }
  void OnCancel() override { cancel_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<CallCancellation> cancel_;
};

}  // namespace

// ---- Unary RPCs ---------------------------------------------------------------------------------

// Client API: the bearer token is checked before the handler runs.
#define MESHRUN_CLIENT_UNARY(Method)                                                           \
  grpc::ServerUnaryReactor* CoordinatorGrpcService::Method(grpc::CallbackServerContext* ctx,   \
                                                           const v1::Method##Request* request, \
                                                           v1::Method##Response* response) {   \
    return Unary(ctx, [&](ReplyCallback done) {                                                \
      Status allowed = CheckClient(auth_, ctx);                                                \
      if (!allowed.ok()) return done(allowed);                                                 \
      handler_.Handle##Method(*request, response, std::move(done));                            \
    });                                                                                        \
  }

MESHRUN_CLIENT_UNARY(GetJob)
MESHRUN_CLIENT_UNARY(ListJobs)
MESHRUN_CLIENT_UNARY(CancelJob)
MESHRUN_CLIENT_UNARY(ListWorkers)
MESHRUN_CLIENT_UNARY(GetJobLogs)
MESHRUN_CLIENT_UNARY(ListRanks)
MESHRUN_CLIENT_UNARY(DrainWorker)
#undef MESHRUN_CLIENT_UNARY

// SubmitJob also names its caller for the rate limit: the accepted bearer token (parsed and
// hashed, never shown) with --token-file, else the peer's host (Authorizer::ClientCaller).
grpc::ServerUnaryReactor* CoordinatorGrpcService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                            const v1::SubmitJobRequest* request,
                                                            v1::SubmitJobResponse* response) {
  return Unary(ctx, [&](ReplyCallback done) {
    Status allowed = CheckClient(auth_, ctx);
    if (!allowed.ok()) return done(allowed);
    const std::string caller = auth_ != nullptr
                                   ? auth_->ClientCaller(AuthorizationHeader(ctx), ctx->peer())
                                   : CallerOfPeer(ctx->peer());
    handler_.HandleSubmitJob(*request, caller, response, std::move(done));
  });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::RegisterWorker(
    grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  return Unary(ctx, [&](ReplyCallback done) {
    StatusOr<std::string> identity = WorkerIdentity(auth_, ctx);
    if (!identity.ok()) return done(identity.status());
    if (auth_ != nullptr) {
      Status allowed = auth_->CheckRegister(*identity, request->name());
      if (!allowed.ok()) return done(allowed);
    }
    handler_.HandleRegisterWorker(*request, response, std::move(done));
  });
}

// Store calls: the peer's certificate must name a worker with a rank of the attempt.
#define MESHRUN_STORE_UNARY(Method)                                                                \
  grpc::ServerUnaryReactor* CoordinatorGrpcService::Method(grpc::CallbackServerContext* ctx,       \
                                                           const v1::Method##Request* request,     \
                                                           v1::Method##Response* response) {       \
    return Unary(ctx, [&](ReplyCallback done) {                                                    \
      Status allowed = CheckStoreCall(auth_, ctx, request->job_id(), request->attempt(), #Method); \
      if (!allowed.ok()) return done(allowed);                                                     \
      handler_.Handle##Method(*request, response, std::move(done));                                \
    });                                                                                            \
  }

MESHRUN_STORE_UNARY(StoreSet)
MESHRUN_STORE_UNARY(StoreAdd)
#undef MESHRUN_STORE_UNARY

grpc::ServerUnaryReactor* CoordinatorGrpcService::StoreGet(grpc::CallbackServerContext* ctx,
                                                           const v1::StoreGetRequest* request,
                                                           v1::StoreGetResponse* response) {
  std::optional<WallTime> deadline;
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = ctx->deadline();
  }
  auto* reactor = new StoreGetReactor();
  ReplyCallback done = reactor->Done();
  try {
    StoreCallContext call;
    call.cancel = reactor->cancellation();
    // Whose wait it is, for --max-store-waits-per-worker: the certificate's worker, else the
    // peer's host.
    std::string identity;
    if (auth_ != nullptr) {
      StatusOr<std::string> worker = WorkerIdentity(auth_, ctx);
      if (!worker.ok()) {
        done(worker.status());
        return reactor;
      }
      identity = *worker;
      Status allowed =
          auth_->CheckAttempt(identity, request->job_id(), request->attempt(), "StoreGet");
      if (!allowed.ok()) {
        done(allowed);
        return reactor;
      }
    }
    call.owner = identity.empty() ? CallerOfPeer(ctx->peer()) : "worker " + identity;
    handler_.HandleStoreGet(*request, response, deadline, done, call);
  } catch (const std::exception& e) {
    spdlog::error("handler threw: {}", e.what());
    done(InternalError(std::string("unexpected failure: ") + e.what()));
  }
  return reactor;
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* CoordinatorGrpcService::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* request) {
  std::optional<std::string> authorization;
  if (std::optional<std::string_view> h = AuthorizationHeader(ctx)) authorization.emplace(*h);
  Status allowed = CheckClient(auth_, ctx);
  const std::string caller = !allowed.ok()      ? std::string()
                             : auth_ != nullptr ? auth_->ClientCaller(authorization, ctx->peer())
                                                : CallerOfPeer(ctx->peer());
  return new WatchReactor(handler_, *request, limits_, allowed, watches_, std::move(authorization),
                          caller, linger_.get());
}

size_t CoordinatorGrpcService::RecheckWatches() {
  if (auth_ == nullptr || !auth_->tokens_required()) return 0;
  return watches_.Recheck([this](const std::optional<std::string_view>& authorization) {
    Status s = auth_->CheckClient(authorization);
    if (s.ok()) return s;
    return Status(s.code(),
                  "authorization: the token this WatchJob stream was opened with is "
                  "no longer accepted (it was removed from the coordinator's "
                  "--token-file) (hint: export MESHRUN_TOKEN=<a current token>)");
  });
}

// ---- WatchRegistry ------------------------------------------------------------------------------

StatusOr<uint64_t> WatchRegistry::Add(std::optional<std::string> authorization,
                                      const std::string& caller, Stop stop, size_t max_total,
                                      size_t max_per_caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.size() >= max_total) {
    return ResourceExhaustedError(
        "--max-watch-streams: " + std::to_string(entries_.size()) +
        " WatchJob streams are open, the coordinator's limit (hint: retry later, or ask the "
        "operator to raise --max-watch-streams)");
  }
  size_t& mine = by_caller_[caller];
  if (mine >= max_per_caller) {
    return ResourceExhaustedError(
        "--max-watch-streams-per-caller: this caller (token, or host without tokens) already "
        "has " +
        std::to_string(mine) +
        " WatchJob streams open, the coordinator's limit per caller (hint: end some `--follow` "
        "or watch clients, or ask the operator to raise --max-watch-streams-per-caller)");
  }
  ++mine;
  const uint64_t id = next_++;
  entries_.emplace(id, Entry{std::move(authorization), caller, std::move(stop)});
  return id;
}

void WatchRegistry::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  auto c = by_caller_.find(it->second.caller);
  if (c != by_caller_.end() && --c->second == 0) by_caller_.erase(c);
  entries_.erase(it);
}

size_t WatchRegistry::Recheck(const Check& check) {
  std::vector<std::pair<Stop, Status>> stop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      std::optional<std::string_view> header;
      if (it->second.authorization) header = *it->second.authorization;
      Status s = check(header);
      if (s.ok()) {
        ++it;
        continue;
      }
      stop.emplace_back(std::move(it->second.stop), std::move(s));
      auto c = by_caller_.find(it->second.caller);
      if (c != by_caller_.end() && --c->second == 0) by_caller_.erase(c);
      it = entries_.erase(it);
    }
  }
  for (auto& [fn, why] : stop) fn(why);
  return stop.size();
}

size_t WatchRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t WatchRegistry::count_of(const std::string& caller) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_caller_.find(caller);
  return it == by_caller_.end() ? 0 : it->second;
}

grpc::ServerBidiReactor<v1::WorkerSessionRequest, v1::WorkerSessionResponse>*
CoordinatorGrpcService::WorkerSession(grpc::CallbackServerContext* ctx) {
  return new SessionReactor(handler_, limits_.max_session_queue, ctx->peer(), auth_,
                            WorkerIdentity(auth_, ctx));
}

}  // namespace meshrun::coordinator
