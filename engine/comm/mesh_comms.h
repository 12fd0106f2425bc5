// One rank's communicators for every axis of the device mesh (docs/parallelism.md): pp,
// dp_replicate, dp_shard, cp, tp and the flattened dp, dp_shard_cp, dp_cp. Built once at rank
// start, before the first step; the parallel plans (FSDP, tp, cp) take their groups from here.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/parallel_dims.h"
#include "common/status.h"
#include "engine/comm/communicator.h"
#include "engine/comm/store.h"

namespace meshrun {

struct MeshCommsOptions {
  // Group g of axis a bootstraps under "<store_prefix>/<a>/<g>" (g = the group's index in
  // ParallelDims::Groups(a)). Use a fresh prefix per job attempt when the store outlives one
  // (e.g. "comm/attempt-2"): stale addresses from a dead attempt would be read otherwise.
  std::string store_prefix = "comm";
  // Bootstrap timeout per group and every communicator's default call timeout.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Owns this rank's eight communicators. Groups of size 1 get a size-1 communicator that never
// touches the backend. Not thread-safe to build; afterwards Get() is safe from any thread
// (each Communicator itself is single-threaded, see communicator.h). Created by the rank's
// main (trainer setup); every rank of the job must call Create with the same dims, store and
// options, since groups connect one axis at a time in kAllMeshAxes order.
class MeshComms {
 public:
  // Connects every group `rank` belongs to through `backend`. `stats` (may be null) receives
  // every communicator's counts. Errors name the axis and group that failed to connect.
  static StatusOr<std::unique_ptr<MeshComms>> Create(const ParallelDims& dims, int rank,
                                                     std::shared_ptr<Store> store,
                                                     CommBackend& backend,
                                                     std::shared_ptr<CommStats> stats,
                                                     const MeshCommsOptions& options = {});
  // The same, keeping `backend` alive as long as the MeshComms (backend_factory.h's ConnectMesh).
  static StatusOr<std::unique_ptr<MeshComms>> Create(const ParallelDims& dims, int rank,
                                                     std::shared_ptr<Store> store,
                                                     std::shared_ptr<CommBackend> backend,
                                                     std::shared_ptr<CommStats> stats,
                                                     const MeshCommsOptions& options = {});

  // This rank's communicator of `axis`; its rank() is ParallelDims::IndexInGroup.
  Communicator& Get(MeshAxis axis) const { return *comms_[Index(axis)]; }
  // The global ranks of that group, ascending (ParallelDims::GroupOf).
  const std::vector<int>& Members(MeshAxis axis) const { return members_[Index(axis)]; }
  // The store prefix the group connected under, e.g. "comm/tp/1".
  const std::string& GroupId(MeshAxis axis) const { return comms_[Index(axis)]->group_id(); }
  // Whether `axis` reuses the connections of an earlier axis with the same members.
  bool SharesConnection(MeshAxis axis) const { return shared_[Index(axis)]; }

  // Device backends: the model's compute stream (a cudaStream_t) for every communicator
  // (Communicator::SetComputeStream). Called once by the trainer after it made its stream.
  void SetComputeStream(void* stream);

  int rank() const { return rank_; }
  const ParallelDims& dims() const { return dims_; }
  const std::shared_ptr<CommStats>& stats() const { return stats_; }

 private:
  static constexpr size_t kNumAxes = kAllMeshAxes.size();
  static size_t Index(MeshAxis axis) { return static_cast<size_t>(axis); }

  MeshComms(const ParallelDims& dims, int rank, std::shared_ptr<CommStats> stats)
      : dims_(dims), rank_(rank), stats_(std::move(stats)) {}

  ParallelDims dims_;
  int rank_;
  std::shared_ptr<CommStats> stats_;
  std::shared_ptr<CommBackend> backend_;  // kept alive for its communicators (may be null)
  std::array<std::shared_ptr<Communicator>, kNumAxes> comms_;
  std::array<bool, kNumAxes> shared_{};  // true: an alias of an earlier axis with equal members
  std::array<std::vector<int>, kNumAxes> members_;
};

}  // namespace meshrun
