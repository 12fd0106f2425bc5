// meshrun-worker: one per node. Wires the flags to a WorkerDaemon (session + rank supervisor)
// and a Prometheus endpoint, then waits for SIGTERM/SIGINT to stop its ranks and exit.
#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "common/escaped_log.h"
#include "common/exit_codes.h"
#include "common/health_server.h"
#include "common/host_resources.h"
#include "common/tls.h"
#include "engine/calibration/calibration.h"
#include "worker/gpu_inventory.h"
#include "worker/nvml.h"
#include "worker/worker_daemon.h"
#include "worker/worker_metrics.h"

namespace {

namespace fs = std::filesystem;

std::string DirOfThisBinary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

// The host part of HOST:PORT ("" when there is none).
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host;
}

int Fail(const std::string& message, int code) {
  std::cerr << "error: " << message << std::endl;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("meshrun-worker"));
  meshrun::SetEscapedLogPattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [worker] %*");

  meshrun::WorkerConfig config;
  std::string coordinator, metrics_listen, address;
  int grace_seconds = 5;
  std::string health_listen;
  CLI::App app{"meshrun-worker: runs the rank processes the coordinator assigns to this node",
               "meshrun-worker"};
  app.set_version_flag("--version", MESHRUN_VERSION);
  app.add_option("--coordinator", coordinator, "HOST:PORT of meshrun-coordinator")->required();
  app.add_option("--name", config.name, "worker name, unique in the cluster")->required();
  int slots = 0;
  app.add_option("--slots", slots,
                 "rank processes it runs at once (required on cpu; on cuda default one per GPU)")
      ->check(CLI::Range(1, 4096));
  double peak_tflops = 0;
  app.add_option("--peak-tflops", peak_tflops,
                 "dense bf16 TFLOP/s of one GPU for MFU, overriding meshrun's table by GPU name "
                 "(its ranks get MESHRUN_PEAK_TFLOPS)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", config.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT of the Prometheus endpoint (empty: none)");
  app.add_option("--work-dir", config.work_dir, "folder for each attempt's spec.yaml")->required();
  app.add_option("--address", address,
                 "address other ranks reach this node's ranks at (default: the host of "
                 "--metrics-listen, else 127.0.0.1)");
  app.add_option("--meshrun", config.meshrun_binary,
                 "the meshrun binary ranks run (default: next to this binary)");
  app.add_option("--cores", config.cores, "CPU cores its ranks share (default: all)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--grace", grace_seconds, "seconds between SIGTERM and SIGKILL on shutdown")
      ->check(CLI::Range(0, 3600));
  meshrun::TlsFiles tls_files;
  bool insecure = false;
  app.add_option("--tls-cert", tls_files.cert,
                 "PEM client certificate naming this worker (CN = --name); with --tls-key and "
                 "--tls-ca: mutual TLS, also for its ranks");
  app.add_option("--tls-key", tls_files.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", tls_files.ca,
                 "PEM CA the coordinator's certificate is verified against");
  app.add_option("--tls-server-name", tls_files.server_name,
                 "name expected in the coordinator's certificate (default: the host dialled)");
  app.add_flag("--insecure", insecure,
               "allow plaintext to a non-loopback --coordinator (trusted networks only)");
  std::vector<std::string> data_roots, checkpoint_roots;
  app.add_option("--data-root", data_roots,
                 "folder ranks may read data from (repeatable); no --data-root and no "
                 "--checkpoint-root: paths are not confined")
      ->take_all();
  app.add_option("--checkpoint-root", checkpoint_roots,
                 "folder ranks may write checkpoints to and read from (repeatable)")
      ->take_all();
  app.add_option("--rank-env", config.rank_env_pass,
                 "NAME of a variable of this worker's environment its ranks also get "
                 "(repeatable); ranks otherwise get only an allow-list (PATH, HOME, LANG, "
                 "CUDA_VISIBLE_DEVICES, NCCL_*, …)")
      ->take_all();
  app.add_option("--memory-bytes", config.memory_bytes,
                 "host memory its cpu ranks share; a rank whose estimated peak does not fit "
                 "is refused (default: physical memory; 0: no check)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 60));
  app.add_option("--health-listen", health_listen,
                 "HOST:PORT of a plaintext gRPC server with only grpc.health.v1 (for probes; "
                 "service \"\" is SERVING while the session to the coordinator is up, "
                 "\"liveness\" while the process runs; empty: off)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return Fail(std::string(e.what()) + " (hint: run 'meshrun-worker --help')", 2);
  }

  // Slots: given on cpu; on cuda one per GPU this node offers unless fewer are asked for.
  if (config.device == "cuda") {
    std::vector<meshrun::GpuDevice> listed;
    std::string why;
    auto nvml = meshrun::Nvml::Load();
    if (nvml.ok()) {
      listed = (*nvml)->Devices();
    } else {
      why = std::string(nvml.status().message());
      why = why.substr(0, why.find(" (hint: "));  // this message brings its own hint
    }
    auto gpus = meshrun::CudaInventory(listed, std::getenv("CUDA_VISIBLE_DEVICES"), why);
    if (!gpus.ok()) return Fail(gpus.status().message(), 2);
    auto n = meshrun::CudaSlots(static_cast<int>(gpus->size()), slots);
    if (!n.ok()) return Fail(n.status().message(), 2);
    config.slots = *n;
    config.gpus = std::move(gpus).value();
    config.peak_tflops = peak_tflops;
  } else {
    if (slots < 1) {
      return Fail(
          "--slots: required with --device cpu (hint: e.g. --slots 4, the rank "
          "processes this worker runs at once)",
          2);
    }
    config.slots = slots;
    if (peak_tflops > 0) {
      return Fail(
          "--peak-tflops: applies to --device cuda only (hint: cpu ranks measure their "
          "float32 GEMM rate; leave the flag out)",
          2);
    }
  }

  if (config.meshrun_binary.empty()) config.meshrun_binary = DirOfThisBinary() + "/meshrun";
  if (access(config.meshrun_binary.c_str(), X_OK) != 0) {
    return Fail("--meshrun: " + config.meshrun_binary +
                    " is not an executable (hint: install meshrun next to meshrun-worker)",
                2);
  }
  if (address.empty()) {
    const std::string host = HostOf(metrics_listen);
    address = (host.empty() || host == "0.0.0.0" || host == "::") ? "127.0.0.1" : host;
  }
  config.address = address;
  // NCCL's bootstrap and socket transport use the interface peers reach this node at, unless
  // the operator chose one (NCCL_SOCKET_IFNAME in the worker's environment reaches its ranks).
  if (config.device == "cuda" && std::getenv("NCCL_SOCKET_IFNAME") == nullptr) {
    config.nccl_ifname = meshrun::InterfaceOf(address);
    if (config.nccl_ifname.empty()) {
      spdlog::warn(
          "--address {}: no local interface holds it; ranks get no NCCL_SOCKET_IFNAME "
          "(hint: set NCCL_SOCKET_IFNAME for the worker)",
          address);
    }
  }
  config.metrics_address = metrics_listen;
  // What this node offers unless told: the host's figures capped by its cgroup (a container's
  // memory limit and CPU quota), the same probe the planner and the pre-flight checks read.
  const meshrun::HostResources host = meshrun::ProbeHostResources();
  if (config.cores < 1 || !app.count("--cores")) config.cores = host.cores;
  if (!app.count("--memory-bytes")) config.memory_bytes = static_cast<int64_t>(host.memory_bytes);
  for (const std::string& name : config.rank_env_pass) {
    if (name.empty() || name.find('=') != std::string::npos || name.rfind("MESHRUN_", 0) == 0) {
      return Fail("--rank-env: '" + name +
                      "' is not a variable name ranks may get (hint: pass a NAME without '=', "
                      "not one of the MESHRUN_* variables the worker sets itself)",
                  2);
    }
  }
  config.default_grace = std::chrono::seconds(grace_seconds);
  std::error_code ec;
  fs::create_directories(config.work_dir, ec);
  if (ec) return Fail("--work-dir: cannot create " + config.work_dir + ": " + ec.message(), 2);
  config.work_dir = fs::absolute(config.work_dir).string();
  auto paths = meshrun::PathPolicy::Create(data_roots, checkpoint_roots);
  if (!paths.ok()) return Fail(paths.status().message(), 2);
  config.paths = std::move(paths).value();
  if (config.paths.confined()) {
    spdlog::info("confined paths: {}", config.paths.ToString());
  } else {
    spdlog::warn(
        "paths: unconfined (no --data-root or --checkpoint-root): ranks may read and write any "
        "path this worker can (hint: see docs/security.md, \"Confined paths\")");
  }

  // Signals are taken by sigwait below; every thread created from here on inherits the mask
  // (rank processes get a clean one).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<meshrun::WorkerMetrics> metrics;
  if (!metrics_listen.empty()) {
    auto created = meshrun::WorkerMetrics::Create(metrics_listen, config.name, config.slots);
    if (!created.ok()) return Fail(created.status().message(), 1);
    metrics = std::move(created).value();
  }
  std::unique_ptr<meshrun::HealthServer> health;
  if (!health_listen.empty()) {
    auto started = meshrun::HealthServer::Start(health_listen, /*ready=*/false);
    if (!started.ok()) {
      return Fail(started.status().message(), meshrun::ExitCodeFor(started.status()));
    }
    health = std::move(started).value();
  }

  // Transport security: mutual TLS with this worker's certificate, or plaintext to a loopback
  // coordinator (or with --insecure). Ranks get the same files (absolute: they run elsewhere).
  std::optional<meshrun::TlsMaterial> tls;
  if (tls_files.any()) {
    auto loaded = meshrun::LoadTls(tls_files, /*need_cert_and_key=*/true, /*need_ca=*/true);
    if (!loaded.ok()) return Fail(loaded.status().message(), 2);
    tls = std::move(loaded).value();
    for (std::string* path : {&tls_files.cert, &tls_files.key, &tls_files.ca}) {
      *path = fs::absolute(*path).string();
    }
    config.rank_tls = tls_files;
  } else if (!tls_files.server_name.empty()) {
    return Fail("--tls-server-name: needs TLS (hint: pass --tls-cert, --tls-key and --tls-ca)", 2);
  }
  if (meshrun::Status plain =
          meshrun::CheckPlaintextTarget("--coordinator", coordinator, tls.has_value(), insecure,
                                        "--tls-cert, --tls-key and --tls-ca");
      !plain.ok()) {
    return Fail(plain.message(), 2);
  }

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  // Re-resolve the coordinator's name soon after a failure (a restarted pod behind a headless
  // Service has a new address); gRPC's default waits 30 s.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  meshrun::ApplyServerName(tls ? &*tls : nullptr, &args);
  auto channel = grpc::CreateCustomChannel(
      coordinator, meshrun::ChannelCredentials(tls ? &*tls : nullptr), args);
  std::shared_ptr<meshrun::v1::CoordinatorService::StubInterface> stub =
      meshrun::v1::CoordinatorService::NewStub(channel);

  // The planner's figures for this host, measured once (a few hundred ms) and reported in the
  // registration: the coordinator keeps them per worker (docs/planning.md "Calibration").
  if (config.device == "cpu") {
    meshrun::CalibrationOptions calibration;
    calibration.ranks = std::max(2, std::min(config.slots, 4));
    calibration.bytes = size_t{1} << 20;
    calibration.iterations = 3;
    meshrun::StatusOr<meshrun::HostCalibration> measured = meshrun::CalibrateHost(calibration);
    if (measured.ok()) {
      meshrun::v1::HostCalibration* c = config.session.registration.mutable_calibration();
      c->set_gemm_flops(measured->gemm_flops);
      c->set_loopback_bus_bandwidth(measured->loopback_bus_bandwidth);
      c->set_loopback_latency_seconds(measured->loopback_latency);
      c->set_loopback_ranks(measured->loopback_ranks);
    } else {
      spdlog::warn("calibration failed ({}); the planner uses its table for this worker",
                   measured.status().ToString());
    }
  }
  meshrun::WorkerDaemon daemon(config, stub, metrics.get());
  spdlog::info("worker {} ({} {} slots, ranks at {}, work dir {}) connecting to {}", config.name,
               config.slots, config.device, config.address, config.work_dir, coordinator);
  if (!config.gpus.empty()) {
    spdlog::info("GPUs: {}; NCCL_SOCKET_IFNAME for ranks: {}", meshrun::DescribeGpus(config.gpus),
                 config.nccl_ifname.empty() ? std::string("(not set)") : config.nccl_ifname);
  }
  daemon.Start();

  int exit_code = 0;
  while (true) {
    timespec tick{0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (health) health->SetReady(daemon.session().connected());
    if (sig == SIGTERM || sig == SIGINT) {
      spdlog::info("received signal {}; stopping ranks", sig);
      break;
    }
    if (meshrun::Status fatal = daemon.fatal(); !fatal.ok()) {
      // The coordinator's refusal, which may quote what it was sent.
      std::cerr << "error: " << meshrun::EscapeText(fatal.message(), /*keep_tab=*/false)
                << std::endl;
      exit_code = 2;
      break;
    }
  }
  if (health) health->Shutdown();
  daemon.Shutdown(config.default_grace);
  return exit_code;
}
