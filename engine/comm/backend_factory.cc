// CreateCommBackend / ConnectMesh: Gloo on cpu, NCCL on cuda, each only when built in
// (MESHRUN_HAVE_GLOO, MESHRUN_HAVE_NCCL from engine/comm/CMakeLists.txt).
#include "engine/comm/backend_factory.h"

#include "common/job_spec.h"

#ifdef MESHRUN_HAVE_GLOO
#include "engine/comm/gloo_backend.h"
#endif
#ifdef MESHRUN_HAVE_NCCL
#include "engine/comm/nccl_communicator.h"
#endif

namespace meshrun {

namespace {

bool IsComputeDevice(const std::string& device, ComputeDevice kind) {
  return ParseComputeDevice(device) == kind;
}

}  // namespace

const char* CommBackendName(const std::string& device) {
  if (IsComputeDevice(device, ComputeDevice::kCpu)) return "gloo";
  if (IsComputeDevice(device, ComputeDevice::kCuda)) return "nccl";
  return "none";
}

bool HasCommBackend(const std::string& device) {
#ifdef MESHRUN_HAVE_GLOO
  if (IsComputeDevice(device, ComputeDevice::kCpu)) return true;
#endif
#ifdef MESHRUN_HAVE_NCCL
  if (IsComputeDevice(device, ComputeDevice::kCuda)) return true;
#endif
  return false;
}

StatusOr<std::shared_ptr<CommBackend>> CreateCommBackend(const std::string& device,
                                                         const CommBackendOptions& options) {
  if (!ParseComputeDevice(device)) {
    return InvalidArgumentError("resources.device: '" + device +
                                "' is not a device (hint: use cpu or cuda)");
  }
  if (!HasCommBackend(device)) {
    return InvalidArgumentError(
        std::string("resources.device: ") + device + " trains over " + CommBackendName(device) +
        " across ranks, and this build has no " + CommBackendName(device) +
        (IsComputeDevice(device, ComputeDevice::kCpu) ? " (engine-only builds leave Gloo out)"
                                                      : " (NCCL was not found)") +
        " (hint: run one rank, or use a full build" +
        (IsComputeDevice(device, ComputeDevice::kCuda) ? " with NCCL installed" : "") + ")");
  }
#ifdef MESHRUN_HAVE_GLOO
  if (IsComputeDevice(device, ComputeDevice::kCpu)) {
    GlooOptions gloo;
    if (!options.hostname.empty()) gloo.hostname = options.hostname;
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<GlooBackend> backend, GlooBackend::Create(gloo));
    return std::shared_ptr<CommBackend>(std::move(backend));
  }
#endif
#ifdef MESHRUN_HAVE_NCCL
  if (IsComputeDevice(device, ComputeDevice::kCuda)) {
    gpu::NcclOptions nccl;
    nccl.device = options.cuda_device;
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<gpu::NcclBackend> backend,
                             gpu::NcclBackend::Create(nccl));
    return std::shared_ptr<CommBackend>(std::move(backend));
  }
#endif
  (void)options;
  return InternalError("no backend for resources.device " + device);
}

StatusOr<std::unique_ptr<MeshComms>> ConnectMesh(const std::string& device,
                                                 const ParallelDims& dims, int rank,
                                                 std::shared_ptr<Store> store,
                                                 std::shared_ptr<CommStats> stats,
                                                 const MeshCommsOptions& options,
                                                 const CommBackendOptions& backend_options) {
  MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<CommBackend> backend,
                           CreateCommBackend(device, backend_options));
#ifdef MESHRUN_HAVE_NCCL
  if (IsComputeDevice(device, ComputeDevice::kCuda)) {
    if (!store) return InvalidArgumentError("mesh comms: no store");
    // One world communicator for the attempt; every axis group is split from it.
    auto* nccl = static_cast<gpu::NcclBackend*>(backend.get());
    auto world_store = std::make_shared<PrefixStore>(options.store_prefix, store);
    MESHRUN_RETURN_IF_ERROR(nccl->InitWorld(world_store, rank, dims.world_size(), options.timeout));
  }
#endif
  return MeshComms::Create(dims, rank, std::move(store), std::move(backend), std::move(stats),
                           options);
}

}  // namespace meshrun
