// The standalone launcher (see launcher.h): the ranks run as processes of a RankSupervisor
// (supervisor/, which owns fork/exec, output and the SIGTERM → grace → SIGKILL sequence); this
// file adds the launcher's policy — rank environment, output relay, stop-all on the first
// failure, the launcher's own SIGINT/SIGTERM (self-pipe) — and the error line.
#include "client/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "client/command.h"
#include "supervisor/rank_supervisor.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// After SIGKILL, how long to wait for the kernel to finish a rank (e.g. one stuck in I/O).
constexpr std::chrono::milliseconds kWaitAfterKill{10000};

// The write end of the self-pipe; the handlers put one byte (the signal number) into it.
std::atomic<int> g_signal_pipe{-1};
std::atomic<bool> g_launch_active{false};

void OnSignal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);  // a full pipe already wakes the loop
  }
  errno = saved_errno;
}

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGCHLD};

// Installs OnSignal for SIGINT, SIGTERM and SIGCHLD for the lifetime of a Launch and puts
// back whatever was there before.
class SignalHandlers {
 public:
  explicit SignalHandlers(int pipe_write_fd) {
    g_signal_pipe.store(pipe_write_fd);
    struct sigaction action {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      sigaction(kHandledSignals[i], &action, &previous_[i]);
    }
  }
  ~SignalHandlers() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      sigaction(kHandledSignals[i], &previous_[i], nullptr);
    }
    g_signal_pipe.store(-1);
  }
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;

  // The signals that were ignored before the launcher took them (e.g. under nohup): the ranks
  // start with them ignored too.
  std::vector<int> IgnoredBefore() const {
    std::vector<int> ignored;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      if (previous_[i].sa_handler == SIG_IGN) ignored.push_back(kHandledSignals[i]);
    }
    struct sigaction current {};
    for (int sig : {SIGHUP, SIGPIPE, SIGQUIT}) {
      if (sigaction(sig, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) {
        ignored.push_back(sig);
      }
    }
    return ignored;
  }

 private:
  struct sigaction previous_[std::size(kHandledSignals)]{};
};

// Writes all of `data` to `fd`, retrying short writes and EINTR. One call per line keeps lines
// whole (pipes and terminals do not split a write of a line-sized buffer in practice).
void WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void PrintError(const std::string& message) {
  WriteAll(STDERR_FILENO, "error: " + message + "\n");
}

// "SIGKILL (9)".
std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  std::string name = abbrev != nullptr ? std::string("SIG").append(abbrev) : std::string("signal");
  name.append(" (").append(std::to_string(sig)).append(")");
  return name;
}

// `name` itself when it holds a '/', else the first executable file of that name in PATH.
std::optional<std::string> FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const size_t colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);  // empty means the current folder
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate.append("/").append(name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

std::string NewRunId() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                        static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                        (static_cast<uint64_t>(getpid()) << 16);
  char text[32];
  std::snprintf(text, sizeof(text), "run-%012llx",
                static_cast<unsigned long long>(bits & 0xffffffffffffULL));
  return text;
}

// What the launcher knows of one rank; guarded by RankGroup::mu_.
struct RankState {
  pid_t pid = 0;
  bool started = false;
  bool exited = false;
  RankExit exit;
  std::string last_err_line;
};

// Why the run stopped early.
struct Failure {
  int rank = -1;
  bool start_failed = false;  // the rank's process could not be started at all
  RankExit exit;
};

// The ranks of one Launch, run by a RankSupervisor (the one fork/exec path of meshrun): relays
// their output, turns the first failure into a stop of the others and reports the outcome.
// The supervisor's callbacks run on its thread; the launching thread waits in Run for exits
// and for the launcher's own signals (both arrive on the self-pipe). Lives inside Launch.
class RankGroup {
 public:
  RankGroup(const LaunchOptions& options, int signal_pipe_read, int signal_pipe_write)
      : options_(options),
        signal_pipe_(signal_pipe_read),
        wake_pipe_(signal_pipe_write),
        ranks_(static_cast<size_t>(options.nproc)) {}

  // Queues every rank. On failure the ranks already queued are being stopped.
  void Start(const std::string& executable, const std::string& store_dir, const std::string& run_id,
             const std::vector<int>& ignored_signals);
  // Waits until every rank has been reported exited (bounded after SIGKILL).
  void Run();
  // The exit code for the process, printing the error line when there is one.
  int Finish();

 private:
  void OnLine(int rank, bool is_stderr, std::string line);
  void OnExited(int rank, const RankExit& exit);
  void BeginStopLocked(std::chrono::milliseconds grace);
  std::string Label(int rank) const;
  size_t RunningLocked() const;

  const LaunchOptions& options_;
  int signal_pipe_;
  int wake_pipe_;
  std::string run_id_;
  mutable std::mutex mu_;
  std::vector<RankState> ranks_;    // guarded by mu_
  std::optional<Failure> failure_;  // guarded by mu_
  int interrupt_signal_ = 0;        // guarded by mu_
  size_t interrupted_ranks_ = 0;    // guarded by mu_
  bool stopping_ = false;           // guarded by mu_
  Clock::time_point kill_at_{};     // guarded by mu_
  std::unique_ptr<RankSupervisor> supervisor_;
};

void RankGroup::Start(const std::string& executable, const std::string& store_dir,
                      const std::string& run_id, const std::vector<int>& ignored_signals) {
  run_id_ = run_id;
  RankSupervisor::Callbacks callbacks;
  callbacks.on_started = [this](const RankKey& key, pid_t pid) {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_[key.rank].pid = pid;
    ranks_[key.rank].started = true;
  };
  callbacks.on_line = [this](const RankKey& key, bool is_stderr, std::string line) {
    OnLine(key.rank, is_stderr, std::move(line));
  };
  if (options_.on_report) {
    callbacks.on_frame = [this](const RankKey& key, std::string frame) {
      options_.on_report(key.rank, std::move(frame));
    };
  }
  callbacks.on_exited = [this](const RankKey& key, const RankExit& exit) {
    OnExited(key.rank, exit);
  };
  callbacks.owner = "meshrun train";  // standalone: no worker, no stop orders
  supervisor_ = std::make_unique<RankSupervisor>(std::move(callbacks));
  for (int r = 0; r < options_.nproc; ++r) {
    RankSpawn spawn;
    spawn.key = RankKey{run_id, 0, r};
    spawn.argv = options_.argv;
    spawn.argv[0] = executable;
    // A rank learns its place from its input (the RankStart), never from variables.
    spawn.env = InheritedEnvironment();
    spawn.ignored_signals = ignored_signals;
    spawn.input = options_.rank_input(r, store_dir);
    spawn.report_channel = static_cast<bool>(options_.on_report);
    if (Status s = supervisor_->Start(std::move(spawn)); !s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (int q = r; q < options_.nproc; ++q) {
        ranks_[q].exited = true;
        ranks_[q].exit = RankExit{-1, 0, s.message(), false};
      }
      if (!failure_) failure_ = Failure{r, true, ranks_[r].exit};
      BeginStopLocked(options_.grace);
      break;
    }
  }
}

std::string RankGroup::Label(int rank) const {
  if (rank >= 0 && static_cast<size_t>(rank) < options_.rank_labels.size() &&
      !options_.rank_labels[rank].empty()) {
    return options_.rank_labels[rank];
  }
  return "rank " + std::to_string(rank);
}

size_t RankGroup::RunningLocked() const {
  return static_cast<size_t>(
      std::count_if(ranks_.begin(), ranks_.end(), [](const RankState& r) { return !r.exited; }));
}

void RankGroup::BeginStopLocked(std::chrono::milliseconds grace) {
  if (stopping_) return;
  stopping_ = true;
  kill_at_ = Clock::now() + grace;
  supervisor_->Stop(run_id_, 0, grace);
}

// Rank 0's stdout passes through unchanged (so `-o json` stays clean); every other line goes to
// stderr prefixed "[rank R] ". One write per line, on the supervisor's thread: never interleaved.
void RankGroup::OnLine(int rank, bool is_stderr, std::string line) {
  if (is_stderr && line.find_first_not_of(" \t\r") != std::string::npos) {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_[rank].last_err_line = line;
  }
  if (options_.before_line) options_.before_line();
  if (!is_stderr && rank == 0) {
    line += '\n';
    WriteAll(STDOUT_FILENO, line);
    return;
  }
  std::string text = "[rank " + std::to_string(rank) + "] ";
  text += line;
  text += '\n';
  WriteAll(STDERR_FILENO, text);
}

void RankGroup::OnExited(int rank, const RankExit& exit) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RankState& r = ranks_[rank];
    r.exited = true;
    r.exit = exit;
    const bool ok = r.started && exit.exit_code == 0;
    if (!ok && !stopping_) {
      failure_ = Failure{rank, !r.started, exit};
      BeginStopLocked(options_.grace);
    }
  }
  const unsigned char wake = 0;  // not a signal number: only wakes Run
  [[maybe_unused]] ssize_t n = write(wake_pipe_, &wake, 1);
}

void RankGroup::Run() {
  std::optional<Clock::time_point> give_up_at;
  while (true) {
    unsigned char bytes[64];
    ssize_t n;
    while ((n = read(signal_pipe_, bytes, sizeof(bytes))) > 0 || (n < 0 && errno == EINTR)) {
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = bytes[i];
        if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD and exits only wake the loop
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) {
          // A second request (or one during a stop already under way): do not wait any longer.
          kill_at_ = std::min(kill_at_, Clock::now());
          supervisor_->Stop(run_id_, 0, std::chrono::milliseconds(0));
        } else if (RunningLocked() > 0) {
          interrupt_signal_ = sig;
          interrupted_ranks_ = RunningLocked();
          WriteAll(STDERR_FILENO,
                   "\ninterrupt: the ranks stop at the end of this step (with a checkpoint when "
                   "checkpoint.dir is set); press Ctrl-C again to stop them at once\n");
          BeginStopLocked(options_.interrupt_grace);
        }
      }
    }
    Clock::time_point wake = Clock::now() + std::chrono::seconds(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (RunningLocked() == 0) return;
      if (stopping_) {
        if (!give_up_at) give_up_at = kill_at_ + kWaitAfterKill;
        give_up_at = std::min(*give_up_at, kill_at_ + kWaitAfterKill);
        if (Clock::now() >= *give_up_at) break;
        wake = std::min(wake, *give_up_at);
      }
    }
    const auto timeout_ms = std::chrono::ceil<std::chrono::milliseconds>(
        std::max(wake - Clock::now(), Clock::duration::zero()));
    pollfd fd{signal_pipe_, POLLIN, 0};
    poll(&fd, 1, static_cast<int>(timeout_ms.count()));
  }
  // Left on the bound: say who is still there; the supervisor's shutdown gives up on them.
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].exited) continue;
    WriteAll(STDERR_FILENO, "warning: " + Label(static_cast<int>(r)) + " (pid " +
                                std::to_string(ranks_[r].pid) +
                                ") did not exit after SIGKILL; leaving it\n");
  }
}

int RankGroup::Finish() {
  supervisor_->Shutdown(std::chrono::milliseconds(0));
  std::lock_guard<std::mutex> lock(mu_);
  if (interrupt_signal_ != 0) {
    // Ranks that stopped at a step boundary exit 130 (or 0 when they had just finished).
    std::string unclean;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const int code = ranks_[r].exit.exit_code;
      if (code != kExitOk && code != kExitInterrupted)
        unclean += (unclean.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!unclean.empty()) {
      PrintError("interrupted (signal " + std::to_string(interrupt_signal_) + "); stopped " +
                 std::to_string(interrupted_ranks_) + " ranks; rank(s) " + unclean +
                 " did not stop at a step boundary (hint: the checkpoint of this run may be "
                 "older than its last step)");
    }
    return kExitInterrupted;
  }
  if (!failure_) return 0;
  const int rank = failure_->rank;
  const RankExit& exit = failure_->exit;
  if (failure_->start_failed) {
    PrintError(Label(rank) + " failed: " + exit.error +
               " (hint: check the rank command, and the process and file-descriptor limits, "
               "`ulimit -u` and `ulimit -n`)");
    return kExitFailure;
  }
  std::string how;
  std::string hint;
  const bool invalid_input = exit.exit_code == 2;
  if (exit.signal != 0) {
    how = "killed by signal " + SignalName(exit.signal);
    hint = exit.signal == SIGKILL
               ? "a SIGKILL nobody asked for is usually the out-of-memory killer; see `dmesg`"
               : "its output above is prefixed [rank " + std::to_string(rank) + "]";
  } else {
    how = "exit code " + std::to_string(exit.exit_code);
    hint = invalid_input ? "the rank rejected its input; fix what it names and run again"
                         : "its output above is prefixed [rank " + std::to_string(rank) +
                               "]; the other ranks were stopped";
  }
  std::string message = Label(rank) + " failed: " + how;
  std::string last = ranks_[rank].last_err_line;
  if (last.rfind("error: ", 0) == 0) last.erase(0, 7);  // avoid "error: ...: error: ..."
  if (last.size() > 500) last = last.substr(0, 500) + "...";
  if (!last.empty()) message += ": " + last;
  PrintError(message + " (hint: " + hint + ")");
  return invalid_input ? kExitInvalidInput : kExitFailure;
}

}  // namespace

std::string SelfExecutable() {
  std::error_code ec;
  const fs::path path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : path.string();
}

int Launch(const LaunchOptions& options) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (options.argv.empty() || options.argv[0].empty()) {
    PrintError("launcher: no command to run (hint: pass the rank command in LaunchOptions.argv)");
    return kExitInvalidInput;
  }
  if (options.nproc < 1) {
    PrintError("--nproc: must be at least 1 but is " + std::to_string(options.nproc) +
               " (hint: pass the number of rank processes, e.g. --nproc 4)");
    return kExitInvalidInput;
  }
  if (!options.rank_input) {
    PrintError(
        "launcher: no rank input (hint: set LaunchOptions.rank_input to each rank's "
        "RankStart)");
    return kExitInvalidInput;
  }
  const std::optional<std::string> executable = FindExecutable(options.argv[0]);
  if (!executable) {
    PrintError("launcher: " + options.argv[0] +
               ": not found in PATH (hint: give the rank command as an absolute path)");
    return kExitInvalidInput;
  }
  if (g_launch_active.exchange(true)) {
    PrintError("launcher: another Launch is running in this process (hint: one at a time)");
    return kExitFailure;
  }
  struct ActiveGuard {
    ~ActiveGuard() { g_launch_active.store(false); }
  } active_guard;

  // The run folder, with an empty store folder in it.
  std::string run_dir = options.run_dir;
  bool created_run_dir = false;
  std::error_code ec;
  if (run_dir.empty()) {
    char pattern[] = "/tmp/meshrun-run-XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      PrintError(std::string("launcher: cannot create a run folder under /tmp: ") +
                 std::strerror(errno) + " (hint: check that /tmp is writable and has space)");
      return kExitFailure;
    }
    run_dir = pattern;
    created_run_dir = true;
  }
  struct RunDirGuard {
    std::string dir;
    bool remove;
    ~RunDirGuard() {
      std::error_code ignored;
      if (remove) fs::remove_all(dir, ignored);
    }
  } run_dir_guard{run_dir, created_run_dir};
  const std::string store_dir = (fs::path(run_dir) / "store").string();
  fs::remove_all(store_dir, ec);
  fs::create_directories(store_dir, ec);
  if (ec) {
    PrintError("launcher: cannot create the store folder " + store_dir + ": " + ec.message() +
               " (hint: pick a writable run folder)");
    return kExitFailure;
  }

  int signal_pipe[2];
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    PrintError(std::string("launcher: pipe: ") + std::strerror(errno) +
               " (hint: check the file-descriptor limit, `ulimit -n`)");
    return kExitFailure;
  }
  int exit_code = kExitFailure;
  {
    SignalHandlers handlers(signal_pipe[1]);
    RankGroup group(options, signal_pipe[0], signal_pipe[1]);
    group.Start(*executable, store_dir, NewRunId(), handlers.IgnoredBefore());
    group.Run();
    exit_code = group.Finish();
  }
  close(signal_pipe[0]);
  close(signal_pipe[1]);
  return exit_code;
}

}  // namespace meshrun::client
