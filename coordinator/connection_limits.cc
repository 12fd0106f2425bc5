// The open-files limit, the accept guard and the connection arguments (connection_limits.h).
#include "coordinator/connection_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace meshrun::coordinator {
namespace {

// Accepted descriptors at or above this are closed at once; 0: the guard is off.
std::atomic<int64_t> g_shed_at{0};
std::atomic<uint64_t> g_shed{0};
std::atomic<int64_t> g_last_warning_s{0};
std::mutex g_reserve_mu;
int g_reserve_fd = -1;  // guarded by g_reserve_mu: opened to take one connection off at EMFILE

int RealAccept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return static_cast<int>(syscall(SYS_accept4, fd, addr, len, flags));
}

void NoteShed() {
  const uint64_t n = g_shed.fetch_add(1) + 1;
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
  int64_t last = g_last_warning_s.load();
  if (now_s - last >= 10 && g_last_warning_s.compare_exchange_strong(last, now_s)) {
    spdlog::warn(
        "connections: a new connection was closed at once, the open files are near their limit "
        "({} closed so far) (hint: many idle or stuck connections; they are closed after "
        "--handshake-timeout or --connection-idle-timeout; raise the coordinator's open-files "
        "hard limit, e.g. LimitNOFILE= in its systemd unit)",
        n);
  }
}

// One pending connection taken off the queue and closed, with the reserve descriptor freed
// for it; false when there is no reserve or nothing was pending.
bool ShedWithReserve(int listener) {
  std::lock_guard<std::mutex> lock(g_reserve_mu);
  if (g_reserve_fd < 0) return false;
  close(g_reserve_fd);
  g_reserve_fd = -1;
  const int c = RealAccept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (c >= 0) close(c);
  g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return c >= 0;
}

int GuardedAccept4(int listener, sockaddr* addr, socklen_t* len, int flags) {
  const int64_t shed_at = g_shed_at.load(std::memory_order_relaxed);
  if (shed_at == 0) return RealAccept4(listener, addr, len, flags);
  const socklen_t len_in = len != nullptr ? *len : 0;
  const bool nonblocking = (fcntl(listener, F_GETFL) & O_NONBLOCK) != 0;
  for (;;) {
    if (len != nullptr) *len = len_in;
    const int c = RealAccept4(listener, addr, len, flags);
    if (c >= 0 && c < shed_at) return c;
    if (c >= 0) {
      close(c);
    } else if (errno == EMFILE || errno == ENFILE) {
      if (!ShedWithReserve(listener)) {
        errno = EAGAIN;
        return -1;
      }
    } else {
      return -1;  // EAGAIN (the queue is empty), EINTR, ...: as they are
    }
    NoteShed();
    // A non-blocking listener (gRPC's) is drained until EAGAIN, as its caller expects of an
    // edge-triggered poller; a blocking one gets a retryable error instead of blocking here.
    if (!nonblocking) {
      errno = ECONNABORTED;
      return -1;
    }
  }
}

}  // namespace

OpenFiles RaiseOpenFilesLimit() {
  OpenFiles out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    out.message = std::string("open files: the limit cannot be read: ") + std::strerror(errno);
    return out;
  }
  out.before = out.after = limit.rlim_cur;
  if (limit.rlim_cur == limit.rlim_max) {
    out.message = "open files: " + std::to_string(limit.rlim_cur) + " (already the hard limit)";
    return out;
  }
  rlimit raised = limit;
  raised.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    out.message = "open files: not raised from " + std::to_string(limit.rlim_cur) + " to " +
                  std::to_string(limit.rlim_max) + ": " + std::strerror(errno);
    return out;
  }
  out.after = raised.rlim_cur;
  out.message =
      "open files: raised from " + std::to_string(out.before) + " to " + std::to_string(out.after);
  return out;
}

uint64_t DescriptorReserve(uint64_t limit) {
  return std::clamp<uint64_t>(limit / 8, 16, 1024);
}

std::string InstallAcceptGuard() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "connections: no accept guard (no limit)";
  const uint64_t soft = limit.rlim_cur == RLIM_INFINITY ? (uint64_t{1} << 30) : limit.rlim_cur;
  const uint64_t reserve = DescriptorReserve(soft);
  {
    std::lock_guard<std::mutex> lock(g_reserve_mu);
    if (g_reserve_fd < 0) g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  const int64_t shed_at =
      std::max<int64_t>(static_cast<int64_t>(soft > reserve ? soft - reserve : soft / 2), 1);
  g_shed_at.store(shed_at);
  return "connections: new ones are closed at once while descriptor " + std::to_string(shed_at) +
         " or higher would be used (" + std::to_string(soft - static_cast<uint64_t>(shed_at)) +
         " of " + std::to_string(soft) + " kept for the state database, logs and metrics)";
}

uint64_t ShedConnections() {
  return g_shed.load();
}

void ApplyConnectionLimits(grpc::ServerBuilder& builder, const ConnectionLimits& limits) {
  auto ms = [](std::chrono::milliseconds d) {
    return static_cast<int>(std::min<int64_t>(d.count(), INT32_MAX));
  };
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, ms(limits.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(limits.idle_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(limits.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(limits.keepalive_timeout));
  // The server's pings continue on a connection whose streams carry nothing for hours (a
  // watch of a quiet job).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
}

}  // namespace meshrun::coordinator

// libgrpc (and anything else in the process) calls accept4 through the dynamic linker, which
// finds this definition in the executable before the C library's (the link exports it:
// coordinator/CMakeLists.txt).
extern "C" int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  return meshrun::coordinator::GuardedAccept4(fd, addr, len, flags);
}
