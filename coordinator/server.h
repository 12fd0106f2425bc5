// CoordinatorServer: wires the state database, the managers, the handler, the gRPC server
// (with the standard health service and server reflection), the Prometheus exporter and the
// ticker that drives leases and the queue. main.cc only turns flags into a CoordinatorConfig;
// tests start one in-process on port 0.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/tls.h"
#include "coordinator/clock.h"

namespace grpc {
class Server;
}
namespace meshrun {
class DirLock;
}

namespace meshrun::coordinator {

class StateDb;
class StoreManager;
class WorkerManager;
class JobManager;
class CoordinatorServiceImpl;
class CoordinatorGrpcService;
class MetricsExporter;
class Authorizer;

// Every tunable of the coordinator, resolved once at start and logged (ToString).
struct CoordinatorConfig {
  std::string listen = "127.0.0.1:50051";               // --listen
  std::string metrics_listen;                           // --metrics-listen; empty: no exporter
  std::string state_dir;                                // --state-dir (required)
  std::chrono::milliseconds heartbeat_timeout{10'000};  // --heartbeat-timeout
  // The HOST the ranks dial for the store (--advertise-address); empty: the --listen host,
  // or this machine's host name when --listen is a wildcard (0.0.0.0, [::]).
  std::string advertise_host;
  // Confined paths and limits (docs/security.md "Confined paths" and "Limits").
  int max_receive_message_bytes = 4 << 20;           // --max-request-bytes
  std::vector<std::string> data_roots;               // --data-root (repeatable); none: unconfined
  std::vector<std::string> checkpoint_roots;         // --checkpoint-root (repeatable)
  size_t max_spec_bytes = 256 * 1024;                // --max-spec-bytes
  size_t max_pending_jobs = 10'000;                  // --max-pending-jobs
  double submit_rate = 10;                           // --submit-rate: per second per caller; 0: off
  double submit_burst = 20;                          // --submit-burst
  size_t max_store_value_bytes = 1 << 20;            // --max-store-value-bytes
  size_t max_store_bytes_per_attempt = 256u << 20;   // --max-store-bytes-per-attempt
  size_t max_store_bytes = size_t{1} << 30;          // --max-store-bytes (all attempts)
  size_t max_ranks_per_report = 4'096;               // --max-ranks-per-report
  size_t max_stops_per_worker = 1'024;               // --max-stops-per-worker
  std::chrono::milliseconds restart_backoff{1'000};  // --restart-backoff
  std::chrono::milliseconds restart_backoff_max{300'000};  // --restart-backoff-max
  // Per-caller limits (a caller: one bearer token, or one peer host without --token-file; for
  // store waits one worker certificate) beside the global ones, and the connections
  // (docs/security.md "Limits").
  size_t max_pending_jobs_per_caller = 1'000;                  // --max-pending-jobs-per-caller
  size_t max_watch_streams = 1'024;                            // --max-watch-streams
  size_t max_watch_streams_per_caller = 128;                   // --max-watch-streams-per-caller
  size_t max_store_waits = 65'536;                             // --max-store-waits
  size_t max_store_waits_per_worker = 1'024;                   // --max-store-waits-per-worker
  std::chrono::milliseconds max_store_wait{1'800'000};         // --max-store-wait
  std::chrono::milliseconds handshake_timeout{10'000};         // --handshake-timeout
  std::chrono::milliseconds connection_idle_timeout{300'000};  // --connection-idle-timeout
  std::chrono::milliseconds tick{20};
  // Transport security and authentication (docs/security.md). --tls-cert, --tls-key and
  // --tls-ca together turn on TLS, with client certificates verified against --tls-ca and
  // naming the workers; none of them: plaintext, allowed only on a loopback --listen unless
  // `insecure`. token_file (--token-file) holds the client API's bearer tokens; without it the
  // client API is open, allowed only on loopback unless `insecure` (--insecure).
  TlsFiles tls;
  std::string token_file;
  bool insecure = false;

  std::string ToString() const;
};

class CoordinatorServer {
 public:
  // Opens --state-dir, restores the managers, and starts serving. Errors name the flag:
  // FAILED_PRECONDITION for a state dir or address that cannot be used.
  static StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorConfig& config,
                                                            const Clock* clock = nullptr);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Health NOT_SERVING, every stream and store wait ended with UNAVAILABLE, in-flight calls
  // given `drain` to finish, then the ticker, the exporter and the database are closed.
  // Idempotent.
  void Shutdown(std::chrono::milliseconds drain = std::chrono::milliseconds(500));

  // Reads --token-file again (SIGHUP); on error the tokens in use stay and the error is
  // returned. No-op without a token file.
  Status ReloadTokens();

  int port() const { return port_; }
  int metrics_port() const;
  // HOST:PORT as the ranks and workers should dial it.
  const std::string& advertised_address() const { return advertised_; }
  CoordinatorServiceImpl& service() { return *service_; }
  JobManager& jobs() { return *jobs_; }
  WorkerManager& workers() { return *workers_; }
  StoreManager& store() { return *store_; }
  // Open WatchJob calls.
  size_t watch_streams() const;

 private:
  CoordinatorServer() = default;
  void TickLoop();

  CoordinatorConfig config_;
  RealClock real_clock_;
  const Clock* clock_ = nullptr;
  std::unique_ptr<DirLock> state_lock_;  // --state-dir, held for the process's life
  std::unique_ptr<StateDb> db_;
  std::unique_ptr<StoreManager> store_;
  std::unique_ptr<WorkerManager> workers_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<CoordinatorGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsExporter> metrics_;
  int port_ = 0;
  std::string advertised_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread ticker_;
};

}  // namespace meshrun::coordinator
