// The one boundary between the in-process mesh axis (meshrun::MeshAxis, common/parallel_dims.h)
// and the API's enum (meshrun.v1.MeshAxis). Inside a process an axis is a MeshAxis and its
// label or log spelling is MeshAxisName ("dp_shard"); the proto enum exists only on the wire.
// Header-only, pure.
#pragma once

#include <optional>

#include "common/parallel_dims.h"
#include "meshrun/v1/types.pb.h"

namespace meshrun {

// The wire value of one of the mesh's own four axes; MESH_AXIS_UNSPECIFIED for a flattened axis
// (dp, dp_shard_cp, dp_cp), which the API does not name: traffic of those is counted under the
// axis whose group it runs over (see CommStats in types.proto).
inline v1::MeshAxis MeshAxisToProto(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kDpReplicate: return v1::MESH_AXIS_DP_REPLICATE;
    case MeshAxis::kDpShard: return v1::MESH_AXIS_DP_SHARD;
    case MeshAxis::kCp: return v1::MESH_AXIS_CP;
    case MeshAxis::kTp: return v1::MESH_AXIS_TP;
    default: return v1::MESH_AXIS_UNSPECIFIED;
  }
}

// The axis of a wire value; nullopt for MESH_AXIS_UNSPECIFIED and values this build lacks.
inline std::optional<MeshAxis> MeshAxisFromProto(v1::MeshAxis axis) {
  switch (axis) {
    case v1::MESH_AXIS_DP_REPLICATE: return MeshAxis::kDpReplicate;
    case v1::MESH_AXIS_DP_SHARD: return MeshAxis::kDpShard;
    case v1::MESH_AXIS_CP: return MeshAxis::kCp;
    case v1::MESH_AXIS_TP: return MeshAxis::kTp;
    default: return std::nullopt;
  }
}

}  // namespace meshrun
