// The stop-signal watcher (see stop_signals.h).
#include "rank/stop_signals.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace meshrun::rank {
namespace {

std::atomic<volatile std::sig_atomic_t*> g_flag{nullptr};  // set by ArmStopSignals
std::atomic<bool> g_announce{false};
std::atomic<int> g_taken{0};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");
static_assert(std::atomic<volatile std::sig_atomic_t*>::is_always_lock_free,
              "used from a signal handler");

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// The signal's default action (the process ends by it), from the watcher or a handler: only
// async-signal-safe calls.
[[noreturn]] void EndBy(int sig) {
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  _exit(128 + sig);  // not reached: the default action of SIGINT and SIGTERM ends the process
}

// One stop signal, from the watcher or from OnStopSignal.
void Take(int sig) {
  volatile std::sig_atomic_t* flag = g_flag.load();
  if (flag == nullptr) EndBy(sig);           // not armed: as if there were no handler
  if (g_taken.fetch_add(1) > 0) EndBy(sig);  // the second one: stop at once
  *flag = 1;
  if (g_announce.load()) {
    static const char kMessage[] =
        "\ninterrupt: stopping at the end of this step (with a checkpoint when checkpoint.dir is "
        "set); press Ctrl-C again to stop at once\n";
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
  }
}

extern "C" void OnStopSignal(int sig) {
  Take(sig);
}

void Watch() {
  const sigset_t set = StopSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // sigwaitinfo needs them blocked here too
  while (true) {
    const int sig = sigwaitinfo(&set, nullptr);
    if (sig < 0) continue;  // EINTR (another signal's handler ran on this thread)
    Take(sig);
  }
}

std::once_flag g_started;

}  // namespace

void BlockStopSignals() {
  const sigset_t set = StopSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // The watcher lives as long as the process; it holds nothing to release at exit.
  std::call_once(g_started, [] { std::thread(Watch).detach(); });
}

void ArmStopSignals(volatile std::sig_atomic_t* flag, bool announce) {
  BlockStopSignals();
  g_announce.store(announce);
  g_taken.store(0);
  g_flag.store(flag);
  // For threads started before BlockStopSignals (a library's, before main): they take a stop
  // signal as the watcher does, on their own stack (none of them runs oneDNN).
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int StopSignalsTaken() {
  return g_taken.load();
}

}  // namespace meshrun::rank
