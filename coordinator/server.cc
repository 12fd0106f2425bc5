// CoordinatorServer: start-up order (state, managers, gRPC, exporter, ticker) and the reverse
// for shutdown.
#include "coordinator/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <climits>
#include <optional>

#include "common/dir_lock.h"
#include "coordinator/auth.h"
#include "coordinator/connection_limits.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/grpc_adapter.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics_exporter.h"
#include "coordinator/state_db.h"
#include "coordinator/store_manager.h"
#include "coordinator/worker_manager.h"

namespace meshrun::coordinator {
namespace {

// "HOST:PORT" or "[V6]:PORT" → HOST (brackets kept for v6), or "" when malformed.
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return "";
  return address.substr(0, colon);
}

bool IsWildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "[::]" || host == "::" || host == "*" || host.empty();
}

std::string ThisHostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  return name;
}

// The limits of docs/security.md "Limits", each named by its flag.
Status CheckLimits(const CoordinatorConfig& c) {
  if (c.max_receive_message_bytes < 64 * 1024) {
    return InvalidArgumentError(
        "--max-request-bytes: " + std::to_string(c.max_receive_message_bytes) +
        " is below 65536 (hint: the default is 4194304)");
  }
  if (c.max_spec_bytes < 1024 ||
      c.max_spec_bytes >= static_cast<size_t>(c.max_receive_message_bytes)) {
    return InvalidArgumentError("--max-spec-bytes: " + std::to_string(c.max_spec_bytes) +
                                " must be at least 1024 and below --max-request-bytes (" +
                                std::to_string(c.max_receive_message_bytes) +
                                ") (hint: the default is 262144)");
  }
  if (c.max_pending_jobs < 1) {
    return InvalidArgumentError("--max-pending-jobs: must be at least 1 (hint: e.g. 10000)");
  }
  if (!(c.submit_rate >= 0) || (c.submit_rate > 0 && !(c.submit_burst >= 1))) {
    return InvalidArgumentError(
        "--submit-rate: must be ≥ 0 (0: no limit), with --submit-burst ≥ 1 (hint: e.g. "
        "--submit-rate 10 --submit-burst 20)");
  }
  if (c.max_store_value_bytes < 1024 || c.max_store_value_bytes > c.max_store_bytes_per_attempt) {
    return InvalidArgumentError(
        "--max-store-value-bytes: " + std::to_string(c.max_store_value_bytes) +
        " must be at least 1024 and at most --max-store-bytes-per-attempt (" +
        std::to_string(c.max_store_bytes_per_attempt) + ") (hint: the default is 1048576)");
  }
  if (c.max_store_bytes < c.max_store_bytes_per_attempt) {
    return InvalidArgumentError("--max-store-bytes: " + std::to_string(c.max_store_bytes) +
                                " is below --max-store-bytes-per-attempt (" +
                                std::to_string(c.max_store_bytes_per_attempt) +
                                ") (hint: the default is 1073741824)");
  }
  if (c.max_ranks_per_report < 1 || c.max_stops_per_worker < 1) {
    return InvalidArgumentError(std::string(c.max_ranks_per_report < 1 ? "--max-ranks-per-report"
                                                                       : "--max-stops-per-worker") +
                                ": must be at least 1 (hint: the defaults are 4096 and 1024)");
  }
  if (c.max_pending_jobs_per_caller < 1 || c.max_watch_streams < 1 ||
      c.max_watch_streams_per_caller < 1 || c.max_store_waits < 1 ||
      c.max_store_waits_per_worker < 1) {
    return InvalidArgumentError(
        "--max-pending-jobs-per-caller, --max-watch-streams, --max-watch-streams-per-caller, "
        "--max-store-waits, --max-store-waits-per-worker: each must be at least 1 (hint: the "
        "defaults are 1000, 1024, 128, 65536 and 1024)");
  }
  if (c.max_store_wait < std::chrono::seconds(1) || c.handshake_timeout.count() < 100 ||
      c.connection_idle_timeout < std::chrono::seconds(1)) {
    return InvalidArgumentError(
        "--max-store-wait, --handshake-timeout, --connection-idle-timeout: must be at least 1 s, "
        "0.1 s and 1 s (hint: the defaults are 1800, 10 and 300 seconds)");
  }
  if (c.restart_backoff.count() < 0 || c.restart_backoff_max < c.restart_backoff) {
    return InvalidArgumentError(
        "--restart-backoff: must be ≥ 0 and at most --restart-backoff-max (hint: the defaults "
        "are 1 and 300 seconds)");
  }
  return OkStatus();
}

// One coordinator per --state-dir: two on one database hand out the same job ids and lose each
// other's jobs. The lock (common/dir_lock.h) lives as long as the process; a kill -9 drops it.
StatusOr<std::unique_ptr<DirLock>> LockStateDir(const std::string& state_dir) {
  DirLockHolder holder;
  StatusOr<std::unique_ptr<DirLock>> lock =
      DirLock::TryAcquire(state_dir, ThisProcess("meshrun-coordinator"), &holder);
  if (lock.ok()) return lock;
  if (lock.status().code() == StatusCode::kAlreadyExists) {
    return FailedPreconditionError(
        "--state-dir: " + state_dir + " is in use by another meshrun-coordinator, " +
        holder.Describe() +
        " (hint: stop that coordinator first, or pass another --state-dir; one state folder "
        "serves one coordinator)");
  }
  return FailedPreconditionError("--state-dir: " + std::string(lock.status().message()) +
                                 " (hint: pass a folder this user can write)");
}

}  // namespace

std::string CoordinatorConfig::ToString() const {
  return "listen=" + listen +
         " metrics_listen=" + (metrics_listen.empty() ? "(off)" : metrics_listen) +
         " state_dir=" + state_dir +
         " heartbeat_timeout=" + std::to_string(heartbeat_timeout.count()) +
         "ms advertise_host=" + (advertise_host.empty() ? "(derived)" : advertise_host) +
         " max_request_bytes=" + std::to_string(max_receive_message_bytes) +
         " max_spec_bytes=" + std::to_string(max_spec_bytes) +
         " max_pending_jobs=" + std::to_string(max_pending_jobs) +
         " submit_rate=" + std::to_string(submit_rate) + "/s" +
         " submit_burst=" + std::to_string(submit_burst) +
         " max_store_value_bytes=" + std::to_string(max_store_value_bytes) +
         " max_store_bytes_per_attempt=" + std::to_string(max_store_bytes_per_attempt) +
         " max_store_bytes=" + std::to_string(max_store_bytes) +
         " max_ranks_per_report=" + std::to_string(max_ranks_per_report) +
         " max_stops_per_worker=" + std::to_string(max_stops_per_worker) +
         " max_pending_jobs_per_caller=" + std::to_string(max_pending_jobs_per_caller) +
         " max_watch_streams=" + std::to_string(max_watch_streams) +
         " max_watch_streams_per_caller=" + std::to_string(max_watch_streams_per_caller) +
         " max_store_waits=" + std::to_string(max_store_waits) +
         " max_store_waits_per_worker=" + std::to_string(max_store_waits_per_worker) +
         " max_store_wait=" + std::to_string(max_store_wait.count()) + "ms" +
         " handshake_timeout=" + std::to_string(handshake_timeout.count()) + "ms" +
         " connection_idle_timeout=" + std::to_string(connection_idle_timeout.count()) + "ms" +
         " restart_backoff=" + std::to_string(restart_backoff.count()) + "ms" +
         " restart_backoff_max=" + std::to_string(restart_backoff_max.count()) + "ms" +
         " tls=" + (tls.any() ? "on" : "off") +
         " token_file=" + (token_file.empty() ? "(none)" : token_file) +
         (insecure ? " insecure" : "");
}

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config, const Clock* clock) {
  if (config.state_dir.empty()) {
    return InvalidArgumentError(
        "--state-dir: is required (hint: pass a folder for the state database)");
  }
  if (HostOf(config.listen).empty() && config.listen.rfind("unix:", 0) != 0) {
    return InvalidArgumentError("--listen: '" + config.listen +
                                "' is not HOST:PORT (hint: e.g. 127.0.0.1:50051, or port 0)");
  }
  if (config.heartbeat_timeout.count() <= 0) {
    return InvalidArgumentError("--heartbeat-timeout: must be positive (hint: e.g. 10)");
  }
  MESHRUN_RETURN_IF_ERROR(CheckLimits(config));
  MESHRUN_ASSIGN_OR_RETURN(PathPolicy paths,
                           PathPolicy::Create(config.data_roots, config.checkpoint_roots));
  // Transport security and tokens are settled before the state is opened: a coordinator that
  // would serve in the clear where it must not never starts.
  std::optional<TlsMaterial> tls;
  if (config.tls.any()) {
    MESHRUN_ASSIGN_OR_RETURN(TlsMaterial material,
                             LoadTls(config.tls, /*need_cert_and_key=*/true, /*need_ca=*/true));
    tls = std::move(material);
  }
  if (!config.insecure && !IsLoopbackAddress(config.listen)) {
    MESHRUN_RETURN_IF_ERROR(CheckPlaintextTarget("--listen", config.listen, tls.has_value(),
                                                 /*insecure=*/false,
                                                 "--tls-cert, --tls-key and --tls-ca"));
    if (config.token_file.empty()) {
      return InvalidArgumentError(
          "--token-file: is required when --listen " + config.listen +
          " is not loopback (hint: pass --token-file FILE with one client token per line, or "
          "--insecure to leave the client API open on a trusted network)");
    }
  }
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->config_ = config;
  AuthConfig auth;
  auth.tls = tls.has_value();
  auth.token_file = config.token_file;
  CoordinatorServer* raw = s.get();
  auto placement = [raw](const std::string& worker_name, const std::string& job_id, int attempt) {
    return raw->jobs_->RunsOnWorker(worker_name, job_id, attempt);
  };
  auto worker_name = [raw](const std::string& worker_id) -> std::optional<std::string> {
    // Once per session open: a scan of the registrations is cheap enough.
    for (const WorkerSnapshot& w : raw->workers_->List()) {
      if (w.info.worker_id() == worker_id) return w.info.name();
    }
    return std::nullopt;
  };
  MESHRUN_ASSIGN_OR_RETURN(s->auth_, Authorizer::Create(auth, placement, worker_name));
  s->clock_ = clock != nullptr ? clock : &s->real_clock_;
  spdlog::info("meshrun-coordinator: {}", config.ToString());

  MESHRUN_ASSIGN_OR_RETURN(s->state_lock_, LockStateDir(config.state_dir));
  MESHRUN_ASSIGN_OR_RETURN(s->db_, StateDb::Open(config.state_dir));
  spdlog::info("state database {} (WAL, synchronous=NORMAL, FULL for acknowledged writes)",
               s->db_->path());
  StoreLimits store_limits;
  store_limits.max_value_bytes = config.max_store_value_bytes;
  store_limits.max_bytes_per_attempt = config.max_store_bytes_per_attempt;
  store_limits.max_bytes = config.max_store_bytes;
  store_limits.max_waiters = config.max_store_waits;
  store_limits.max_waiters_per_owner = config.max_store_waits_per_worker;
  store_limits.max_wait = config.max_store_wait;
  s->store_ = std::make_unique<StoreManager>(*s->clock_, store_limits, s->db_.get());
  WorkerManagerConfig wcfg;
  wcfg.lease_ttl = config.heartbeat_timeout;
  s->workers_ = std::make_unique<WorkerManager>(s->db_.get(), *s->clock_, wcfg);
  JobManagerConfig jcfg;
  jcfg.stop_resend = std::max(std::chrono::milliseconds(500), config.heartbeat_timeout / 2);
  jcfg.max_queued_jobs = config.max_pending_jobs;
  jcfg.max_queued_jobs_per_caller = config.max_pending_jobs_per_caller;
  jcfg.max_spec_bytes = config.max_spec_bytes;
  jcfg.max_stops_per_worker = config.max_stops_per_worker;
  jcfg.restart_backoff = config.restart_backoff;
  jcfg.restart_backoff_max = config.restart_backoff_max;
  jcfg.rank_series = std::make_shared<RankSeries>();
  // The ticker sends what SubmitJob placed (TickLoop; decision 0058).
  jcfg.defer_submit_assignments = true;
  s->jobs_ = std::make_unique<JobManager>(s->db_.get(), *s->workers_, *s->store_, *s->clock_, jcfg);
  if (paths.confined()) {
    spdlog::info("confined paths: {}", paths.ToString());
  } else {
    spdlog::warn(
        "paths: unconfined (no --data-root or --checkpoint-root): jobs may name any path the "
        "workers can read or write (hint: see docs/security.md, \"Confined paths\")");
  }
  ServiceOptions service_options;
  service_options.paths = std::move(paths);
  service_options.submit_rate.per_second = config.submit_rate;
  service_options.submit_rate.burst = config.submit_burst;
  service_options.max_ranks_per_report = config.max_ranks_per_report;
  s->service_ = std::make_unique<CoordinatorServiceImpl>(*s->jobs_, *s->workers_, *s->store_,
                                                         *s->clock_, std::move(service_options));
  AdapterLimits adapter_limits;
  adapter_limits.max_watch_streams = config.max_watch_streams;
  adapter_limits.max_watch_streams_per_caller = config.max_watch_streams_per_caller;
  s->grpc_service_ =
      std::make_unique<CoordinatorGrpcService>(*s->service_, adapter_limits, s->auth_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      config.listen, tls ? ServerCredentials(*tls) : grpc::InsecureServerCredentials(), &s->port_);
  // A port in use is refused: gRPC's default SO_REUSEPORT would let a second coordinator share
  // it, and the kernel would split the clients between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(config.max_receive_message_bytes);
  // Workers hold streams open for days: let them keep the connection alive.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // No bandwidth-delay-product pings: chttp2 sends one after reading data whenever none is in
  // flight, i.e. about once per session message of a worker that reports once a second (a
  // write and the ack's read and wake-up each time, decision 0063). A control plane's messages
  // are small; the default 64 KiB stream window carries them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  ConnectionLimits connections;
  connections.handshake_timeout = config.handshake_timeout;
  connections.idle_timeout = config.connection_idle_timeout;
  ApplyConnectionLimits(builder, connections);
  builder.RegisterService(s->grpc_service_.get());
  // Restore before serving, so no call sees a half-loaded coordinator.
  MESHRUN_RETURN_IF_ERROR(s->workers_->Load());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return FailedPreconditionError(
        "--listen: cannot listen on '" + config.listen +
        "': the address is in use or not this host's (hint: is another meshrun-coordinator "
        "running there? stop it, or pick another port, or port 0)");
  }
  const std::string host = !config.advertise_host.empty()      ? config.advertise_host
                           : IsWildcard(HostOf(config.listen)) ? ThisHostName()
                                                               : HostOf(config.listen);
  s->advertised_ = host + ":" + std::to_string(s->port_);
  s->jobs_->set_store_address(s->advertised_);
  MESHRUN_RETURN_IF_ERROR(s->jobs_->Load());

  if (!config.metrics_listen.empty()) {
    CoordinatorServiceImpl* service = s->service_.get();
    JobManager* jobs = s->jobs_.get();
    MESHRUN_ASSIGN_OR_RETURN(s->metrics_,
                             MetricsExporter::Start(
                                 config.metrics_listen, [jobs] { return jobs->Snapshot(); },
                                 [service] { return service->Workers(); }, jcfg.rank_series));
  }
  s->ticker_ = std::thread([raw = s.get()] { raw->TickLoop(); });
  spdlog::info("security: {}; client API {}; worker identity {}",
               tls ? "TLS, client certificates verified against --tls-ca" : "plaintext",
               s->auth_->tokens_required()
                   ? "needs one of " + std::to_string(s->auth_->token_count()) + " bearer tokens"
                   : std::string("open (no --token-file)"),
               tls ? "the client certificate's CN" : "none (no TLS)");
  spdlog::info("serving on {} (advertised {}), metrics on {}", config.listen, s->advertised_,
               s->metrics_ ? std::to_string(s->metrics_->port()) : "(off)");
  return s;
}

Status CoordinatorServer::ReloadTokens() {
  if (!auth_ || !auth_->tokens_required()) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(auth_->ReloadTokens());
  const size_t ended = grpc_service_->RecheckWatches();
  spdlog::info("--token-file {}: {} tokens accepted; {} WatchJob streams of revoked tokens ended",
               config_.token_file, auth_->token_count(), ended);
  return OkStatus();
}

size_t CoordinatorServer::watch_streams() const {
  return grpc_service_ ? grpc_service_->watch_count() : 0;
}

int CoordinatorServer::metrics_port() const {
  return metrics_ ? metrics_->port() : 0;
}

void CoordinatorServer::TickLoop() {
  // Store waits are checked every tick (their timeouts are what callers see); leases, orphaned
  // ranks and the queue every fifth (the queue is also retried on every event that frees slots).
  std::unique_lock<std::mutex> lock(mu_);
  for (int64_t n = 1; !stopping_; ++n) {
    cv_.wait_for(lock, config_.tick);
    if (stopping_) break;
    lock.unlock();
    service_->FlushAssignments();
    if (n % 5 == 0) {
      service_->Tick();
    } else {
      store_->ExpireWaiters();
    }
    lock.lock();
  }
}

void CoordinatorServer::Shutdown(std::chrono::milliseconds drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (server_) {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  }
  if (service_) service_->Shutdown();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + drain);
    server_->Wait();
  }
  metrics_.reset();
  db_.reset();
  state_lock_.reset();  // the database is closed: another coordinator may take the folder
  spdlog::info("meshrun-coordinator stopped");
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  // Destroy in reverse dependency order: the gRPC server before the handler it calls.
  server_.reset();
  grpc_service_.reset();
  service_.reset();
  jobs_.reset();
  workers_.reset();
  store_.reset();
}

}  // namespace meshrun::coordinator
