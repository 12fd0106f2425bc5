// RankSupervisor (see rank_supervisor.h): one thread runs a loop of launch pending ranks →
// deliver stop signals → poll() the pipes → reap → report exits. Stop() and Start() only record
// what to do and wake the loop through a self-pipe, so only that thread forks, signals and reads.
#include "supervisor/rank_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "supervisor/line_splitter.h"

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// After a process is reaped, how long to keep reading output its leftover children hold open.
constexpr milliseconds kDrainAfterExit{1000};
// During Shutdown, how long after SIGKILL to wait for the kernel before giving up on a process.
constexpr milliseconds kWaitAfterKill{10000};
// Longest poll() sleep; bounds how late a SIGKILL deadline or a reap is noticed.
constexpr int kPollMillis = 50;

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// What the child writes to the status pipe when it cannot exec: the step and errno.
struct ExecFailure {
  int step = 0;  // 1 chdir, 2 open /dev/null, 3 exec
  int err = 0;
};

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return (abbrev != nullptr ? "SIG" + std::string(abbrev) : std::string("signal")) + " (" +
         std::to_string(sig) + ")";
}

}  // namespace

// Why a rank had to be SIGKILLed after its stop's grace period: the state of its process
// just before, from /proc/PID/stat. A stopped or hung rank is the one its peers waited for in a
// collective; saying so in its exit report names it in the job's events.
static std::string UnresponsiveNote(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t paren = text.rfind(')');
  const char state = paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : '?';
  std::string what;
  if (state == 'T' || state == 't') {
    what = "its process was stopped (state " + std::string(1, state) +
           ", e.g. SIGSTOP): a hung rank, the one its peers waited for";
  } else if (state == 'D') {
    what = "its process was in uninterruptible I/O (state D): a hung rank";
  } else {
    what = "its process (state " + std::string(1, state) + ") ignored SIGTERM: a hung rank";
  }
  return "did not exit within its stop's grace period and was killed; " + what;
}

struct RankSupervisor::Proc {
  RankSpawn spawn;
  // Guarded by mu_ (Stop and RunningRanks read them from other threads).
  pid_t pid = 0;
  bool stop_requested = false;
  Clock::time_point kill_at{};
  bool kill_at_once = false;  // a stop of no grace asked for SIGKILL now (a second Ctrl-C)
  // Touched by the supervisor thread only.
  bool launched = false;
  bool term_sent = false;
  bool kill_sent = false;
  int out_fd = -1;
  int err_fd = -1;
  int report_fd = -1;  // read end of the report channel
  int in_fd = -1;      // write end of its stdin while spawn.input is being written
  size_t in_written = 0;
  LineSplitter out;
  LineSplitter err;
  FrameSplitter frames;
  std::string last_err_line;
  std::string unresponsive;  // UnresponsiveNote, when SIGKILL followed a stop's grace period
  bool reaped = false;
  int wait_status = 0;
  Clock::time_point reaped_at{};
  std::optional<RankExit> result;  // set once known; reported, then the Proc is dropped
};

RankSupervisor::RankSupervisor(Callbacks callbacks) : callbacks_(std::move(callbacks)) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_read_ = fds[0];
    wake_write_ = fds[1];
  }
  thread_ = std::thread([this] { Loop(); });
}

RankSupervisor::~RankSupervisor() {
  Shutdown(milliseconds(5000));
  CloseFd(wake_read_);
  CloseFd(wake_write_);
}

// Written on the supervisor thread, read by Stop and RunningRanks: under mu_.
void RankSupervisor::SetResult(Proc& proc, RankExit exit) {
  std::lock_guard<std::mutex> lock(mu_);
  proc.result = std::move(exit);
}

void RankSupervisor::Wake() {
  if (wake_write_ < 0) return;
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(wake_write_, &byte, 1);  // a full pipe wakes the loop too
}

Status RankSupervisor::Start(RankSpawn spawn) {
  if (spawn.argv.empty() || spawn.argv[0].empty()) {
    return InvalidArgumentError("argv: empty command for " + spawn.key.ToString());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) {
      return FailedPreconditionError("worker is shutting down: not starting " +
                                     spawn.key.ToString());
    }
    if (procs_.count(spawn.key) > 0) {
      return Status(StatusCode::kAlreadyExists, spawn.key.ToString() + " runs already");
    }
    auto proc = std::make_shared<Proc>();
    const RankKey key = spawn.key;
    proc->spawn = std::move(spawn);
    procs_.emplace(key, std::move(proc));
  }
  Wake();
  return OkStatus();
}

int RankSupervisor::Stop(const std::string& job_id, int attempt, milliseconds grace) {
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, proc] : procs_) {
      if (key.job_id != job_id || key.attempt != attempt || proc->result) continue;
      const Clock::time_point kill_at = Clock::now() + grace;
      if (!proc->stop_requested || kill_at < proc->kill_at) proc->kill_at = kill_at;
      if (grace.count() <= 0) proc->kill_at_once = true;
      proc->stop_requested = true;
      ++n;
    }
  }
  Wake();
  return n;
}

int RankSupervisor::StopAll(milliseconds grace) {
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, proc] : procs_) {
      if (proc->result) continue;
      const Clock::time_point kill_at = Clock::now() + grace;
      if (!proc->stop_requested || kill_at < proc->kill_at) proc->kill_at = kill_at;
      if (grace.count() <= 0) proc->kill_at_once = true;
      proc->stop_requested = true;
      ++n;
    }
  }
  Wake();
  return n;
}

std::vector<RankSupervisor::Running> RankSupervisor::RunningRanks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Running> out;
  for (const auto& [key, proc] : procs_) {
    if (!proc->result) out.push_back({key, proc->pid});
  }
  return out;
}

size_t RankSupervisor::running_count() const {
  return RunningRanks().size();
}

void RankSupervisor::Shutdown(milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_done_) return;
    shutdown_done_ = true;
    shutting_down_ = true;
  }
  StopAll(grace);
  if (thread_.joinable()) thread_.join();
}

// Runs on the supervisor thread. Everything the child does between fork and exec is
// async-signal-safe: the strings were prepared before fork.
void RankSupervisor::Launch(Proc& proc) {
  proc.launched = true;
  const RankSpawn& s = proc.spawn;
  std::vector<char*> argv;
  for (const std::string& a : s.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : s.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* cwd = s.working_dir.empty() ? nullptr : s.working_dir.c_str();

  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  int in[2] = {-1, -1}, report[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0 ||
      (!s.input.empty() && pipe2(in, O_CLOEXEC) != 0) ||
      (s.report_channel && pipe2(report, O_CLOEXEC) != 0)) {
    const int e = errno;
    for (int* p : {out, err, status, in, report}) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
    SetResult(proc,
              RankExit{-1, 0, std::string("cannot create pipes: ") + std::strerror(e), false});
    return;
  }
  const pid_t parent = getpid();
  sigset_t empty;
  sigemptyset(&empty);
  // No handler of the parent may run in the child before exec (a launcher's SIGINT handler
  // would write into the parent's self-pipe): every signal is blocked across fork, and the
  // child unblocks them after it has reset their actions.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the worker died between fork and prctl
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGQUIT})
      sigaction(sig, &dfl, nullptr);
    struct sigaction ign = dfl;
    ign.sa_handler = SIG_IGN;
    for (int sig : s.ignored_signals) sigaction(sig, &ign, nullptr);
    sigprocmask(SIG_SETMASK, &empty, nullptr);
    ExecFailure failure;
    const int devnull = in[0] >= 0 ? in[0] : open("/dev/null", O_RDONLY);
    if (devnull < 0) {
      failure = {2, errno};
    } else {
      dup2(devnull, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      if (report[1] == 3) {
        fcntl(3, F_SETFD, 0);  // already there: only keep it across exec
      } else if (report[1] >= 0) {
        dup2(report[1], 3);
      }
#ifdef SYS_close_range
      // Nothing else of the worker (gRPC sockets, other ranks' pipes) leaks into the rank.
      syscall(SYS_close_range, report[1] >= 0 ? 4u : 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
      if (cwd != nullptr && chdir(cwd) != 0) {
        failure = {1, errno};
      } else {
        execve(argv[0], argv.data(), envp.data());
        failure = {3, errno};
      }
    }
    [[maybe_unused]] ssize_t n = write(status[1], &failure, sizeof(failure));
    _exit(127);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  CloseFd(out[1]);
  CloseFd(err[1]);
  CloseFd(status[1]);
  CloseFd(in[0]);
  CloseFd(report[1]);
  if (pid < 0) {
    CloseFd(out[0]);
    CloseFd(err[0]);
    CloseFd(status[0]);
    CloseFd(in[1]);
    CloseFd(report[0]);
    SetResult(proc,
              RankExit{-1, 0, std::string("cannot fork: ") + std::strerror(fork_errno), false});
    return;
  }
  setpgid(pid, pid);  // also in the parent, so that signals reach the group at once
  ExecFailure failure;
  ssize_t got;
  do {
    got = read(status[0], &failure, sizeof(failure));
  } while (got < 0 && errno == EINTR);
  CloseFd(status[0]);
  if (got == static_cast<ssize_t>(sizeof(failure))) {
    int ignored;
    while (waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
    CloseFd(out[0]);
    CloseFd(err[0]);
    CloseFd(in[1]);
    CloseFd(report[0]);
    const char* what = failure.step == 1   ? "cannot enter working folder "
                       : failure.step == 2 ? "cannot open /dev/null for "
                                           : "cannot execute ";
    const std::string target = failure.step == 1 ? s.working_dir : s.argv[0];
    SetResult(proc, RankExit{-1, 0, what + target + ": " + std::strerror(failure.err), false});
    return;
  }
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  proc.out_fd = out[0];
  proc.err_fd = err[0];
  if (report[0] >= 0) {
    fcntl(report[0], F_SETFL, fcntl(report[0], F_GETFL) | O_NONBLOCK);
    proc.report_fd = report[0];
  }
  if (in[1] >= 0) {
    fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
    proc.in_fd = in[1];
    WriteInput(proc);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    proc.pid = pid;
  }
  if (callbacks_.on_started) callbacks_.on_started(s.key, pid);
}

void RankSupervisor::Loop() {
  // A child that ends before it read its input makes our write fail with EPIPE; the SIGPIPE
  // that comes with it stays blocked on this thread (and is taken back in WriteInput).
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  while (true) {
    std::vector<std::shared_ptr<Proc>> procs;
    bool shutting_down;
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutting_down = shutting_down_;
      for (auto& [key, proc] : procs_) procs.push_back(proc);
    }
    if (shutting_down && procs.empty()) return;

    const Clock::time_point now = Clock::now();
    for (const std::shared_ptr<Proc>& p : procs) {
      bool stop;
      Clock::time_point kill_at;
      bool kill_at_once;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop = p->stop_requested;
        kill_at = p->kill_at;
        kill_at_once = p->kill_at_once;
      }
      if (!p->launched) {
        if (stop) {
          p->launched = true;
          SetResult(*p, RankExit{-1, 0, "stopped before it started", true});
        } else {
          Launch(*p);
        }
        continue;
      }
      if (!stop || p->reaped || p->pid <= 0) continue;
      if (!p->term_sent) {
        kill(-p->pid, SIGTERM);
        p->term_sent = true;
      }
      if (!p->kill_sent && now >= kill_at) {
        if (kill_at_once) {
          // Killed as asked (no grace): nothing is known about whether it would have stopped.
          p->unresponsive = "was killed at once, as its stop asked (no grace period)";
        } else {
          p->unresponsive = UnresponsiveNote(p->pid);
          if (callbacks_.on_line) {  // into the job's logs, under the rank it is about
            callbacks_.on_line(p->spawn.key, true,
                               callbacks_.owner + ": rank " + std::to_string(p->spawn.key.rank) +
                                   " " + p->unresponsive);
          }
        }
        kill(-p->pid, SIGKILL);
        p->kill_sent = true;
      }
    }

    // Read whatever output there is.
    enum class Pipe { kOut, kErr, kReport, kIn };
    std::vector<pollfd> fds;
    std::vector<std::pair<Proc*, Pipe>> owners;  // of fds[i], i ≥ 1
    fds.push_back({wake_read_, POLLIN, 0});
    for (const std::shared_ptr<Proc>& p : procs) {
      if (p->out_fd >= 0) {
        fds.push_back({p->out_fd, POLLIN, 0});
        owners.emplace_back(p.get(), Pipe::kOut);
      }
      if (p->err_fd >= 0) {
        fds.push_back({p->err_fd, POLLIN, 0});
        owners.emplace_back(p.get(), Pipe::kErr);
      }
      if (p->report_fd >= 0) {
        fds.push_back({p->report_fd, POLLIN, 0});
        owners.emplace_back(p.get(), Pipe::kReport);
      }
      if (p->in_fd >= 0) {
        fds.push_back({p->in_fd, POLLOUT, 0});
        owners.emplace_back(p.get(), Pipe::kIn);
      }
    }
    if (poll(fds.data(), fds.size(), kPollMillis) > 0) {
      if (fds[0].revents != 0) {
        char drain[256];
        while (read(wake_read_, drain, sizeof(drain)) > 0) {
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [p, pipe] = owners[i - 1];
        if (pipe == Pipe::kIn) {
          WriteInput(*p);
          continue;
        }
        if (pipe == Pipe::kReport) {
          ReadReports(*p);
          continue;
        }
        const bool is_stderr = pipe == Pipe::kErr;
        int& fd = is_stderr ? p->err_fd : p->out_fd;
        LineSplitter& splitter = is_stderr ? p->err : p->out;
        char buffer[65536];
        const ssize_t n = read(fd, buffer, sizeof(buffer));
        if (n > 0) {
          splitter.Feed(std::string_view(buffer, static_cast<size_t>(n)), [&](std::string line) {
            if (is_stderr && !line.empty()) p->last_err_line = line;
            if (callbacks_.on_line) callbacks_.on_line(p->spawn.key, is_stderr, std::move(line));
          });
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          CloseFd(fd);
        }
      }
    }
    ReapAndReport();
    // During shutdown, a process that survives SIGKILL for long is given up on.
    if (shutting_down) {
      for (const std::shared_ptr<Proc>& p : procs) {
        Clock::time_point kill_at;
        {
          std::lock_guard<std::mutex> lock(mu_);
          kill_at = p->kill_at;
        }
        if (!p->result && !p->reaped && p->kill_sent && Clock::now() > kill_at + kWaitAfterKill) {
          SetResult(*p, RankExit{-1, SIGKILL, "did not exit after SIGKILL", true});
        }
      }
    }
    // Report and forget the processes whose end is known.
    for (const std::shared_ptr<Proc>& p : procs) {
      if (!p->result) continue;
      CloseFd(p->out_fd);
      CloseFd(p->err_fd);
      CloseFd(p->report_fd);
      CloseFd(p->in_fd);
      {
        std::lock_guard<std::mutex> lock(mu_);
        procs_.erase(p->spawn.key);
      }
      if (callbacks_.on_exited) callbacks_.on_exited(p->spawn.key, *p->result);
    }
  }
}

// Writes what the pipe takes of spawn.input; closes it when all is written or the child went.
void RankSupervisor::WriteInput(Proc& p) {
  const std::string& input = p.spawn.input;
  while (p.in_fd >= 0 && p.in_written < input.size()) {
    const ssize_t n = write(p.in_fd, input.data() + p.in_written, input.size() - p.in_written);
    if (n > 0) {
      p.in_written += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      // EPIPE: the child closed its stdin or ended; take back the SIGPIPE blocked in Loop.
      sigset_t pipe_signal;
      sigemptyset(&pipe_signal);
      sigaddset(&pipe_signal, SIGPIPE);
      const timespec now{};
      sigtimedwait(&pipe_signal, nullptr, &now);
      break;
    }
  }
  CloseFd(p.in_fd);
}

void RankSupervisor::ReadReports(Proc& p) {
  char buffer[65536];
  while (p.report_fd >= 0) {
    const ssize_t n = read(p.report_fd, buffer, sizeof(buffer));
    if (n > 0) {
      p.frames.Feed(std::string_view(buffer, static_cast<size_t>(n)), [&](std::string frame) {
        if (callbacks_.on_frame) callbacks_.on_frame(p.spawn.key, std::move(frame));
      });
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      CloseFd(p.report_fd);
    }
  }
}

void RankSupervisor::ReapAndReport() {
  std::vector<std::shared_ptr<Proc>> procs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, proc] : procs_) procs.push_back(proc);
  }
  const Clock::time_point now = Clock::now();
  for (const std::shared_ptr<Proc>& p : procs) {
    if (p->result || !p->launched || p->pid <= 0) continue;
    if (!p->reaped) {
      int status = 0;
      const pid_t r = waitpid(p->pid, &status, WNOHANG);
      if (r == p->pid) {
        p->reaped = true;
        p->wait_status = status;
        p->reaped_at = now;
        // Whatever the rank left running in its group goes with it.
        kill(-p->pid, SIGKILL);
      } else if (r < 0 && errno == ECHILD) {
        p->reaped = true;
        p->wait_status = 0;
        p->reaped_at = now;
      }
    }
    if (!p->reaped) continue;
    CloseFd(p->in_fd);
    const bool drained = p->out_fd < 0 && p->err_fd < 0 && p->report_fd < 0;
    if (!drained && now < p->reaped_at + kDrainAfterExit) continue;
    auto emit = [&](bool is_stderr) {
      return [&, is_stderr](std::string line) {
        if (is_stderr && !line.empty()) p->last_err_line = line;
        if (callbacks_.on_line) callbacks_.on_line(p->spawn.key, is_stderr, std::move(line));
      };
    };
    p->out.Flush(emit(false));
    p->err.Flush(emit(true));
    RankExit exit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      exit.stopped = p->stop_requested;
    }
    if (WIFEXITED(p->wait_status)) {
      exit.exit_code = WEXITSTATUS(p->wait_status);
      if (exit.exit_code != 0) {
        exit.error = p->last_err_line.empty() ? "exited with code " + std::to_string(exit.exit_code)
                                              : p->last_err_line;
      }
    } else if (WIFSIGNALED(p->wait_status)) {
      exit.exit_code = -1;
      exit.signal = WTERMSIG(p->wait_status);
      exit.error = "killed by " + SignalName(exit.signal) +
                   (p->kill_sent && !p->unresponsive.empty() ? ": " + p->unresponsive : "") +
                   (p->last_err_line.empty() ? "" : "; last line: " + p->last_err_line);
    }
    SetResult(*p, exit);
  }
}

std::vector<std::string> InheritedEnvironment() {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    env.emplace_back(*entry);
  }
  return env;
}

int RunToEnd(std::vector<std::string> argv, std::vector<std::string> env) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<RankExit> result;
  RankSupervisor::Callbacks callbacks;
  callbacks.on_line = [](const RankKey&, bool is_stderr, std::string line) {
    line += '\n';
    std::string_view rest = line;
    const int fd = is_stderr ? STDERR_FILENO : STDOUT_FILENO;
    while (!rest.empty()) {
      const ssize_t n = write(fd, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      rest.remove_prefix(static_cast<size_t>(n));
    }
  };
  callbacks.on_exited = [&](const RankKey&, const RankExit& exit) {
    std::lock_guard<std::mutex> lock(mu);
    result = exit;
    cv.notify_all();
  };
  RankSupervisor supervisor(std::move(callbacks));
  RankSpawn spawn;
  spawn.key = RankKey{"run-to-end", 0, 0};
  spawn.argv = std::move(argv);
  spawn.env = std::move(env);
  if (!supervisor.Start(std::move(spawn)).ok()) return -1;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return result.has_value(); });
  return result->exit_code;
}

}  // namespace meshrun
