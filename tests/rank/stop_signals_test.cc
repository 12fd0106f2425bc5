// The rank's stop signals (rank/stop_signals.h), each case in a forked child so that this
// process's signal mask and handlers stay as they were:
//  - every thread that computes (the main one and the OpenMP team) blocks SIGINT and SIGTERM;
//  - a stop signal that arrives while GEMMs run sets the flag and leaves the heap whole. With a
//    plain handler (what ranks had), oneDNN's JIT GEMM (rsp in a heap workspace) had the signal
//    frame written onto the heap: `corrupted size vs. prev_size` in about 1 in 6 interrupted
//    runs; here the children run oneDNN (MESHRUN_GEMM=onednn) where the build has it;
//  - a second stop signal ends the process by that signal, as Ctrl-C twice does.
#include "rank/stop_signals.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/kernels/cpu/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace meshrun::rank {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `body` in a child; returns its wait status.
int InChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// SigBlk of thread `tid` of this process, as a bit mask (bit n-1 for signal n).
unsigned long long BlockedOf(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

constexpr unsigned long long kStopBits = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));

// 512² GEMMs over fresh heap buffers, for `seconds`. At this size a signal lands in oneDNN's JIT
// kernel often: with a plain handler about 1 child in 3 of the test below died (21 of 60; 7 of 60
// at 192², none at 64²), so its 16 children miss the old fault once in about 1,000 runs.
void Gemms(double seconds) {
  const int64_t n = 512;
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    cpu::Gemm<float>(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (c[0] != 0.5f * 0.25f * n) _exit(4);
  }
}

TEST(StopSignalsTest, EveryThreadThatComputesBlocksTheStopSignals) {
  const int status = InChild([] {
    BlockStopSignals();
    cpu::SetNumThreads(2);
    std::vector<pid_t> team(2, 0);
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
    { team[omp_get_thread_num()] = static_cast<pid_t>(syscall(SYS_gettid)); }
#else
    team[0] = static_cast<pid_t>(syscall(SYS_gettid));
#endif
    Gemms(0.05);
    for (pid_t tid : team) {
      if (tid != 0 && (BlockedOf(tid) & kStopBits) != kStopBits) return 10;
    }
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a thread of the OpenMP team takes stop signals";
}

TEST(StopSignalsTest, AStopSignalDuringGemmsSetsTheFlagAndLeavesTheHeapWhole) {
  for (int child = 0; child < 16; ++child) {
    const int status = InChild([child] {
      setenv("MESHRUN_GEMM", "onednn", 1);  // read at the first Gemm
      static volatile std::sig_atomic_t flag = 0;
      ArmStopSignals(&flag, /*announce=*/false);
      cpu::SetNumThreads(2);
      Gemms(0.01);  // the team and the GEMM's kernels exist before the signal
      std::thread sender([child] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20 + child % 7));
        kill(getpid(), child % 2 == 0 ? SIGINT : SIGTERM);
      });
      Gemms(0.04);
      sender.join();
      Gemms(0.03);  // a corrupt heap shows in the frees that follow
      return flag == 1 && StopSignalsTaken() == 1 ? 0 : 3;
    });
    EXPECT_TRUE(WIFEXITED(status))
        << "child " << child << " died by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child " << child;
  }
}

TEST(StopSignalsTest, ASecondStopSignalEndsTheProcessByIt) {
  const int status = InChild([] {
    static volatile std::sig_atomic_t flag = 0;
    ArmStopSignals(&flag, /*announce=*/false);
    kill(getpid(), SIGTERM);
    for (int i = 0; i < 200 && flag == 0; ++i) usleep(5000);
    if (flag != 1) return 5;
    kill(getpid(), SIGINT);
    for (int i = 0; i < 400; ++i) usleep(5000);  // ended by now
    return 6;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

TEST(StopSignalsTest, AStopSignalBeforeArmingEndsTheProcessByIt) {
  const int status = InChild([] {
    BlockStopSignals();
    kill(getpid(), SIGTERM);
    for (int i = 0; i < 400; ++i) usleep(5000);
    return 7;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace
}  // namespace meshrun::rank
