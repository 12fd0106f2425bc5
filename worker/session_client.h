// SessionClient: a worker's side of the control plane. Registers with the coordinator, keeps ONE
// WorkerSession stream open (heartbeats, queued reports up; assignments and stop orders down)
// and reopens it with exponential backoff whenever it breaks, registering again when the
// coordinator no longer knows the worker. Rank processes are not its business: it never stops
// them, it only reports them (SessionHandler::RunningRanks) when a session opens.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun {

// What the session needs from the worker. Called from the session's threads; implementations
// must be thread-safe and must not block for long.
class SessionHandler {
 public:
  virtual ~SessionHandler() = default;
  virtual void OnAssign(const v1::RankAssignment& assignment) = 0;
  virtual void OnStop(const v1::StopOrder& order) = 0;
  // The ranks this worker runs now (for `open` and every heartbeat).
  virtual std::vector<v1::RunningRank> RunningRanks() = 0;
  virtual int FreeSlots() = 0;
  // A session was accepted (true) or ended (false).
  virtual void OnConnected(bool /*connected*/) {}
  // Registration was refused for good (INVALID_ARGUMENT, or PERMISSION_DENIED /
  // UNAUTHENTICATED from the coordinator's certificate checks): the worker cannot go on.
  virtual void OnFatal(const Status& /*status*/) {}
};

struct SessionOptions {
  // name, slots, device, address, metrics_address, device_name, version.
  v1::RegisterWorkerRequest registration;
  // Reconnect backoff: 200 ms doubling up to 2 s (with jitter), well inside a lease.
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{2000};
  // Longest heartbeat period: the period used is the coordinator's heartbeat_interval, but at
  // most this and at most a third of the lease, so that two lost heartbeats do not cost it.
  std::chrono::milliseconds heartbeat{1000};
  // Deadline of RegisterWorker.
  std::chrono::milliseconds call_timeout{5000};
  // Reports queued while no session is open, beyond which metrics and log lines are dropped
  // (rank starts, exits and checkpoints are always kept).
  size_t max_queued = 20000;
  // The same for their serialized size, so that long log lines cannot pile up gigabytes.
  size_t max_queued_bytes = 64u << 20;
  // To a coordinator that accepts metrics batches (SessionAccepted.metrics_batches), the rank
  // samples queued one after another go up as one RankMetrics (at most max_metrics_batch), and
  // a sample at the head of the queue waits up to this long for the worker's other ranks'
  // samples of the step (which its ranks report within moments of each other); 0: no wait.
  std::chrono::milliseconds metrics_linger{5};
  int max_metrics_batch = 64;
};

// Owns one thread that registers and reads the stream, and, while a session is open, one that
// writes it. Thread-safe: Send may be called from any thread.
class SessionClient {
 public:
  SessionClient(std::shared_ptr<v1::CoordinatorService::StubInterface> stub, SessionOptions options,
                SessionHandler* handler);
  ~SessionClient();
  SessionClient(const SessionClient&) = delete;
  SessionClient& operator=(const SessionClient&) = delete;

  void Start();
  // Queues one up message; it goes out on the current session, or on the next one.
  void Send(v1::WorkerSessionRequest message);
  // Waits until every queued message was written (true) or `timeout` passed (false).
  bool Flush(std::chrono::milliseconds timeout);
  // Ends the session and the threads. Idempotent.
  void Stop();

  bool connected() const;
  std::string worker_id() const;
  // Sessions accepted so far (a reconnect adds one).
  int sessions_opened() const;
  // Registrations accepted so far (a lease that ran out adds one).
  int registrations() const;
  // Heartbeats that went up inside a batch of samples (RankMetrics.heartbeat) so far.
  int heartbeats_carried() const;

 private:
  void Run();
  Status Register();
  // Opens one session and serves it until it ends; returns how it ended.
  Status RunSession();
  void WriterLoop(grpc::ClientReaderWriterInterface<v1::WorkerSessionRequest,
                                                    v1::WorkerSessionResponse>* stream,
                  std::chrono::milliseconds interval);
  // Sleeps `d` unless Stop() comes first; false when stopping.
  bool SleepFor(std::chrono::milliseconds d);

  std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  SessionOptions options_;
  SessionHandler* handler_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                       // guarded by mu_
  bool session_up_ = false;                     // guarded by mu_: a writer may write
  bool connected_ = false;                      // guarded by mu_
  int writing_ = 0;                             // guarded by mu_: messages being written now
  bool metrics_batches_ = false;                // guarded by mu_: the session accepts them
  bool heartbeat_with_metrics_ = false;         // guarded by mu_: a batch may carry the heartbeat
  std::deque<v1::WorkerSessionRequest> queue_;  // guarded by mu_
  size_t queued_bytes_ = 0;                     // guarded by mu_
  size_t dropped_ = 0;                          // guarded by mu_
  grpc::ClientContext* active_ctx_ = nullptr;   // guarded by mu_
  std::string worker_id_;                       // guarded by mu_
  std::string session_token_;                   // guarded by mu_
  std::chrono::milliseconds lease_{0};          // guarded by mu_
  std::chrono::milliseconds heartbeat_{0};      // guarded by mu_
  int sessions_opened_ = 0;                     // guarded by mu_
  int registrations_ = 0;                       // guarded by mu_
  int heartbeats_carried_ = 0;                  // guarded by mu_
  std::thread thread_;
};

}  // namespace meshrun
