// Forking helpers for integration tests that run ranks as real processes: every wait is
// bounded, and children that outlive the bound are killed. Children leave with _exit so that
// they never run the parent's gtest teardown.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

namespace meshrun::testing {

// Exit code WaitAll reports for a child it had to kill at the deadline.
inline constexpr int kTimedOutExit = -1000;

// Forks one child per rank running `body(rank)`; its return value is the exit code.
inline std::vector<pid_t> ForkRanks(int n, const std::function<int(int)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int code = body(rank);
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Waits for `pid` until `deadline`: its exit code, -signal when a signal ended it, or
// kTimedOutExit after killing it at the deadline.
inline int WaitOne(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return -WTERMSIG(status);
      return -1;
    }
    if (done < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return kTimedOutExit;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Exit codes of every child, waiting at most `timeout` in total.
inline std::vector<int> WaitAll(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(WaitOne(pid, deadline));
  return codes;
}

}  // namespace meshrun::testing
