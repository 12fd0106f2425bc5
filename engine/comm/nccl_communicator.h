// The NCCL backend of the Communicator interface (engine/comm/communicator.h): collectives on
// DEVICE buffers. The world communicator bootstraps through the Store (rank 0 Sets the
// ncclUniqueId bytes, the others Get them); the groups of every mesh axis are split from it with
// ncclCommSplit. Every communicator is non-blocking (ncclConfig_t::blocking = 0) and every wait
// polls ncclCommGetAsyncError against the call's deadline: a hung or dead peer ends in
// ncclCommAbort and DEADLINE_EXCEEDED / UNAVAILABLE, never a silent hang. No NCCL type leaks from
// this header.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "engine/comm/communicator.h"

namespace meshrun::gpu {

struct NcclOptions {
  int device = 0;
  // The stream that produces and consumes the buffers given to collectives (the model's compute
  // stream). Each call first makes its own communication stream wait for the work enqueued here
  // so far (an event); calls return when the collective finished, so later work is ordered after.
  // nullptr: the legacy default stream.
  cudaStream_t compute_stream = nullptr;
  // Set later by MeshComms::SetComputeStream (the trainer's CudaContext stream).
  // Polling period of every wait (init, split, collectives, finalize).
  std::chrono::microseconds poll_interval{20};
};

// Builds NCCL communicators. Thread-safe (one mutex around bootstrap); callers connect groups in
// one fixed order on every rank (MeshComms does), which ncclCommSplit requires: it is collective
// over the world communicator.
class NcclBackend : public CommBackend {
 public:
  // UNAVAILABLE when the device does not exist.
  static StatusOr<std::shared_ptr<NcclBackend>> Create(const NcclOptions& options = {});
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }

  // Bootstraps the world communicator of `world_size` ranks through `store` (key
  // "nccl/world/unique_id"). Every rank of the job calls it once, before Connect. Afterwards
  // Connect splits each group from the world (ncclCommSplit, color = the world rank of the
  // group's rank 0, exchanged through the group's store); without it, Connect bootstraps each
  // group on its own ncclUniqueId. DEADLINE_EXCEEDED (after ncclCommAbort) when the world does
  // not assemble within `timeout`.
  Status InitWorld(std::shared_ptr<Store> store, int rank, int world_size,
                   std::chrono::milliseconds timeout);
  bool has_world() const;

  // config.size ≥ 1; a size-1 group is created too (its calls never reach NCCL).
  StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                  std::shared_ptr<Store> store) override;
  // A size-1 communicator whose shortcuts (ReduceScatter, AllGather, self-SendRecv) copy device
  // memory with cudaMemcpyAsync on the compute stream (MeshComms' axes of size 1).
  std::unique_ptr<Communicator> MakeSolo(CommConfig config) override;

  struct State;  // NCCL handles (nccl_communicator.cc)

 private:
  explicit NcclBackend(const NcclOptions& options);

  NcclOptions options_;
  mutable std::mutex mu_;
  std::unique_ptr<State> state_;
};

// The NCCL version linked in, e.g. "2.28.9".
std::string NcclVersion();

}  // namespace meshrun::gpu
