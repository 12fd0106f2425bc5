// A worker daemon's control-plane half, over real gRPC: RegisterWorker, then a WorkerSession
// stream on the callback API (no thread per stream, so a benchmark can run a thousand). It runs
// no processes: the test (or bench) reads the assignments and stop orders it receives and
// sends rank_started / rank_exited / heartbeats / metrics itself. Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun::testing {

class FakeGrpcWorker {
 public:
  using Clock = std::chrono::steady_clock;

  FakeGrpcWorker(std::shared_ptr<grpc::Channel> channel, std::string name, int slots,
                 std::string device = "cpu")
      : stub_(v1::CoordinatorService::NewStub(channel)),
        name_(std::move(name)),
        slots_(slots),
        device_(std::move(device)) {}
  ~FakeGrpcWorker() { Kill(); }

  // Registers with this host calibration, as meshrun-worker does (control_plane bench).
  void set_calibration(const v1::HostCalibration& c) { calibration_ = c; }

  grpc::Status Register(std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    v1::RegisterWorkerRequest req;
    req.set_name(name_);
    req.set_slots(slots_);
    req.set_device(device_);
    req.set_address("127.0.0.1");
    req.set_version("test");
    if (calibration_) *req.mutable_calibration() = *calibration_;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    v1::RegisterWorkerResponse resp;
    grpc::Status s = stub_->RegisterWorker(&ctx, req, &resp);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      registration_ = resp;
    }
    return s;
  }

  // Opens a session stream (ending any previous one) with `running` in its `open`.
  void Open(const std::vector<v1::RunningRank>& running = {}) {
    Kill();
    v1::WorkerSessionRequest open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended_.reset();
      open.mutable_open()->set_worker_id(registration_.worker_id());
      open.mutable_open()->set_session_token(registration_.session_token());
      inbox_.clear();
    }
    for (const auto& r : running) *open.mutable_open()->add_running() = r;
    session_ = std::make_unique<Session>(this);
    session_->Start(stub_.get(), open);
  }

  bool Send(const v1::WorkerSessionRequest& message) {
    return session_ != nullptr && session_->Send(message);
  }

  // Up messages the tests send most.
  bool Heartbeat(const std::vector<v1::RunningRank>& running = {}) {
    v1::WorkerSessionRequest m;
    *m.mutable_heartbeat() = HeartbeatOf(running);
    return Send(m);
  }
  // The heartbeat of this worker running `running` (alone, or on a batch of samples).
  v1::Heartbeat HeartbeatOf(const std::vector<v1::RunningRank>& running) const {
    v1::Heartbeat beat;
    for (const auto& r : running) *beat.add_running() = r;
    beat.set_free_slots(slots_ - static_cast<int>(running.size()));
    return beat;
  }
  bool Started(const v1::RankAssignment& a, int pid = 4242) {
    v1::WorkerSessionRequest m;
    m.mutable_rank_started()->set_job_id(a.job_id());
    m.mutable_rank_started()->set_attempt(a.attempt());
    m.mutable_rank_started()->set_rank(a.rank());
    m.mutable_rank_started()->set_pid(pid);
    return Send(m);
  }
  bool Exited(const v1::RankAssignment& a, int exit_code, bool stopped = false) {
    v1::WorkerSessionRequest m;
    m.mutable_rank_exited()->set_job_id(a.job_id());
    m.mutable_rank_exited()->set_attempt(a.attempt());
    m.mutable_rank_exited()->set_rank(a.rank());
    m.mutable_rank_exited()->set_exit_code(exit_code);
    m.mutable_rank_exited()->set_stopped(stopped);
    return Send(m);
  }
  static v1::RunningRank Running(const v1::RankAssignment& a, int pid = 4242) {
    v1::RunningRank r;
    r.set_job_id(a.job_id());
    r.set_attempt(a.attempt());
    r.set_rank(a.rank());
    r.set_pid(pid);
    return r;
  }

  // Waits (bounded) until `count` messages of `kind` arrived; returns them and removes them.
  std::vector<v1::WorkerSessionResponse> Take(v1::WorkerSessionResponse::KindCase kind,
                                              size_t count, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    auto matching = [&] {
      size_t n = 0;
      for (const auto& m : inbox_) n += m.kind_case() == kind;
      return n;
    };
    cv_.wait_for(lock, limit, [&] { return matching() >= count; });
    std::vector<v1::WorkerSessionResponse> out;
    std::deque<v1::WorkerSessionResponse> keep;
    for (auto& m : inbox_) {
      if (m.kind_case() == kind && out.size() < count) {
        out.push_back(std::move(m));
      } else {
        keep.push_back(std::move(m));
      }
    }
    inbox_ = std::move(keep);
    return out;
  }
  std::vector<v1::RankAssignment> TakeAssignments(
      size_t count, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::vector<v1::RankAssignment> out;
    for (auto& m : Take(v1::WorkerSessionResponse::kAssign, count, limit))
      out.push_back(m.assign());
    return out;
  }
  std::vector<v1::StopOrder> TakeStops(size_t count,
                                       std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::vector<v1::StopOrder> out;
    for (auto& m : Take(v1::WorkerSessionResponse::kStop, count, limit)) out.push_back(m.stop());
    return out;
  }
  bool WaitAccepted(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    return Take(v1::WorkerSessionResponse::kAccepted, 1, limit).size() == 1;
  }

  // The status the session ended with, waiting at most `limit`; nullopt while it runs.
  std::optional<grpc::Status> WaitEnded(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, limit, [&] { return ended_.has_value(); });
    return ended_;
  }

  // Half-closes the stream and waits for the coordinator's status.
  std::optional<grpc::Status> Close(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    if (!session_) return std::nullopt;
    session_->Close();
    auto status = WaitEnded(limit);
    session_.reset();
    return status;
  }
  // Cancels the stream (a crashed worker) and waits for it to be torn down.
  void Kill() {
    if (!session_) return;
    session_->Cancel();
    WaitEnded(std::chrono::seconds(10));
    session_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    ended_.reset();
  }

  // Called for every message received, on a gRPC thread (before it is queued for Take).
  void set_on_message(std::function<void(const v1::WorkerSessionResponse&)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_message_ = std::move(fn);
  }
  // With a callback set, keep messages out of the inbox (benchmarks).
  void set_keep_messages(bool keep) {
    std::lock_guard<std::mutex> lock(mu_);
    keep_messages_ = keep;
  }

  std::string worker_id() const {
    std::lock_guard<std::mutex> lock(mu_);
    return registration_.worker_id();
  }
  v1::RegisterWorkerResponse registration() const {
    std::lock_guard<std::mutex> lock(mu_);
    return registration_;
  }
  const std::string& name() const { return name_; }

 private:
  class Session final
      : public grpc::ClientBidiReactor<v1::WorkerSessionRequest, v1::WorkerSessionResponse> {
   public:
    explicit Session(FakeGrpcWorker* owner) : owner_(owner) {}

    void Start(v1::CoordinatorService::Stub* stub, const v1::WorkerSessionRequest& open) {
      stub->async()->WorkerSession(&ctx_, this);
      Send(open);
      StartRead(&in_);
      StartCall();
    }
    bool Send(const v1::WorkerSessionRequest& m) {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_ || closing_) return false;
      queue_.push_back(m);
      if (!writing_) {
        writing_ = true;
        StartWrite(&queue_.front());
      }
      return true;
    }
    void Close() {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_ || done_) return;
      closing_ = true;
      if (!writing_) StartWritesDone();
    }
    void Cancel() { ctx_.TryCancel(); }

    void OnWriteDone(bool ok) override {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      if (ok && !queue_.empty()) {
        StartWrite(&queue_.front());
        return;
      }
      if (!ok) queue_.clear();
      writing_ = false;
      if (ok && closing_) StartWritesDone();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      owner_->Deliver(in_);
      StartRead(&in_);
    }
    void OnDone(const grpc::Status& s) override {
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = true;
      }
      owner_->Ended(s);
    }

   private:
    FakeGrpcWorker* owner_;
    grpc::ClientContext ctx_;
    v1::WorkerSessionResponse in_;
    std::mutex mu_;
    std::deque<v1::WorkerSessionRequest> queue_;
    bool writing_ = false, closing_ = false, done_ = false;
  };

  void Deliver(const v1::WorkerSessionResponse& m) {
    std::function<void(const v1::WorkerSessionResponse&)> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn = on_message_;
    }
    if (fn) fn(m);
    std::lock_guard<std::mutex> lock(mu_);
    if (keep_messages_) inbox_.push_back(m);
    cv_.notify_all();
  }
  void Ended(const grpc::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = s;
    cv_.notify_all();
  }

  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  const std::string name_;
  const int slots_;
  const std::string device_;
  std::optional<v1::HostCalibration> calibration_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  v1::RegisterWorkerResponse registration_;
  std::deque<v1::WorkerSessionResponse> inbox_;
  std::optional<grpc::Status> ended_;
  std::function<void(const v1::WorkerSessionResponse&)> on_message_;
  bool keep_messages_ = true;
  std::unique_ptr<Session> session_;
};

}  // namespace meshrun::testing
