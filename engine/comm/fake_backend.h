// An in-process backend: the N ranks of a group are N threads of one process that run the
// real collective semantics over shared memory, with injectable failures and hangs. For unit
// tests of anything that communicates (c10d's fake process group). It lives in engine/comm,
// not tests/fakes, because it is a complete backend that multi-rank tests of other
// components (trainer, FSDP, tp) link as one library with the interface it implements.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace meshrun {

enum class FakeFault {
  kFail,  // the call returns UNAVAILABLE at once without joining: peers time out
  kHang,  // the call blocks for its whole timeout without joining, then DEADLINE_EXCEEDED
};

// One group of `size` in-process ranks. Each rank's communicator is used by its own thread.
// Collectives rendezvous by call sequence number: every member contributes a copy of its
// input, waits (bounded by the call's timeout) for all others, then computes its own result
// (sums in rank order, so every rank gets bitwise identical results). A member that calls a
// different op, size or root than its peers gets INTERNAL naming both calls, as do its peers.
// Point-to-point messages match in posting order per (sender, receiver) and are delivered when
// the later of the two ends is posted (StartSend / StartRecv post without waiting). Send blocks
// until the receiver has posted its receive, as on Gloo, so Send-then-Recv on both sides of a
// pair times out here just as it would deadlock there.
// Thread-safe; owned through shared_ptr by its communicators.
class FakeWorld : public std::enable_shared_from_this<FakeWorld> {
 public:
  static std::shared_ptr<FakeWorld> Create(int size, std::string group_id = "fake");
  ~FakeWorld();

  int size() const { return size_; }
  const std::string& group_id() const { return group_id_; }

  // The communicator of config.rank; config.size must equal size() (INVALID_ARGUMENT).
  // config.group_id is replaced by this world's when empty.
  StatusOr<std::unique_ptr<Communicator>> Connect(CommConfig config);
  // Every rank's communicator of a group of `axis`, counting into `stats` (may be null).
  std::vector<std::unique_ptr<Communicator>> ConnectAll(
      MeshAxis axis, std::shared_ptr<CommStats> stats,
      std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // Makes call number `call_index` (0-based, counting every call of `rank`'s communicator that
  // reaches the backend: size() > 1 and nonzero sizes) behave as `fault`.
  void InjectFault(int rank, int64_t call_index, FakeFault fault);

  struct Impl;  // shared state; defined in fake_backend.cc

 private:
  FakeWorld(int size, std::string group_id);

  const int size_;
  const std::string group_id_;
  std::unique_ptr<Impl> impl_;
};

// A CommBackend over FakeWorlds: the first Connect of a group_id creates its world, later ones
// (other threads = other ranks) join it. Store is unused: the registry is the rendezvous.
// Share one FakeBackend between the threads that play the ranks. Thread-safe.
class FakeBackend : public CommBackend {
 public:
  std::string name() const override { return "fake"; }
  StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                  std::shared_ptr<Store> store) override;

  // The world of a group, creating it when absent (so faults can be set before ranks join).
  std::shared_ptr<FakeWorld> World(const std::string& group_id, int size);
  // Group ids connected so far, e.g. "comm/tp/0".
  std::vector<std::string> GroupIds() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<FakeWorld>> worlds_;
};

}  // namespace meshrun
