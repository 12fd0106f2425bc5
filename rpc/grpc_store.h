// GrpcStore: the rendezvous Store of a rank started by a worker, served by the coordinator's
// StoreSet/StoreGet/StoreAdd RPCs (store.proto) in the key space of one (job_id, attempt).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tls.h"
#include "engine/comm/store.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun {

struct GrpcStoreOptions {
  std::string address;  // HOST:PORT of the coordinator (RankAssignment.store.address)
  std::string job_id;
  int attempt = 0;
  // Deadline of one call that does not wait for a key.
  std::chrono::milliseconds call_timeout{10000};
  // How long Set and Add keep retrying while the coordinator is UNAVAILABLE (restarting).
  std::chrono::milliseconds unavailable_budget{60000};
  // Longest wait asked of the coordinator in one StoreGet; longer waits are split into several
  // calls, so that a restarted coordinator is reached again without waiting for a stale call.
  std::chrono::milliseconds max_wait_per_call{30000};
  // TLS as the worker that started the rank (RankStart.tls); none: plaintext.
  TlsFiles tls;
};

// Owns one gRPC channel (or a stub given by a test). Thread-safe: gRPC stubs are.
//
// Errors are the coordinator's (store.proto): ABORTED once the attempt is no longer current,
// NOT_FOUND for an unknown job, DEADLINE_EXCEEDED when a waited-for key does not appear in time
// (the message names the key). UNAVAILABLE is retried with backoff while time is left.
class GrpcStore : public Store {
 public:
  // INVALID_ARGUMENT for an empty address or job id or an attempt below 1, or TLS files that
  // cannot be used (the message names the RankStart field).
  static StatusOr<std::shared_ptr<GrpcStore>> Create(const GrpcStoreOptions& options);
  // For tests: talk through `stub` instead of a channel of our own.
  GrpcStore(std::shared_ptr<v1::CoordinatorService::StubInterface> stub, GrpcStoreOptions options);

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys) override;

 private:
  // One StoreGet; found = false when the key is missing and `wait` is false.
  StatusOr<std::pair<bool, std::string>> GetOnce(const std::string& key, bool wait,
                                                 std::chrono::milliseconds timeout);

  std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  GrpcStoreOptions options_;
  // Add's request ids: a random prefix per client and a sequence number (see StoreAddRequest).
  std::string add_id_prefix_;
  std::atomic<uint64_t> add_sequence_{0};
};

}  // namespace meshrun
