// The server side of the two long-lived streams, as handlers and managers see them: the
// WorkerSession stream of one worker and the WatchJob stream of one client. Implemented by the
// gRPC adapter (grpc_adapter.cc) and, in tests, by hand-written fakes (tests/fakes/).
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "common/status.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

// One open WorkerSession. Thread-safe; Send never blocks (messages queue in the stream).
class WorkerSessionStream {
 public:
  virtual ~WorkerSessionStream() = default;
  // Queues a message to the worker; false (and the message dropped) once the stream is
  // finishing or finished.
  virtual bool Send(const v1::WorkerSessionResponse& message) = 0;
  // Ends the stream with `status` once the queued messages are written; later calls do nothing.
  virtual void Finish(const Status& status) = 0;
  // The client's address, for logs ("ipv4:127.0.0.1:50012").
  virtual std::string Peer() const = 0;
};

// One WatchJob stream. Thread-safe; Send never blocks.
class WatchJobStream {
 public:
  virtual ~WatchJobStream() = default;
  // Queues an event; false once the stream is finished or the client fell too far behind (the
  // stream then ends itself with UNAVAILABLE): the caller forgets the watcher.
  virtual bool Send(const v1::WatchJobResponse& message) = 0;
  // The same, taking the message (the last watcher of an event: no copy; decision 0058).
  virtual bool Send(v1::WatchJobResponse&& message) {
    return Send(static_cast<const v1::WatchJobResponse&>(message));
  }
  virtual void Finish(const Status& status) = 0;
  // True once the stream is finishing or finished (the client cancelled, went away or was
  // ended): a job's watcher list drops such streams without waiting for its next event.
  virtual bool ended() const { return false; }
};

// The cancellation of one unary call (StoreGet with wait), as the handler sees it: the adapter
// calls Cancel when the client cancels or goes away; a handler that parks the call registers a
// hook that unparks it at once instead of at its timeout. Thread-safe.
class CallCancellation {
 public:
  // `hook` runs on Cancel, or at once when the call was already cancelled; replaces an earlier
  // hook. It runs without this object's lock held.
  void OnCancel(std::function<void()> hook) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_) {
        hook_ = std::move(hook);
        return;
      }
    }
    hook();
  }
  void Cancel() {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return;
      cancelled_ = true;
      hook = std::move(hook_);
    }
    if (hook) hook();
  }

 private:
  std::mutex mu_;
  bool cancelled_ = false;      // guarded by mu_
  std::function<void()> hook_;  // guarded by mu_
};

}  // namespace meshrun::coordinator
