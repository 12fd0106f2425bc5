// RankSupervisor: the one fork/exec path for child processes in meshrun — the ranks of a worker,
// the ranks of `meshrun train --nproc N` (client/launcher.cc) and the daemons of `meshrun up`.
// Starts them (their own process group, stdin from /dev/null, stdout and stderr through pipes,
// SIGKILL when the supervisor's thread dies), reads their output line by line, reaps them, and
// stops them (SIGTERM to the group, SIGKILL after a grace period; whatever a child leaves in its
// group is killed when it ends). Knows nothing about gRPC.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/status.h"

namespace meshrun {

// Which rank of which attempt a process is.
struct RankKey {
  std::string job_id;
  int attempt = 0;
  int rank = 0;

  auto operator<=>(const RankKey&) const = default;
  std::string ToString() const {
    return job_id + "/" + std::to_string(attempt) + " rank " + std::to_string(rank);
  }
};

// How a rank process ended (RankExited of worker.proto).
struct RankExit {
  int exit_code = -1;    // -1 when it died of a signal or never started
  int signal = 0;        // the signal that ended it; 0 if none
  std::string error;     // launch failure, or its last stderr line when it did not exit 0
  bool stopped = false;  // ended after Stop()
};

// What to run for one rank.
struct RankSpawn {
  RankKey key;
  std::vector<std::string> argv;  // argv[0] is an absolute path (no PATH lookup)
  std::vector<std::string> env;   // the whole environment, "NAME=value"
  std::string working_dir;        // empty: the worker's own
  // Bytes the process reads on its stdin (then end of file); empty: stdin is /dev/null.
  std::string input;
  // Whether the process gets a report channel: fd 3 is the write end of a pipe whose frames
  // (line_splitter.h) arrive through Callbacks::on_frame.
  bool report_channel = false;
  // Signals the process starts with ignored (e.g. SIGHUP under nohup); all others start with
  // their default action.
  std::vector<int> ignored_signals;
};

// Owns one thread (the one that forks, so that PR_SET_PDEATHSIG fires only when the supervisor
// ends) and every process it started. Thread-safe: Start/Stop/Running may be called from any
// thread. Callbacks run on the supervisor's thread, one at a time, and must not block for long;
// they may call Start/Stop/Running.
class RankSupervisor {
 public:
  struct Callbacks {
    // The process exists (after a successful exec).
    std::function<void(const RankKey&, pid_t)> on_started;
    // One whole line of its stdout (is_stderr false) or stderr, without the newline.
    std::function<void(const RankKey&, bool is_stderr, std::string line)> on_line;
    // One whole frame of its report channel (RankSpawn::report_channel), without the length.
    std::function<void(const RankKey&, std::string frame)> on_frame;
    // Exactly once per Start that returned OK: the process ended (after its output was read),
    // or could not be started at all (exit_code −1, error says why; on_started not called).
    std::function<void(const RankKey&, const RankExit&)> on_exited;
    // How the supervisor's own lines about a rank name who wrote them (a rank killed after its
    // stop's grace period): "meshrun-worker", or "meshrun train" for the standalone launcher.
    std::string owner = "meshrun-worker";
  };

  explicit RankSupervisor(Callbacks callbacks);
  // Shutdown(5 s) if not done yet.
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Queues a start; the outcome arrives through the callbacks. ALREADY_EXISTS when that key
  // runs already, FAILED_PRECONDITION after Shutdown, INVALID_ARGUMENT for an empty argv.
  Status Start(RankSpawn spawn);

  // Stops every process of (job_id, attempt): SIGTERM to its process group now, SIGKILL after
  // `grace`. A later Stop with a shorter grace brings the SIGKILL forward (a second Ctrl-C); a
  // rank killed by a stop of no grace was killed as asked, not found hung.
  // Returns how many processes it applies to (0 when none runs).
  int Stop(const std::string& job_id, int attempt, std::chrono::milliseconds grace);
  // Stops every process.
  int StopAll(std::chrono::milliseconds grace);

  struct Running {
    RankKey key;
    pid_t pid = 0;
  };
  // Processes started and not yet reported exited (including ones still being started, with
  // pid 0), in key order.
  std::vector<Running> RunningRanks() const;
  size_t running_count() const;

  // Stops every process (as StopAll), waits until each is reported exited (bounded: grace plus
  // a few seconds after SIGKILL), then ends the thread. Later Starts fail.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  struct Proc;
  void Loop();
  void Wake();
  void Launch(Proc& proc);
  void SetResult(Proc& proc, RankExit exit);
  void PollOnce();
  void WriteInput(Proc& proc);
  void ReadReports(Proc& proc);
  void ReapAndReport();

  Callbacks callbacks_;
  mutable std::mutex mu_;
  std::map<RankKey, std::shared_ptr<Proc>> procs_;  // guarded by mu_
  bool shutting_down_ = false;                      // guarded by mu_
  bool shutdown_done_ = false;                      // guarded by mu_
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::thread thread_;
};

// This process's environment as RankSpawn::env: a child started with it inherits ours.
std::vector<std::string> InheritedEnvironment();

// Runs one process to its end as a process of a RankSupervisor, its stdout and stderr lines
// copied to ours. Returns its exit code, or -1 when it could not start or died of a signal.
int RunToEnd(std::vector<std::string> argv, std::vector<std::string> env);

}  // namespace meshrun
