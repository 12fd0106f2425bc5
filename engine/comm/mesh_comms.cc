// Connects one communicator per mesh axis, in the fixed kAllMeshAxes order on every rank, so
// that each group's bootstrap only waits on peers that are at the same axis.
#include "engine/comm/mesh_comms.h"

#include <algorithm>

namespace meshrun {

StatusOr<std::unique_ptr<MeshComms>> MeshComms::Create(const ParallelDims& dims, int rank,
                                                       std::shared_ptr<Store> store,
                                                       CommBackend& backend,
                                                       std::shared_ptr<CommStats> stats,
                                                       const MeshCommsOptions& options) {
  if (rank < 0 || rank >= dims.world_size()) {
    return InvalidArgumentError("mesh comms: rank " + std::to_string(rank) +
                                " is outside the world [0, " + std::to_string(dims.world_size()) +
                                ") of " + dims.ToString());
  }
  if (!store) return InvalidArgumentError("mesh comms: no store");
  std::unique_ptr<MeshComms> mesh(new MeshComms(dims, rank, stats));
  static_assert(static_cast<size_t>(MeshAxis::kPp) + 1 == kNumAxes,
                "MeshComms indexes its arrays by MeshAxis");
  for (MeshAxis axis : kAllMeshAxes) {
    // This rank's group only (enumerating every group made a count's setup grow with the
    // world: half of a 1,024-rank count, bench/count).
    std::vector<int> members = dims.GroupOf(rank, axis);
    const int group_index = dims.GroupIndexOf(rank, axis);
    const std::string axis_name = MeshAxisName(axis);

    CommConfig config;
    config.axis = axis;
    config.group_id = options.store_prefix + "/" + axis_name + "/" + std::to_string(group_index);
    config.rank = dims.IndexInGroup(rank, axis);
    config.size = static_cast<int>(members.size());
    config.timeout = options.timeout;
    config.stats = stats;

    std::shared_ptr<Communicator> comm;
    // An earlier axis with the same members already connected them: share its transport
    // (halves start-up for meshes like dp_replicate × tp, where dp and dp_cp equal dp_replicate).
    std::shared_ptr<Communicator> same;
    for (MeshAxis earlier : kAllMeshAxes) {
      if (earlier == axis) break;
      if (mesh->members_[Index(earlier)] == members) same = mesh->comms_[Index(earlier)];
    }
    if (config.size == 1) {
      comm = backend.MakeSolo(config);
    } else if (same) {
      comm = MakeAliasCommunicator(config, same);
      mesh->shared_[Index(axis)] = true;
    } else {
      auto group_store = std::make_shared<PrefixStore>(config.group_id, store);
      StatusOr<std::unique_ptr<Communicator>> connected = backend.Connect(config, group_store);
      if (!connected.ok()) {
        return Status(connected.status().code(),
                      "mesh comms: rank " + std::to_string(rank) + " could not connect its " +
                          axis_name + " group " + config.group_id + " (" + backend.name() +
                          "): " + connected.status().message());
      }
      comm = std::move(connected).value();
    }
    mesh->comms_[Index(axis)] = std::move(comm);
    mesh->members_[Index(axis)] = std::move(members);
  }
  return mesh;
}

}  // namespace meshrun

namespace meshrun {

StatusOr<std::unique_ptr<MeshComms>> MeshComms::Create(const ParallelDims& dims, int rank,
                                                       std::shared_ptr<Store> store,
                                                       std::shared_ptr<CommBackend> backend,
                                                       std::shared_ptr<CommStats> stats,
                                                       const MeshCommsOptions& options) {
  if (!backend) return InvalidArgumentError("mesh comms: no backend");
  MESHRUN_ASSIGN_OR_RETURN(
      std::unique_ptr<MeshComms> mesh,
      Create(dims, rank, std::move(store), *backend, std::move(stats), options));
  mesh->backend_ = std::move(backend);
  return mesh;
}

void MeshComms::SetComputeStream(void* stream) {
  for (const std::shared_ptr<Communicator>& c : comms_) {
    if (c) c->SetComputeStream(stream);
  }
}

}  // namespace meshrun
