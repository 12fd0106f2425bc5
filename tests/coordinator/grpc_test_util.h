// gRPC helpers for the coordinator's integration tests: the standard health check and server
// reflection called through the generic stub (no generated code for those services is
// installed), and a child process with its stdout readable line by line.
#pragma once

#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace meshrun::testing {

// grpc.health.v1.Health/Check for `service` ("" = the server as a whole): the serving status
// (1 SERVING, 2 NOT_SERVING, 0 UNKNOWN), or -1 with the call's error.
inline int HealthStatus(const std::shared_ptr<grpc::Channel>& channel,
                        std::chrono::milliseconds limit = std::chrono::seconds(5),
                        const std::string& service = "") {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + limit);
  // HealthCheckRequest { string service = 1; }: tag 0x0a, length, bytes (names < 128 bytes).
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);
    request_bytes.push_back(static_cast<char>(service.size()));
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse { ServingStatus status = 1; }: 0x08 <status>; empty means UNKNOWN (0).
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
}

// The raw bytes of grpc.reflection.v1alpha's answer to list_services, in which the service
// names appear verbatim; empty on error.
inline std::string ReflectionListServices(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* want) {
    bool got = cq.Next(&tag, &ok);
    return got && ok && tag == want;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(reinterpret_cast<void*>(1))) return "";
  // ServerReflectionRequest { string list_services = 7; } with "*".
  const char request_bytes[] = {0x3a, 0x01, '*'};
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  if (!step(reinterpret_cast<void*>(2))) return "";
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  if (!step(reinterpret_cast<void*>(3))) return "";
  call->WritesDone(reinterpret_cast<void*>(4));
  step(reinterpret_cast<void*>(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

// A child process started with fork/exec; stdout is a pipe the test reads, stderr goes to a
// file. Killed (SIGKILL) on destruction if still running.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::string& stderr_path) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) dup2(err, 2);
      close(out[0]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    stdout_fd_ = out[0];
  }
  ~Subprocess() {
    if (pid_ > 0 && !exit_status_) {
      kill(pid_, SIGKILL);
      Wait(std::chrono::seconds(10));
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }

  // The next line of stdout (without the newline), waiting at most `limit`.
  std::optional<std::string> ReadLine(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{stdout_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
      if (n <= 0) return std::nullopt;
      buffer_.append(buf, n);
    }
  }

  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  // The wait status once the process ended within `limit`.
  std::optional<int> Wait(std::chrono::milliseconds limit) {
    if (exit_status_) return exit_status_;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_status_ = status;
        return exit_status_;
      }
      usleep(5000);
    }
    return std::nullopt;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::optional<int> exit_status_;
};

}  // namespace meshrun::testing
