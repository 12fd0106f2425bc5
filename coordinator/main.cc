// meshrun-coordinator: flags to a CoordinatorConfig, start, wait for SIGTERM or SIGINT, stop.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "common/escaped_log.h"
#include "common/exit_codes.h"
#include "common/health_server.h"
#include "coordinator/connection_limits.h"
#include "coordinator/server.h"

#ifdef MESHRUN_ABSL_SYNCHRONIZATION
#include <absl/synchronization/mutex.h>
#endif

int main(int argc, char** argv) {
#ifdef MESHRUN_ABSL_SYNCHRONIZATION
  // gRPC's mutexes are absl's; a distribution build of absl without NDEBUG tracks every lock
  // in a global lock-order graph (behind one global spinlock) on every acquisition, a few
  // percent of the coordinator's CPU per session message and a point every thread meets
  // (decision 0058). Lock-order bugs are for the sanitizer builds to find.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  CLI::App app{"meshrun-coordinator: the control plane of a meshrun cluster",
               "meshrun-coordinator"};
  app.set_version_flag("--version", MESHRUN_VERSION);
  meshrun::coordinator::CoordinatorConfig config;
  double heartbeat_timeout_s = 10;
  std::string log_level = "info";
  std::string health_listen;
  app.add_option("--listen", config.listen, "HOST:PORT for the gRPC API (port 0: pick one)")
      ->capture_default_str();
  app.add_option("--metrics-listen", config.metrics_listen,
                 "HOST:PORT for Prometheus /metrics (empty: off)");
  app.add_option("--state-dir", config.state_dir, "folder of the SQLite state database")
      ->required();
  app.add_option("--heartbeat-timeout", heartbeat_timeout_s,
                 "seconds a worker may stay silent before it is LOST")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 86400.0));
  app.add_option("--advertise-address", config.advertise_host,
                 "host the ranks dial for the store (default: the --listen host, or this "
                 "machine's name for a wildcard)");
  app.add_option("--tls-cert", config.tls.cert,
                 "PEM certificate of this coordinator; with --tls-key and --tls-ca: TLS");
  app.add_option("--tls-key", config.tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", config.tls.ca,
                 "PEM CA the workers' client certificates are verified against (the CN of a "
                 "worker's certificate is its name)");
  app.add_option("--token-file", config.token_file,
                 "accepted client bearer tokens, one per line, '#' comments; re-read on SIGHUP "
                 "(none: the client API is open, allowed only on loopback)");
  app.add_flag("--insecure", config.insecure,
               "allow plaintext and an open client API on a non-loopback --listen (trusted "
               "networks only)");
  app.add_option("--health-listen", health_listen,
                 "HOST:PORT of a plaintext gRPC server with only grpc.health.v1 (for probes; "
                 "empty: off)");
  // Confined paths and limits (docs/security.md).
  app.add_option("--data-root", config.data_roots,
                 "folder jobs may read data from (repeatable); no --data-root and no "
                 "--checkpoint-root: paths are not confined")
      ->take_all();
  app.add_option("--checkpoint-root", config.checkpoint_roots,
                 "folder jobs may write checkpoints to and read from (repeatable)")
      ->take_all();
  app.add_option("--max-request-bytes", config.max_receive_message_bytes,
                 "largest gRPC request accepted")
      ->capture_default_str()
      ->check(CLI::Range(64 * 1024, 1 << 30));
  app.add_option("--max-spec-bytes", config.max_spec_bytes,
                 "largest job spec accepted (its YAML and fields, serialized)")
      ->capture_default_str();
  app.add_option("--max-pending-jobs", config.max_pending_jobs,
                 "PENDING jobs beyond which SubmitJob is refused")
      ->capture_default_str();
  app.add_option("--submit-rate", config.submit_rate,
                 "SubmitJob calls per second per caller (token or peer host); 0: no limit")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--submit-burst", config.submit_burst,
                 "SubmitJob calls a caller may make at once after a quiet spell")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--max-store-value-bytes", config.max_store_value_bytes,
                 "largest value of one rendezvous store key")
      ->capture_default_str();
  app.add_option("--max-store-bytes-per-attempt", config.max_store_bytes_per_attempt,
                 "rendezvous store bytes one attempt may hold")
      ->capture_default_str();
  app.add_option("--max-store-bytes", config.max_store_bytes,
                 "rendezvous store bytes all attempts together may hold")
      ->capture_default_str();
  app.add_option("--max-ranks-per-report", config.max_ranks_per_report,
                 "ranks one worker heartbeat (or session open) may list")
      ->capture_default_str();
  app.add_option("--max-stops-per-worker", config.max_stops_per_worker,
                 "stop orders for unknown attempts outstanding per worker")
      ->capture_default_str();
  double restart_backoff_s = 1, restart_backoff_max_s = 300;
  app.add_option("--restart-backoff", restart_backoff_s,
                 "seconds before a job's first restart; doubles with each further one")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--restart-backoff-max", restart_backoff_max_s,
                 "longest wait before a restart, in seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  // Per-caller limits and connections (docs/security.md "Limits").
  double max_store_wait_s = 1800, handshake_timeout_s = 10, connection_idle_timeout_s = 300;
  app.add_option("--max-pending-jobs-per-caller", config.max_pending_jobs_per_caller,
                 "PENDING jobs one caller (token, or host without --token-file) may have")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}));
  app.add_option("--max-watch-streams", config.max_watch_streams,
                 "WatchJob streams open at once, all callers")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}));
  app.add_option("--max-watch-streams-per-caller", config.max_watch_streams_per_caller,
                 "WatchJob streams one caller may hold open")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}));
  app.add_option("--max-store-waits", config.max_store_waits,
                 "rendezvous StoreGet calls waiting at once, all workers")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}));
  app.add_option("--max-store-waits-per-worker", config.max_store_waits_per_worker,
                 "StoreGet calls of one worker (its certificate; its host without TLS) waiting "
                 "at once")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{10'000'000}));
  app.add_option("--max-store-wait", max_store_wait_s,
                 "longest StoreGet wait in seconds; a longer client timeout is clamped to it")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0 * 7));
  app.add_option("--handshake-timeout", handshake_timeout_s,
                 "seconds a new connection has to finish its TLS and HTTP/2 handshake")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--connection-idle-timeout", connection_idle_timeout_s,
                 "seconds a connection without calls stays open")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0 * 7));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (hint: meshrun-coordinator --help)\n", e.what());
    return 2;
  }
  config.heartbeat_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(heartbeat_timeout_s * 1000));
  config.restart_backoff =
      std::chrono::milliseconds(static_cast<int64_t>(restart_backoff_s * 1000));
  config.restart_backoff_max =
      std::chrono::milliseconds(static_cast<int64_t>(restart_backoff_max_s * 1000));
  config.max_store_wait = std::chrono::milliseconds(static_cast<int64_t>(max_store_wait_s * 1000));
  config.handshake_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(handshake_timeout_s * 1000));
  config.connection_idle_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(connection_idle_timeout_s * 1000));
  spdlog::set_default_logger(spdlog::stderr_color_mt("coordinator"));
  // spdlog's default layout, the message escaped (common/escaped_log.h).
  meshrun::SetEscapedLogPattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %*");
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Descriptors: as many as allowed, and a guard so that running out of them never stops the
  // listener (coordinator/connection_limits.h).
  const meshrun::coordinator::OpenFiles open_files = meshrun::coordinator::RaiseOpenFilesLimit();
  const std::string accept_guard = meshrun::coordinator::InstallAcceptGuard();

  // Block the stop signals in every thread (gRPC's included) and wait for them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto server = meshrun::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "error: %s\n", server.status().message().c_str());
    return meshrun::ExitCodeFor(server.status());
  }
  spdlog::info("{}", open_files.message);
  spdlog::info("{}", accept_guard);
  std::unique_ptr<meshrun::HealthServer> health;
  if (!health_listen.empty()) {
    auto started = meshrun::HealthServer::Start(health_listen, /*ready=*/true);
    if (!started.ok()) {
      std::fprintf(stderr, "error: %s\n", started.status().message().c_str());
      (*server)->Shutdown();
      return meshrun::ExitCodeFor(started.status());
    }
    health = std::move(started).value();
  }
  // One line on stdout that scripts and tests read to learn the ports ("health N" only with
  // --health-listen).
  std::printf("meshrun-coordinator listening on %s metrics %d",
              (*server)->advertised_address().c_str(), (*server)->metrics_port());
  if (health) std::printf(" health %d", health->port());
  std::printf("\n");
  std::fflush(stdout);

  int sig = 0;
  // SIGHUP re-reads --token-file; SIGTERM and SIGINT stop.
  while (sigwait(&stop, &sig) == 0 && sig == SIGHUP) {
    meshrun::Status reloaded = (*server)->ReloadTokens();
    if (!reloaded.ok()) spdlog::error("SIGHUP: {} (the tokens in use stay)", reloaded.message());
  }
  spdlog::info("received {}, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  if (health) health->Shutdown();
  (*server)->Shutdown();
  server.value().reset();
  // Everything of ours is closed (the database included). Skip the static teardown: gRPC's
  // library shutdown can wait seconds for idle client connections to go away.
  spdlog::shutdown();
  std::fflush(nullptr);
  std::_Exit(0);
}
