// Authorizer (see auth.h): token comparison in constant time over every accepted token, and the
// identity and placement checks of worker RPCs.
#include "coordinator/auth.h"

#include <mutex>

#include "common/tls.h"
#include "coordinator/rate_limiter.h"

namespace meshrun::coordinator {
namespace {

Status Unauthenticated(std::string message) {
  return Status(StatusCode::kUnauthenticated, std::move(message));
}

Status PermissionDenied(std::string message) {
  return Status(StatusCode::kPermissionDenied, std::move(message));
}

}  // namespace

StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(AuthConfig config, PlacementFn placement,
                                                         WorkerNameFn worker_name) {
  std::unique_ptr<Authorizer> auth(
      new Authorizer(std::move(config), std::move(placement), std::move(worker_name)));
  if (auth->tokens_required()) {
    MESHRUN_ASSIGN_OR_RETURN(auth->tokens_,
                             ReadTokenFile("--token-file", auth->config_.token_file));
  }
  return auth;
}

Status Authorizer::ReloadTokens() {
  if (!tokens_required()) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                           ReadTokenFile("--token-file", config_.token_file));
  std::unique_lock<std::shared_mutex> lock(mu_);
  tokens_ = std::move(tokens);
  return OkStatus();
}

size_t Authorizer::token_count() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return tokens_.size();
}

Status Authorizer::CheckClient(const std::optional<std::string_view>& authorization) const {
  if (!tokens_required()) return OkStatus();
  if (!authorization.has_value() || authorization->empty()) {
    return Unauthenticated(
        "authorization: this coordinator requires a bearer token (hint: export "
        "MESHRUN_TOKEN=<token> or pass --token-file FILE; ask the cluster admin for a token)");
  }
  const std::string token = BearerToken(*authorization);
  if (token.empty()) {
    return Unauthenticated(
        "authorization: expected 'Bearer <token>' (hint: export MESHRUN_TOKEN=<token> or pass "
        "--token-file FILE)");
  }
  bool match = false;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    // No early exit: the time taken does not tell which token (or how much of one) matched.
    for (const std::string& accepted : tokens_) match |= ConstantTimeEquals(accepted, token);
  }
  if (!match) {
    return Unauthenticated(
        "authorization: the bearer token is not accepted by this coordinator (hint: check "
        "MESHRUN_TOKEN or --token-file; tokens are listed in the coordinator's --token-file)");
  }
  return OkStatus();
}

std::string Authorizer::ClientCaller(const std::optional<std::string_view>& authorization,
                                     const std::string& peer) const {
  if (tokens_required() && authorization.has_value()) {
    const std::string token = BearerToken(*authorization);
    if (!token.empty()) {
      return kTokenCallerPrefix + std::to_string(std::hash<std::string>()(token));
    }
  }
  return CallerOfPeer(peer);
}

StatusOr<std::string> Authorizer::WorkerIdentity(
    const std::optional<std::string>& peer_name) const {
  if (!config_.tls) return std::string();
  if (!peer_name.has_value() || peer_name->empty()) {
    return Unauthenticated(
        "worker RPCs need a client certificate: this coordinator serves mutual TLS (hint: start "
        "meshrun-worker with --tls-cert, --tls-key and --tls-ca; the certificate's CN is the "
        "worker name)");
  }
  return *peer_name;
}

Status Authorizer::CheckRegister(const std::string& identity, const std::string& name) const {
  if (!config_.tls || identity == name) return OkStatus();
  return PermissionDenied("name: the client certificate is issued to worker '" + identity +
                          "', which cannot register as '" + name + "' (hint: pass --name " +
                          identity + ", or a certificate whose CN is the worker name)");
}

Status Authorizer::CheckOpen(const std::string& identity, const std::string& worker_id) const {
  if (!config_.tls) return OkStatus();
  const std::optional<std::string> name = worker_name_(worker_id);
  // An unknown id is the handler's NOT_FOUND (register again), not a permission question.
  if (!name.has_value() || *name == identity) return OkStatus();
  return PermissionDenied("open.worker_id: " + worker_id + " belongs to worker '" + *name +
                          "', not to '" + identity +
                          "' named by the client certificate (hint: a worker opens only its "
                          "own session)");
}

Status Authorizer::CheckAttempt(const std::string& identity, const std::string& job_id, int attempt,
                                const std::string& what) const {
  if (!config_.tls) return OkStatus();
  const std::optional<bool> placed = placement_(identity, job_id, attempt);
  if (!placed.has_value() || *placed) return OkStatus();
  return PermissionDenied(what + ": worker '" + identity + "' has no rank of job " + job_id +
                          " attempt " + std::to_string(attempt) +
                          " (hint: a worker reaches only the attempts placed on it)");
}

}  // namespace meshrun::coordinator
