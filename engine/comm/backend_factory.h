// The one place that picks a communication backend: by resources.device, Gloo (TCP) for cpu and
// NCCL for cuda. The rank's start (rank/rank_main.cc, the one rank entry) calls ConnectMesh and
// hands the MeshComms to the Trainer, which never names a backend. A build without the backend a
// device needs says so (INVALID_ARGUMENT naming resources.device).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/parallel_dims.h"
#include "common/status.h"
#include "engine/comm/communicator.h"
#include "engine/comm/mesh_comms.h"
#include "engine/comm/store.h"

namespace meshrun {

struct CommBackendOptions {
  // Gloo: the address peers reach this rank at (the worker's --address); empty: 127.0.0.1.
  std::string hostname;
  // NCCL: the CUDA device ordinal of this rank (0: the one GPU a worker makes visible to it).
  int cuda_device = 0;
};

// "gloo" for cpu, "nccl" for cuda: the backend resources.device trains over.
const char* CommBackendName(const std::string& device);

// Whether this build has the backend of `device` (cpu: Gloo is left out of engine-only builds;
// cuda: NCCL is found at configure time).
bool HasCommBackend(const std::string& device);

// The backend of `device`, not yet connected. INVALID_ARGUMENT (resources.device) when this build
// lacks it or the device is unknown.
StatusOr<std::shared_ptr<CommBackend>> CreateCommBackend(const std::string& device,
                                                         const CommBackendOptions& options = {});

// Every communicator of `rank` over the backend of `device`. On cuda the NCCL world communicator
// is first bootstrapped through `store` (rank 0 Sets the ncclUniqueId) and every axis group is
// split from it (ncclCommSplit), all non-blocking and bounded by options.timeout
// (parallelism.comm_timeout_seconds). The MeshComms keeps the backend alive.
StatusOr<std::unique_ptr<MeshComms>> ConnectMesh(const std::string& device,
                                                 const ParallelDims& dims, int rank,
                                                 std::shared_ptr<Store> store,
                                                 std::shared_ptr<CommStats> stats,
                                                 const MeshCommsOptions& options,
                                                 const CommBackendOptions& backend_options = {});

}  // namespace meshrun
