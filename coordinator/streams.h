// The server side of the two long-lived streams, as handlers and managers see them: the
// WorkerSession stream of one worker and the WatchJob stream of one client. Implemented by the
// gRPC adapter (grpc_adapter.cc) and, in tests, by hand-written fakes (tests/fakes/).
#pragma once

#include <string>

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
  virtual void Finish(const Status& status) = 0;
};

}  // namespace meshrun::coordinator
