// `meshrun up --workers W --slots S [--state-dir DIR]`: a local cluster in the foreground — one
// meshrun-coordinator and W meshrun-workers (binaries next to `meshrun`) on free loopback
// ports — until SIGINT/SIGTERM. LocalCluster is also what `meshrun demo` and the integration
// tests start.
#pragma once

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/command.h"
#include "common/status.h"
#include "supervisor/rank_supervisor.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterUpCommand(CLI::App& app, CommandResult& result);

struct LocalClusterOptions {
  int workers = 1;
  int slots = 1;
  std::string device = "cpu";
  std::string state_dir;  // the coordinator's --state-dir; required
  std::string work_dir;   // workers' --work-dir is <work_dir>/<name>; empty: <state_dir>/work
  std::string bin_dir;    // where meshrun-coordinator and meshrun-worker are; empty: ours
  int heartbeat_timeout_seconds = 0;  // 0: the coordinator's default
  int port = 0;                       // the coordinator's gRPC port on 127.0.0.1; 0: a free one
  int metrics_port = 0;               // its /metrics port; 0: a free one
  // Empty: the daemons' stderr lines go to ours, prefixed "[name] "; else to <log_dir>/<name>.log.
  std::string log_dir;
  std::chrono::seconds ready_timeout{30};
};

// The daemons of a local cluster, as processes of a RankSupervisor (which owns the fork/exec,
// output and stop logic, and kills them if this process dies). Thread-safe.
class LocalCluster {
 public:
  struct Daemon {
    std::string name;             // "coordinator", "worker-1", …
    std::string address;          // --listen of the coordinator; "" for workers
    std::string metrics_address;  // --metrics-listen
  };

  // Starts the coordinator, then the workers, and waits until every worker is registered and
  // READY (bounded by ready_timeout). UNAVAILABLE when a daemon ends or times out on the way.
  static StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  const std::string& coordinator_address() const { return daemons_.front().address; }
  const std::vector<Daemon>& daemons() const { return daemons_; }
  // A daemon that ended by itself, and how ("" while all run).
  std::string Dead() const;
  // Stops the workers (they stop their ranks), then the coordinator. Idempotent.
  void Stop();

 private:
  LocalCluster() = default;
  Status Spawn(const std::string& name, std::vector<std::string> argv);
  void OnLine(const RankKey& key, bool is_stderr, std::string line);
  void OnExited(const RankKey& key, const RankExit& exit);

  LocalClusterOptions options_;
  std::vector<Daemon> daemons_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<std::ofstream>> logs_;  // guarded by mu_
  std::map<std::string, std::string> dead_;                     // guarded by mu_
  bool stopping_ = false;                                       // guarded by mu_
  std::unique_ptr<RankSupervisor> supervisor_;
};

// A free TCP port on 127.0.0.1 (bound and released; another process could take it meanwhile).
StatusOr<int> FreeLoopbackPort();

// The folder of this process's executable.
std::string BinaryDir();

// Runs argv to its end with our stdout/stderr; its exit code, or -1 if it could not start.
int RunToEnd(const std::vector<std::string>& argv);

}  // namespace meshrun::client
