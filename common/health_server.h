// HealthServer: a second, plaintext gRPC server that serves only grpc.health.v1.Health, so that
// Kubernetes' gRPC probes (which cannot speak TLS) work while a daemon's API port is TLS-only.
// Both daemons start one for --health-listen HOST:PORT.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace meshrun {

// Owns the health gRPC server. Thread-safe: SetReady and Shutdown may be called from any thread.
//
// Two service names answer Health.Check:
//   ""          readiness: SERVING while the daemon can do its work (SetReady); the
//               coordinator is ready once it serves, a worker while its session is up;
//   "liveness"  SERVING as long as the process runs and has not begun to stop, so a liveness
//               probe does not restart a worker whose coordinator is briefly away.
// Both turn NOT_SERVING on Shutdown. Nothing else (no reflection, no API) is served.
class HealthServer {
 public:
  static constexpr const char* kLivenessService = "liveness";

  // Listens on `listen` (HOST:PORT; port 0 picks one). `ready` is the initial state of "".
  // Errors name the flag --health-listen: INVALID_ARGUMENT for a malformed address,
  // FAILED_PRECONDITION when the address cannot be bound.
  static StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& listen, bool ready);
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  // Service "": SERVING (true) or NOT_SERVING (false).
  void SetReady(bool ready);
  // Every service NOT_SERVING, then the server stops (in-flight calls get `drain_ms`).
  // Idempotent.
  void Shutdown(int drain_ms = 200);

  int port() const { return port_; }

 private:
  HealthServer() = default;

  // Answers UNIMPLEMENTED for every other method; a server needs one polled service of its
  // own before gRPC adds the health service. Declared first: destroyed after the server.
  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  bool shut_down_ = false;  // guarded by mu_
};

}  // namespace meshrun
