// What the integration tests share to run real daemons: the build's bin folder, a free loopback
// port, and child processes with their output in a log file that die with the test
// (PR_SET_PDEATHSIG) and stop with SIGTERM, then SIGKILL after a grace period.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace meshrun::testing {

// The training text of the daemon tests: Debian's fortunes "cookie" file (package fortunes).
inline constexpr char kCorpus[] = "/usr/share/games/fortunes/cookie";

// MESHRUN_BINARY_DIR/bin (set by ctest), else build/bin.
inline std::filesystem::path BinDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return std::filesystem::path(dir != nullptr ? dir : "build") / "bin";
}

// A loopback port nothing listened on a moment ago.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Alive and not a zombie.
inline bool Alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// A daemon started by the test: stdout and stderr appended to `log`; SIGKILLed if the test dies.
struct Daemon {
  std::string name;
  pid_t pid = -1;
  std::filesystem::path log;
};

inline Daemon Spawn(const std::string& name, const std::vector<std::string>& argv,
                    const std::filesystem::path& log) {
  Daemon d{name, -1, log};
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  d.pid = fork();
  if (d.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  return d;
}

// Reaps `pid` if it has exited within `timeout`.
inline bool WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// SIGTERM, then SIGKILL after `grace`.
inline void Stop(Daemon& d, std::chrono::milliseconds grace = std::chrono::seconds(20)) {
  if (d.pid <= 0) return;
  kill(d.pid, SIGTERM);
  if (!WaitExit(d.pid, grace)) {
    kill(d.pid, SIGKILL);
    WaitExit(d.pid, std::chrono::seconds(5));
  }
  d.pid = -1;
}

inline void KillNow(Daemon& d) {
  if (d.pid <= 0) return;
  kill(d.pid, SIGKILL);
  WaitExit(d.pid, std::chrono::seconds(10));
  d.pid = -1;
}

}  // namespace meshrun::testing
