// `meshrun up` and LocalCluster (see up_command.h).
#include "client/up_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include "client/coordinator_client.h"
#include "common/host_resources.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct UpFlags {
  int workers = 1;
  int slots = 1;
  std::string device = "cpu";
  std::string state_dir;
  int heartbeat_timeout = 0;
  int port = 0;
  int metrics_port = 0;
};

int RunUp(const UpFlags& f) {
  LocalClusterOptions options;
  options.workers = f.workers;
  options.slots = f.slots;
  options.device = f.device;
  options.heartbeat_timeout_seconds = f.heartbeat_timeout;
  options.port = f.port;
  options.metrics_port = f.metrics_port;
  options.state_dir = f.state_dir;
  if (options.state_dir.empty()) {
    char dir[] = "/tmp/meshrun-up-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      return ReportError(InternalError("--state-dir: cannot create a temporary folder"));
    }
    options.state_dir = dir;
  }
  // SIGINT/SIGTERM are taken by sigtimedwait below; every thread started from here on (the
  // supervisor, gRPC) inherits the mask, and the daemons get a clean one.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return ReportError(cluster.status());
  for (const LocalCluster::Daemon& d : (*cluster)->daemons()) {
    std::string line = d.name;
    line.resize(std::max<size_t>(line.size(), 12), ' ');
    if (!d.address.empty()) {
      line += d.address + "  (metrics " + d.metrics_address + ", state " + options.state_dir + ")";
    } else {
      line += std::to_string(options.slots) + " " + options.device + " slots  (metrics " +
              d.metrics_address + ")";
    }
    std::cout << line << '\n';
  }
  std::cout << "export MESHRUN_COORDINATOR=" << (*cluster)->coordinator_address() << '\n'
            << "cluster up; Ctrl-C stops it" << std::endl;

  int code = kExitOk;
  while (true) {
    timespec tick{0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::cerr << "stopping the cluster (signal " << sig << ")" << std::endl;
      break;
    }
    if (const std::string dead = (*cluster)->Dead(); !dead.empty()) {
      std::cerr << "error: " << dead << " (hint: see its log lines above)" << std::endl;
      code = kExitFailure;
      break;
    }
  }
  (*cluster)->Stop();
  return code;
}

}  // namespace

StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError("cannot create a socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return UnavailableError("cannot bind a loopback port");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// True once something accepts TCP connections on 127.0.0.1:port. Polling with plain connect()
// before the first RPC keeps gRPC's channel from seeing a refused connection, after which its
// reconnect backoff delayed a local cluster's start by seconds.
bool LoopbackAccepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

std::string BinaryDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

int RunToEnd(const std::vector<std::string>& argv) {
  return meshrun::RunToEnd(argv, InheritedEnvironment());
}

StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& options) {
  if (options.workers < 1 || options.slots < 1) {
    return InvalidArgumentError("--workers: a cluster needs at least one worker with one slot");
  }
  if (options.state_dir.empty()) {
    return InvalidArgumentError("--state-dir: empty (hint: pass a folder for the coordinator)");
  }
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = options;
  const std::string bin = options.bin_dir.empty() ? BinaryDir() : options.bin_dir;
  for (const char* name : {"meshrun-coordinator", "meshrun-worker"}) {
    const std::string path = bin + "/" + name;
    if (access(path.c_str(), X_OK) != 0) {
      return FailedPreconditionError(std::string(name) + ": not found at " + path +
                                     " (hint: build it next to meshrun, e.g. `ninja " + name +
                                     "`)");
    }
  }
  std::error_code ec;
  const std::string state_dir = fs::absolute(options.state_dir).string();
  const std::string work_dir =
      options.work_dir.empty() ? state_dir + "/work" : fs::absolute(options.work_dir).string();
  fs::create_directories(state_dir, ec);
  fs::create_directories(work_dir, ec);
  if (!options.log_dir.empty()) fs::create_directories(options.log_dir, ec);

  RankSupervisor::Callbacks callbacks;
  LocalCluster* self = c.get();
  callbacks.on_line = [self](const RankKey& key, bool is_stderr, std::string line) {
    self->OnLine(key, is_stderr, std::move(line));
  };
  callbacks.on_exited = [self](const RankKey& key, const RankExit& exit) {
    self->OnExited(key, exit);
  };
  c->supervisor_ = std::make_unique<RankSupervisor>(std::move(callbacks));

  int port = options.port, metrics_port = options.metrics_port;
  for (auto [wanted, flag] :
       {std::pair{port, "--port"}, std::pair{metrics_port, "--metrics-port"}}) {
    if (wanted != 0 && LoopbackAccepts(wanted)) {
      return InvalidArgumentError(std::string(flag) + ": 127.0.0.1:" + std::to_string(wanted) +
                                  " is already in use (hint: pick another port, or leave " + flag +
                                  " out for a free one)");
    }
  }
  if (port == 0) {
    MESHRUN_ASSIGN_OR_RETURN(port, FreeLoopbackPort());
  }
  if (metrics_port == 0) {
    MESHRUN_ASSIGN_OR_RETURN(metrics_port, FreeLoopbackPort());
  }
  Daemon coordinator{"coordinator", "127.0.0.1:" + std::to_string(port),
                     "127.0.0.1:" + std::to_string(metrics_port)};
  std::vector<std::string> argv = {bin + "/meshrun-coordinator",
                                   "--listen",
                                   coordinator.address,
                                   "--metrics-listen",
                                   coordinator.metrics_address,
                                   "--state-dir",
                                   state_dir};
  if (options.heartbeat_timeout_seconds > 0) {
    argv.push_back("--heartbeat-timeout");
    argv.push_back(std::to_string(options.heartbeat_timeout_seconds));
  }
  c->daemons_.push_back(coordinator);
  MESHRUN_RETURN_IF_ERROR(c->Spawn(coordinator.name, argv));

  // Workers start once the coordinator answers, so that none begins with a failed registration
  // and a backoff.
  const Clock::time_point listen_deadline = Clock::now() + options.ready_timeout;
  while (!LoopbackAccepts(port) && Clock::now() < listen_deadline && c->Dead().empty()) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect(coordinator.address, LocalConnection());
  if (!client.ok()) return client.status();
  const Clock::time_point give_up = Clock::now() + options.ready_timeout;
  std::string last = "no answer yet";
  while (true) {
    if (const std::string dead = c->Dead(); !dead.empty()) {
      c->Stop();
      return UnavailableError(
          "local cluster: " + dead +
          (options.log_dir.empty() ? "" : " (hint: see " + options.log_dir + ")"));
    }
    StatusOr<std::vector<v1::WorkerInfo>> workers = (*client)->ListWorkers();
    if (workers.ok()) break;
    last = workers.status().message();
    if (Clock::now() > give_up) {
      c->Stop();
      return UnavailableError("local cluster: the coordinator did not answer within " +
                              std::to_string(options.ready_timeout.count()) + " s (" + last + ")");
    }
    std::this_thread::sleep_for(milliseconds(50));
  }

  // Several workers share this host's cores, counted as `train --nproc` counts them (cgroup
  // quota included), so a rank's threads, and with them its MFU peak, match `train`'s.
  const int cores = std::max(1, ProbeHostResources().cores / options.workers);
  for (int i = 1; i <= options.workers; ++i) {
    MESHRUN_ASSIGN_OR_RETURN(int worker_metrics_port, FreeLoopbackPort());
    Daemon worker{"worker-" + std::to_string(i), "",
                  "127.0.0.1:" + std::to_string(worker_metrics_port)};
    c->daemons_.push_back(worker);
    MESHRUN_RETURN_IF_ERROR(c->Spawn(
        worker.name,
        {bin + "/meshrun-worker", "--coordinator", coordinator.address, "--name", worker.name,
         "--slots", std::to_string(options.slots), "--device", options.device, "--metrics-listen",
         worker.metrics_address, "--work-dir", work_dir + "/" + worker.name, "--cores",
         std::to_string(cores), "--meshrun", bin + "/meshrun"}));
  }

  // Ready when every worker is registered and READY.
  while (true) {
    if (const std::string dead = c->Dead(); !dead.empty()) {
      c->Stop();
      return UnavailableError(
          "local cluster: " + dead +
          (options.log_dir.empty() ? "" : " (hint: see " + options.log_dir + ")"));
    }
    StatusOr<std::vector<v1::WorkerInfo>> workers = (*client)->ListWorkers();
    if (workers.ok()) {
      int ready = 0;
      for (const v1::WorkerInfo& w : *workers) ready += w.state() == v1::WORKER_STATE_READY;
      if (ready >= options.workers) break;
      last = std::to_string(ready) + " of " + std::to_string(options.workers) + " workers ready";
    } else {
      last = workers.status().message();
    }
    if (Clock::now() > give_up) {
      c->Stop();
      return UnavailableError("local cluster: not ready after " +
                              std::to_string(options.ready_timeout.count()) + " s (" + last + ")");
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  return c;
}

LocalCluster::~LocalCluster() {
  Stop();
}

Status LocalCluster::Spawn(const std::string& name, std::vector<std::string> argv) {
  if (!options_.log_dir.empty()) {
    auto log = std::make_unique<std::ofstream>(options_.log_dir + "/" + name + ".log");
    std::lock_guard<std::mutex> lock(mu_);
    logs_[name] = std::move(log);
  }
  RankSpawn spawn;
  spawn.key = RankKey{name, 0, 0};
  spawn.argv = std::move(argv);
  spawn.env = InheritedEnvironment();
  return supervisor_->Start(std::move(spawn));
}

void LocalCluster::OnLine(const RankKey& key, bool /*is_stderr*/, std::string line) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = logs_.find(key.job_id);
  if (it != logs_.end()) {
    *it->second << line << '\n';
    it->second->flush();
  } else {
    std::cerr << "[" << key.job_id << "] " << EscapeText(line) << '\n';  // a daemon's output
  }
}

void LocalCluster::OnExited(const RankKey& key, const RankExit& exit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  std::string how = exit.signal != 0 ? "killed by signal " + std::to_string(exit.signal)
                                     : "exited with code " + std::to_string(exit.exit_code);
  if (!exit.error.empty()) how += ": " + exit.error;
  dead_[key.job_id] = key.job_id + " " + how;
}

std::string LocalCluster::Dead() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dead_.empty() ? std::string() : dead_.begin()->second;
}

void LocalCluster::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || supervisor_ == nullptr) return;
    stopping_ = true;
  }
  // Workers first, so that they stop their ranks and report it while the coordinator listens.
  for (const Daemon& d : daemons_) {
    if (d.name != "coordinator") supervisor_->Stop(d.name, 0, std::chrono::seconds(20));
  }
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(25);
  while (Clock::now() < give_up && supervisor_->running_count() > 1) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  supervisor_->Shutdown(std::chrono::seconds(5));
}

void RegisterUpCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<UpFlags>();
  CLI::App* cmd = app.add_subcommand(
      "up", "Run a local cluster (coordinator + workers on loopback) in the foreground");
  cmd->add_option("--workers", f->workers, "workers to start")->check(WholeNumber(1, 64));
  cmd->add_option("--slots", f->slots, "rank slots per worker")->check(WholeNumber(1, 1024));
  cmd->add_option("--device", f->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--state-dir", f->state_dir,
                  "the coordinator's state (jobs survive a restart on the same folder); default: "
                  "a new temporary folder");
  cmd->add_option("--heartbeat-timeout", f->heartbeat_timeout,
                  "seconds without a heartbeat before a worker is LOST (default: the "
                  "coordinator's)")
      ->check(WholeNumber(1, 3600));
  cmd->add_option("--port", f->port,
                  "the coordinator's gRPC port on 127.0.0.1 (default: a free one)")
      ->check(WholeNumber(1, 65535));
  cmd->add_option("--metrics-port", f->metrics_port,
                  "the coordinator's /metrics port on 127.0.0.1 (default: a free one)")
      ->check(WholeNumber(1, 65535));
  cmd->callback([f, &result] { result.run = [f] { return RunUp(*f); }; });
}

}  // namespace meshrun::client
