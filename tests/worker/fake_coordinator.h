// An in-process fake of CoordinatorService for the worker's tests: RegisterWorker,
// WorkerSession (records every up message; sends what a test queues down) and the three store
// RPCs over a map per (job, attempt). Served by a real gRPC server on a loopback port, so the
// code under test runs its real channel and stream code. Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun::testing {

class FakeCoordinator final : public v1::CoordinatorService::Service {
 public:
  using Clock = std::chrono::steady_clock;

  // Lease and heartbeat it grants.
  std::chrono::milliseconds lease{3000};
  std::chrono::milliseconds heartbeat{100};

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (request->name().empty() || request->slots() < 1) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "name: empty or slots < 1");
    }
    const std::string id = "w" + std::to_string(++next_id_);
    tokens_[id] = "token-" + id;
    registrations_.push_back(*request);
    response->set_worker_id(id);
    response->set_session_token(tokens_[id]);
    SetDuration(response->mutable_lease_ttl(), lease);
    SetDuration(response->mutable_heartbeat_interval(), heartbeat);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status WorkerSession(grpc::ServerContext* ctx,
                             grpc::ServerReaderWriter<v1::WorkerSessionResponse,
                                                      v1::WorkerSessionRequest>* stream) override {
    v1::WorkerSessionRequest first;
    if (!stream->Read(&first)) return grpc::Status::OK;
    if (!first.has_open()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "first message is not open");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = tokens_.find(first.open().worker_id());
      if (it == tokens_.end()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker_id");
      }
      if (it->second != first.open().session_token()) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token");
      }
      opens_.push_back(first.open());
      ++open_sessions_;
    }
    cv_.notify_all();
    v1::WorkerSessionResponse accepted;
    SetDuration(accepted.mutable_accepted()->mutable_lease_ttl(), lease);
    SetDuration(accepted.mutable_accepted()->mutable_heartbeat_interval(), heartbeat);
    accepted.mutable_accepted()->set_metrics_batches(metrics_batches);
    accepted.mutable_accepted()->set_heartbeat_with_metrics(heartbeat_with_metrics);
    stream->Write(accepted);
    bool done = false;
    std::thread writer([&] {
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return done || !down_.empty(); });
        if (done || ctx->IsCancelled()) return;
        while (!down_.empty()) {
          v1::WorkerSessionResponse m = std::move(down_.front());
          down_.pop_front();
          lock.unlock();
          stream->Write(m);
          lock.lock();
        }
      }
    });
    v1::WorkerSessionRequest m;
    while (stream->Read(&m)) {
      std::lock_guard<std::mutex> lock(mu_);
      up_.push_back(m);
      cv_.notify_all();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = true;
      --open_sessions_;
    }
    cv_.notify_all();
    writer.join();
    return grpc::Status::OK;
  }

  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* r,
                        v1::StoreSetResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status s = CheckScope(r->job_id(), r->attempt()); !s.ok()) return s;
    if (grpc::Status s = CancelStoreCall(); !s.ok()) return s;
    store_[Scope(r->job_id(), r->attempt())][r->key()] = r->value();
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* r,
                        v1::StoreGetResponse* response) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status s = CheckScope(r->job_id(), r->attempt()); !s.ok()) return s;
    if (grpc::Status s = CancelStoreCall(); !s.ok()) return s;
    ++store_gets_;
    auto& space = store_[Scope(r->job_id(), r->attempt())];
    if (!r->wait()) {
      auto it = space.find(r->key());
      response->set_found(it != space.end());
      if (it != space.end()) response->set_value(it->second);
      return grpc::Status::OK;
    }
    std::chrono::milliseconds timeout(r->timeout().seconds() * 1000 +
                                      r->timeout().nanos() / 1000000);
    if (timeout.count() <= 0) timeout = std::chrono::milliseconds(1000);
    timeout = std::min(timeout, max_wait);
    const bool found = cv_.wait_for(
        lock, timeout, [&] { return ctx->IsCancelled() || space.count(r->key()) > 0; });
    if (!found || space.count(r->key()) == 0) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "key " + r->key() + " not set");
    }
    response->set_found(true);
    response->set_value(space[r->key()]);
    return grpc::Status::OK;
  }

  grpc::Status StoreAdd(grpc::ServerContext*, const v1::StoreAddRequest* r,
                        v1::StoreAddResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status s = CheckScope(r->job_id(), r->attempt()); !s.ok()) return s;
    add_request_ids_.push_back(r->request_id());
    auto applied = applied_adds_.find(r->request_id());
    if (!r->request_id().empty() && applied != applied_adds_.end()) {
      response->set_value(applied->second);
      return LoseAddReply();
    }
    std::string& value = store_[Scope(r->job_id(), r->attempt())][r->key()];
    int64_t n = 0;
    if (!value.empty()) {
      try {
        size_t used = 0;
        n = std::stoll(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
      } catch (const std::exception&) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not a counter");
      }
    }
    n += r->delta();
    value = std::to_string(n);
    response->set_value(n);
    if (!r->request_id().empty()) applied_adds_[r->request_id()] = n;
    cv_.notify_all();
    return LoseAddReply();
  }

  // ---- For tests ----

  // The longest a waiting StoreGet waits (the real coordinator bounds it too).
  std::chrono::milliseconds max_wait{60000};

  // Only this attempt of a job is current (store calls for another get ABORTED); unset: any.
  void SetCurrentAttempt(const std::string& job_id, int attempt) {
    std::lock_guard<std::mutex> lock(mu_);
    current_attempt_[job_id] = attempt;
  }

  // What SessionAccepted.metrics_batches says to sessions opened from now on.
  std::atomic<bool> metrics_batches{false};
  // What SessionAccepted.heartbeat_with_metrics says (decision 0070).
  std::atomic<bool> heartbeat_with_metrics{false};

  // Queues a message down every open session (the first to pick it up sends it).
  void SendDown(v1::WorkerSessionResponse m) {
    std::lock_guard<std::mutex> lock(mu_);
    down_.push_back(std::move(m));
    cv_.notify_all();
  }

  // Waits until pred(up messages so far) holds; false on timeout.
  bool WaitFor(const std::function<bool(const std::vector<v1::WorkerSessionRequest>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(up_); });
  }
  bool WaitForOpens(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return opens_.size() >= n; });
  }
  std::vector<v1::WorkerSessionRequest> up() {
    std::lock_guard<std::mutex> lock(mu_);
    return up_;
  }
  std::vector<v1::OpenSession> opens() {
    std::lock_guard<std::mutex> lock(mu_);
    return opens_;
  }
  std::vector<v1::RegisterWorkerRequest> registrations() {
    std::lock_guard<std::mutex> lock(mu_);
    return registrations_;
  }
  int store_gets() {
    std::lock_guard<std::mutex> lock(mu_);
    return store_gets_;
  }
  // The next `n` StoreAdd calls are applied and then answered UNAVAILABLE, as when the
  // connection breaks before the reply (the coordinator's own request-id check is modelled).
  void LoseAddReplies(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    lose_add_replies_ = n;
  }
  // The next `n` StoreSet and StoreGet calls are answered CANCELLED before doing anything, as a
  // stopping coordinator's gRPC server cuts calls off.
  void CancelStoreCalls(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_store_calls_ = n;
  }
  std::vector<std::string> add_request_ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return add_request_ids_;
  }
  // Store calls answered ABORTED (a stale attempt).
  int aborted_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_calls_;
  }

 private:
  static void SetDuration(google::protobuf::Duration* d, std::chrono::milliseconds ms) {
    d->set_seconds(ms.count() / 1000);
    d->set_nanos(static_cast<int32_t>((ms.count() % 1000) * 1000000));
  }
  static std::string Scope(const std::string& job, int attempt) {
    return job + "/" + std::to_string(attempt);
  }
  // OK, or UNAVAILABLE while LoseAddReplies has losses left (the call was applied all the same).
  grpc::Status LoseAddReply() {
    if (lose_add_replies_ == 0) return grpc::Status::OK;
    --lose_add_replies_;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset (test)");
  }
  grpc::Status CancelStoreCall() {
    if (cancel_store_calls_ == 0) return grpc::Status::OK;
    --cancel_store_calls_;
    return grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED");
  }
  grpc::Status CheckScope(const std::string& job, int attempt) {
    if (job.empty() || attempt < 1) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id empty or attempt < 1");
    }
    auto it = current_attempt_.find(job);
    if (it != current_attempt_.end() && it->second != attempt) {
      ++aborted_calls_;
      return grpc::Status(grpc::StatusCode::ABORTED, "attempt is not current");
    }
    return grpc::Status::OK;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int next_id_ = 0;
  std::map<std::string, std::string> tokens_;
  std::vector<v1::RegisterWorkerRequest> registrations_;
  std::vector<v1::OpenSession> opens_;
  int open_sessions_ = 0;
  std::vector<v1::WorkerSessionRequest> up_;
  std::deque<v1::WorkerSessionResponse> down_;
  std::map<std::string, std::map<std::string, std::string>> store_;
  std::map<std::string, int> current_attempt_;
  int store_gets_ = 0;
  int aborted_calls_ = 0;
  int lose_add_replies_ = 0;
  int cancel_store_calls_ = 0;
  std::vector<std::string> add_request_ids_;
  std::map<std::string, int64_t> applied_adds_;
};

// A gRPC server for a FakeCoordinator on 127.0.0.1 (port 0: any free one).
class FakeServer {
 public:
  explicit FakeServer(FakeCoordinator* service, int port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() { Shutdown(); }
  void Shutdown() {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      server_->Wait();
      server_.reset();
    }
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  bool ok() const { return server_ != nullptr && port_ > 0; }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

inline std::shared_ptr<v1::CoordinatorService::StubInterface> StubFor(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  return v1::CoordinatorService::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

}  // namespace meshrun::testing
