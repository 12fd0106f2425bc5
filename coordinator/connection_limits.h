// What the coordinator does so that connections cannot deafen it (docs/security.md "Limits",
// "Connections"): the open-files limit raised to its hard limit at start, a guard on accept(2)
// that never lets gRPC see "too many open files", and the gRPC channel arguments that close
// idle and silent connections.
//
// libgrpc 1.51 stops accepting for good once accept4 fails with EMFILE (its listener treats
// every error but EAGAIN as fatal). The guard (this file defines accept4, so libgrpc's calls
// come here first) therefore closes a new connection at once when the descriptor it got is in
// the last `reserve` below the limit, and when accept4 does fail with EMFILE or ENFILE it takes
// the pending connection off the queue with a reserve descriptor, closes it, and answers
// EAGAIN. Connections are shed while descriptors are short; the listener never dies.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace grpc {
class ServerBuilder;
}

namespace meshrun::coordinator {

struct OpenFiles {
  rlim_t before = 0;  // the soft limit found
  rlim_t after = 0;   // the soft limit now (the hard limit, unless raising it failed)
  // For the log, once the coordinator serves: "open files: raised from N to M", "open files:
  // N (already the hard limit)", or why it was not raised.
  std::string message;
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit. Call once at start, before serving;
// logs nothing (a flag error must stay the only line printed).
OpenFiles RaiseOpenFilesLimit();

// Descriptors kept free of connections below the open-files limit `limit`: limit/8, at least
// 16 and at most 1024.
uint64_t DescriptorReserve(uint64_t limit);

// Turns the accept guard on for the current soft limit (idempotent; off until called: accept4
// then behaves as the C library's). Returns the line to log once the coordinator serves.
std::string InstallAcceptGuard();

// Connections closed by the guard since start.
uint64_t ShedConnections();

struct ConnectionLimits {
  // A connection that has not finished its TLS and HTTP/2 handshake by then is closed
  // (--handshake-timeout).
  std::chrono::milliseconds handshake_timeout{10'000};
  // A connection without calls for this long is closed with GOAWAY (--connection-idle-timeout);
  // clients reconnect when they next call.
  std::chrono::milliseconds idle_timeout{300'000};
  // Keepalive pings the server sends, and how long it waits for the answer before it closes
  // the connection (a peer that vanished without a FIN).
  std::chrono::milliseconds keepalive_time{60'000};
  std::chrono::milliseconds keepalive_timeout{20'000};
  // Concurrent calls (streams) on one connection.
  int max_streams_per_connection = 4'096;
};

// Sets the channel arguments of `limits` on the coordinator's gRPC server.
void ApplyConnectionLimits(grpc::ServerBuilder& builder, const ConnectionLimits& limits);

}  // namespace meshrun::coordinator
