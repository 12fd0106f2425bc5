// The standalone launcher (see launcher.h): fork/exec of the ranks, a poll() loop that relays
// their output line by line and notices exits and signals (self-pipe), and the stop sequence
// SIGTERM → grace → SIGKILL → reap.
#include "client/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "client/command.h"

extern char** environ;

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A rank line longer than this without a newline is written out in pieces.
constexpr size_t kMaxLineBytes = 1 << 16;
// After every rank has exited, how long to keep reading output that a rank's leftover
// children still hold open.
constexpr std::chrono::milliseconds kDrainAfterExit{2000};
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

  // What a rank starts with: SIG_IGN stays ignored (e.g. under nohup), anything else default.
  struct sigaction ChildAction(size_t i) const {
    struct sigaction action {};
    action.sa_handler = previous_[i].sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
    sigemptyset(&action.sa_mask);
    return action;
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

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
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

// The environment of this process with our four variables replaced.
std::vector<std::string> RankEnvironment(int rank, int world_size, const std::string& store_dir,
                                         const std::string& run_id) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {kEnvRank, std::to_string(rank)},
      {kEnvWorldSize, std::to_string(world_size)},
      {kEnvStoreDir, store_dir},
      {kEnvRunId, run_id}};
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view var(*entry);
    const std::string_view name = var.substr(0, var.find('='));
    const bool replaced =
        std::any_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env.emplace_back(var);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// One rank process and what we know about it. Owned by the Supervisor.
struct Rank {
  int index = 0;
  pid_t pid = -1;
  int out_fd = -1;  // read ends of the rank's stdout and stderr pipes; -1 once at EOF
  int err_fd = -1;
  std::string out_partial;  // bytes after the last newline seen
  std::string err_partial;
  std::string last_err_line;
  bool reaped = false;
  int wait_status = 0;
};

// Why the run stopped early.
struct Failure {
  int rank = -1;        // -1: not a rank's exit (the launcher could not start every rank)
  int wait_status = 0;  // as from waitpid
  std::string start_error;
};

// Runs the ranks of one Launch: starts them, relays output, reacts to exits and signals, and
// stops them. Single-threaded; lives inside Launch.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, int signal_pipe_read)
      : options_(options), signal_pipe_(signal_pipe_read) {}
  ~Supervisor() {
    for (Rank& r : ranks_) {
      CloseFd(r.out_fd);
      CloseFd(r.err_fd);
    }
  }

  // Forks every rank. On failure the ranks already started are being stopped.
  void Start(const std::string& executable, const std::string& store_dir, const std::string& run_id,
             const SignalHandlers& handlers);
  // Relays output and waits until every rank has been reaped (and its output drained).
  void Run();
  // The exit code for the process, printing the error line when there is one.
  int Finish();

 private:
  void BeginStop(std::chrono::milliseconds grace);
  void SignalAll(int sig);
  void DrainSignals();
  void Reap();
  void ReadFrom(Rank& rank, bool is_stdout);
  void EmitLine(Rank& rank, bool is_stdout, std::string_view line);
  std::string Label(int rank) const;
  size_t Running() const;

  const LaunchOptions& options_;
  int signal_pipe_;
  std::vector<Rank> ranks_;
  std::optional<Failure> failure_;
  int interrupt_signal_ = 0;
  size_t interrupted_ranks_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_;
};

void Supervisor::Start(const std::string& executable, const std::string& store_dir,
                       const std::string& run_id, const SignalHandlers& handlers) {
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  struct sigaction child_actions[std::size(kHandledSignals)];
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    child_actions[i] = handlers.ChildAction(i);
  }

  // Block our signals in this thread across fork so that no handler runs in a child before its
  // exec (it would write into the parent's self-pipe).
  sigset_t blocked, old_mask;
  sigemptyset(&blocked);
  for (int sig : kHandledSignals) sigaddset(&blocked, sig);
  pthread_sigmask(SIG_BLOCK, &blocked, &old_mask);

  for (int r = 0; r < options_.nproc; ++r) {
    // Everything the child needs is built before fork: only async-signal-safe calls after it.
    std::vector<std::string> argv = options_.argv;
    std::vector<std::string> env = RankEnvironment(r, options_.nproc, store_dir, run_id);
    std::vector<char*> c_argv = CStrings(argv);
    std::vector<char*> c_env = CStrings(env);
    const std::string exec_error = "meshrun launcher: cannot run " + executable + ": ";

    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) {
      failure_ = Failure{-1, 0, "rank " + std::to_string(r) + ": pipe: " + std::strerror(errno)};
      break;
    }
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
      failure_ = Failure{-1, 0, "rank " + std::to_string(r) + ": pipe: " + std::strerror(errno)};
      close(out_pipe[0]);
      close(out_pipe[1]);
      break;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
        sigaction(kHandledSignals[i], &child_actions[i], nullptr);
      }
      setpgid(0, 0);  // its own group, so stopping it also stops what it started
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(err_pipe[1], STDERR_FILENO);
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      execve(executable.c_str(), c_argv.data(), c_env.data());
      const char* reason = std::strerror(errno);
      WriteAll(STDERR_FILENO, exec_error);
      WriteAll(STDERR_FILENO, reason);
      WriteAll(STDERR_FILENO, "\n");
      _exit(127);
    }
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (pid < 0) {
      failure_ = Failure{-1, 0, "rank " + std::to_string(r) + ": fork: " + std::strerror(errno)};
      close(out_pipe[0]);
      close(err_pipe[0]);
      break;
    }
    setpgid(pid, pid);  // also here, so the group exists before we might signal it
    Rank rank;
    rank.index = r;
    rank.pid = pid;
    rank.out_fd = out_pipe[0];
    rank.err_fd = err_pipe[0];
    fcntl(rank.out_fd, F_SETFL, O_NONBLOCK);
    fcntl(rank.err_fd, F_SETFL, O_NONBLOCK);
    ranks_.push_back(std::move(rank));
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (devnull >= 0) close(devnull);
  if (failure_) BeginStop(options_.grace);
}

std::string Supervisor::Label(int rank) const {
  if (rank >= 0 && static_cast<size_t>(rank) < options_.rank_labels.size() &&
      !options_.rank_labels[rank].empty()) {
    return options_.rank_labels[rank];
  }
  return "rank " + std::to_string(rank);
}

size_t Supervisor::Running() const {
  return static_cast<size_t>(
      std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.reaped; }));
}

// Signals the process group of every rank not yet reaped (a zombie leader keeps its group).
void Supervisor::SignalAll(int sig) {
  for (const Rank& r : ranks_) {
    if (r.reaped) continue;
    if (kill(-r.pid, sig) != 0) kill(r.pid, sig);
  }
}

void Supervisor::BeginStop(std::chrono::milliseconds grace) {
  if (stopping_) return;
  stopping_ = true;
  SignalAll(SIGTERM);
  kill_at_ = Clock::now() + grace;
}

void Supervisor::DrainSignals() {
  unsigned char bytes[64];
  while (true) {
    const ssize_t n = read(signal_pipe_, bytes, sizeof(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i) {
      const int sig = bytes[i];
      if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD only wakes the loop
      if (stopping_) {
        // A second request (or one during a stop already under way): do not wait any longer.
        if (!killed_) kill_at_ = Clock::now();
      } else if (Running() > 0) {
        interrupt_signal_ = sig;
        interrupted_ranks_ = Running();
        WriteAll(STDERR_FILENO,
                 "\ninterrupt: the ranks stop at the end of this step (with a checkpoint when "
                 "checkpoint.dir is set); press Ctrl-C again to stop them at once\n");
        BeginStop(options_.interrupt_grace);
      }
    }
  }
}

void Supervisor::Reap() {
  for (Rank& r : ranks_) {
    if (r.reaped) continue;
    int status = 0;
    const pid_t got = waitpid(r.pid, &status, WNOHANG);
    if (got == 0) continue;
    if (got < 0 && errno == EINTR) continue;
    // got < 0 (ECHILD): someone else reaped it; count it as finished with an unknown status.
    r.reaped = true;
    r.wait_status = got == r.pid ? status : 0;
    const bool ok = WIFEXITED(r.wait_status) && WEXITSTATUS(r.wait_status) == 0;
    if (!ok && !stopping_) {
      failure_ = Failure{r.index, r.wait_status, ""};
      BeginStop(options_.grace);
    }
  }
}

void Supervisor::EmitLine(Rank& rank, bool is_stdout, std::string_view line) {
  if (!is_stdout && line.find_first_not_of(" \t\r") != std::string_view::npos) {
    rank.last_err_line = std::string(line);
  }
  if (is_stdout && rank.index == 0) {
    std::string text(line);
    text += '\n';
    WriteAll(STDOUT_FILENO, text);
    return;
  }
  std::string text = "[rank " + std::to_string(rank.index) + "] ";
  text += line;
  text += '\n';
  WriteAll(STDERR_FILENO, text);
}

void Supervisor::ReadFrom(Rank& rank, bool is_stdout) {
  int& fd = is_stdout ? rank.out_fd : rank.err_fd;
  std::string& partial = is_stdout ? rank.out_partial : rank.err_partial;
  char buffer[1 << 16];
  while (fd >= 0) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    }
    if (n <= 0) {  // EOF (or an error, treated alike): the last line may lack its newline
      if (!partial.empty()) EmitLine(rank, is_stdout, partial);
      partial.clear();
      CloseFd(fd);
      return;
    }
    partial.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      EmitLine(rank, is_stdout, std::string_view(partial).substr(start, nl - start));
    }
    partial.erase(0, start);
    if (partial.size() >= kMaxLineBytes) {
      EmitLine(rank, is_stdout, partial);
      partial.clear();
    }
  }
}

void Supervisor::Run() {
  std::optional<Clock::time_point> drain_until;
  std::optional<Clock::time_point> give_up_at;
  while (true) {
    DrainSignals();
    Reap();
    const Clock::time_point now = Clock::now();
    if (stopping_ && !killed_ && now >= kill_at_) {
      SignalAll(SIGKILL);
      killed_ = true;
      give_up_at = now + kWaitAfterKill;
    }
    const bool all_reaped = Running() == 0;
    const bool all_closed = std::all_of(ranks_.begin(), ranks_.end(),
                                        [](const Rank& r) { return r.out_fd < 0 && r.err_fd < 0; });
    if (all_reaped && all_closed) return;
    if (all_reaped && !drain_until) drain_until = now + kDrainAfterExit;
    if (drain_until && now >= *drain_until) break;
    if (give_up_at && now >= *give_up_at) break;

    // Sleep until output, a signal, or the next deadline; 1 s at most as a backstop.
    Clock::time_point wake = now + std::chrono::seconds(1);
    if (stopping_ && !killed_) wake = std::min(wake, kill_at_);
    if (drain_until) wake = std::min(wake, *drain_until);
    if (give_up_at) wake = std::min(wake, *give_up_at);
    const auto timeout_ms =
        std::chrono::ceil<std::chrono::milliseconds>(std::max(wake - now, Clock::duration::zero()));

    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;  // (rank, is_stdout) per entry after the first
    fds.push_back({signal_pipe_, POLLIN, 0});
    for (Rank& r : ranks_) {
      if (r.out_fd >= 0) {
        fds.push_back({r.out_fd, POLLIN, 0});
        owners.emplace_back(&r, true);
      }
      if (r.err_fd >= 0) {
        fds.push_back({r.err_fd, POLLIN, 0});
        owners.emplace_back(&r, false);
      }
    }
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(timeout_ms.count()));
    if (ready <= 0) continue;  // timeout or EINTR: the top of the loop rechecks everything
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) ReadFrom(*owners[i - 1].first, owners[i - 1].second);
    }
  }
  // Left the loop on a bound: flush what we have and say who is still there.
  for (Rank& r : ranks_) {
    if (!r.out_partial.empty()) EmitLine(r, true, r.out_partial);
    if (!r.err_partial.empty()) EmitLine(r, false, r.err_partial);
    r.out_partial.clear();
    r.err_partial.clear();
    if (!r.reaped) {
      WriteAll(STDERR_FILENO, "warning: " + Label(r.index) + " (pid " + std::to_string(r.pid) +
                                  ") did not exit after SIGKILL; leaving it\n");
    }
  }
}

int Supervisor::Finish() {
  if (interrupt_signal_ != 0) {
    // Ranks that stopped at a step boundary exit 130 (or 0 when they had just finished).
    std::string unclean;
    for (const Rank& r : ranks_) {
      const bool clean = WIFEXITED(r.wait_status) &&
                         (WEXITSTATUS(r.wait_status) == 0 || WEXITSTATUS(r.wait_status) == 130);
      if (!clean) unclean += (unclean.empty() ? "" : ", ") + std::to_string(r.index);
    }
    if (!unclean.empty()) {
      PrintError("interrupted (signal " + std::to_string(interrupt_signal_) + "); stopped " +
                 std::to_string(interrupted_ranks_) + " ranks; rank(s) " + unclean +
                 " did not stop at a step boundary (hint: the checkpoint of this run may be "
                 "older than its last step)");
    }
    return 130;
  }
  if (!failure_) return 0;
  if (failure_->rank < 0) {
    PrintError(
        "launcher: could not start " + failure_->start_error +
        " (hint: check the process and file-descriptor limits, `ulimit -u` and `ulimit -n`)");
    return kExitFailure;
  }
  const Rank& rank = ranks_[failure_->rank];
  const int status = failure_->wait_status;
  std::string how;
  std::string hint;
  const bool invalid_input = WIFEXITED(status) && WEXITSTATUS(status) == 2;
  if (WIFSIGNALED(status)) {
    how = "killed by signal " + SignalName(WTERMSIG(status));
    hint = WTERMSIG(status) == SIGKILL
               ? "a SIGKILL nobody asked for is usually the out-of-memory killer; see `dmesg`"
               : "its output above is prefixed [rank " + std::to_string(rank.index) + "]";
  } else {
    how = "exit code " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    hint = invalid_input ? "the rank rejected its input; fix what it names and run again"
                         : "its output above is prefixed [rank " + std::to_string(rank.index) +
                               "]; the other ranks were stopped";
  }
  std::string message = Label(rank.index) + " failed: " + how;
  std::string last = rank.last_err_line;
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
    Supervisor supervisor(options, signal_pipe[0]);
    supervisor.Start(*executable, store_dir, NewRunId(), handlers);
    supervisor.Run();
    exit_code = supervisor.Finish();
  }
  close(signal_pipe[0]);
  close(signal_pipe[1]);
  return exit_code;
}

}  // namespace meshrun::client
