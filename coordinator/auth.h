// Authorizer: who may call which CoordinatorService RPC (docs/security.md, "Authentication and
// authorisation"). Three rules, applied by the gRPC adapter before a handler runs:
//   - client API (SubmitJob, GetJob, ListJobs, CancelJob, WatchJob, ListWorkers, GetJobLogs):
//     with --token-file, an `authorization: Bearer <token>` matching one line of the file,
//     else UNAUTHENTICATED; without --token-file, open (allowed only on loopback or with
//     --insecure, see CoordinatorServer::Start);
//   - worker RPCs (RegisterWorker, WorkerSession, StoreSet/Get/Add): with TLS, the peer's
//     verified client certificate names the worker (its subject CN); no certificate is
//     UNAUTHENTICATED, and a worker may act only as itself (PERMISSION_DENIED otherwise);
//     without TLS there is no worker identity and these RPCs are open;
//   - a worker identified by its certificate may touch the store key space of, and report
//     about, only the (job, attempt)s with a rank placed on it (PERMISSION_DENIED otherwise).
// It knows nothing of gRPC: the adapter hands it the header value and the certificate's name.
// Thread-safe; the token list is replaced atomically by ReloadTokens (SIGHUP).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshrun::coordinator {

struct AuthConfig {
  // Worker identity comes from verified client certificates (the coordinator serves TLS with
  // --tls-ca).
  bool tls = false;
  // --token-file; empty: the client API needs no token.
  std::string token_file;
};

class Authorizer {
 public:
  // Whether a rank of (job_id, attempt) is placed on the worker named `worker_name`; nullopt
  // when the coordinator does not know the attempt (an unknown job or a forgotten attempt: the
  // handler answers those itself). JobManager::RunsOnWorker.
  using PlacementFn = std::function<std::optional<bool>(const std::string& worker_name,
                                                        const std::string& job_id, int attempt)>;
  // The registered name of a worker id, nullopt when unknown.
  using WorkerNameFn = std::function<std::optional<std::string>(const std::string& worker_id)>;

  // Reads --token-file (INVALID_ARGUMENT naming the flag when it cannot be read or is empty).
  static StatusOr<std::unique_ptr<Authorizer>> Create(AuthConfig config, PlacementFn placement,
                                                      WorkerNameFn worker_name);

  // Reads --token-file again; on error the tokens in use stay. No-op without a token file.
  Status ReloadTokens();
  size_t token_count() const;
  bool tokens_required() const { return !config_.token_file.empty(); }
  bool tls() const { return config_.tls; }

  // Client API: `authorization` is the header value, nullopt when the call has none.
  Status CheckClient(const std::optional<std::string_view>& authorization) const;

  // Who a client call is, for the SubmitJob rate limit (rate_limiter.h): with --token-file, the
  // accepted token itself, parsed (hashed, prefixed kTokenCallerPrefix), so spelling one token
  // differently (spaces, case of "Bearer") is still one caller; without --token-file the
  // header proves nothing and the caller is the peer's host (CallerOfPeer). Call after
  // CheckClient accepted the call.
  std::string ClientCaller(const std::optional<std::string_view>& authorization,
                           const std::string& peer) const;

  // Worker RPCs. `peer_name` is the CN of the verified client certificate, nullopt when the
  // peer presented none. Each returns OK without TLS.
  // The worker name the peer acts as ("" without TLS), or UNAUTHENTICATED.
  StatusOr<std::string> WorkerIdentity(const std::optional<std::string>& peer_name) const;
  // RegisterWorker: the registered name must be the certificate's.
  Status CheckRegister(const std::string& identity, const std::string& name) const;
  // WorkerSession `open`: worker_id must be the certificate's worker.
  Status CheckOpen(const std::string& identity, const std::string& worker_id) const;
  // Store calls and session reports about (job_id, attempt); `what` names the call for the
  // message ("StoreGet", "rank_started", …).
  Status CheckAttempt(const std::string& identity, const std::string& job_id, int attempt,
                      const std::string& what) const;

 private:
  Authorizer(AuthConfig config, PlacementFn placement, WorkerNameFn worker_name)
      : config_(std::move(config)),
        placement_(std::move(placement)),
        worker_name_(std::move(worker_name)) {}

  const AuthConfig config_;
  const PlacementFn placement_;
  const WorkerNameFn worker_name_;
  mutable std::shared_mutex mu_;
  std::vector<std::string> tokens_;  // guarded by mu_
};

}  // namespace meshrun::coordinator
