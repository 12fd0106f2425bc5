// The one boundary between the in-process mesh axis (meshrun::MeshAxis, common/parallel_dims.h)
// and the API's enum (meshrun.v1.MeshAxis). Inside a process an axis is a MeshAxis and its
// label or log spelling is MeshAxisName ("dp_shard"); the proto enum exists only on the wire.
// Header-only, pure.
#pragma once

#include <optional>

#include "common/parallel_dims.h"
#include "meshrun/v1/types.pb.h"

namespace meshrun {

// The wire value of an axis. The flattened ones (dp, dp_shard_cp, dp_cp) travel only in a rank's
// reports; a MetricsSample's CommStats carry only the four (types.proto).
inline v1::MeshAxis MeshAxisToProto(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kDpReplicate: return v1::MESH_AXIS_DP_REPLICATE;
    case MeshAxis::kDpShard: return v1::MESH_AXIS_DP_SHARD;
    case MeshAxis::kCp: return v1::MESH_AXIS_CP;
    case MeshAxis::kTp: return v1::MESH_AXIS_TP;
    case MeshAxis::kDp: return v1::MESH_AXIS_DP;
    case MeshAxis::kDpShardCp: return v1::MESH_AXIS_DP_SHARD_CP;
    case MeshAxis::kDpCp: return v1::MESH_AXIS_DP_CP;
    case MeshAxis::kPp: return v1::MESH_AXIS_PP;
  }
  return v1::MESH_AXIS_UNSPECIFIED;
}

// The axis of a wire value; nullopt for MESH_AXIS_UNSPECIFIED and values this build lacks.
inline std::optional<MeshAxis> MeshAxisFromProto(v1::MeshAxis axis) {
  switch (axis) {
    case v1::MESH_AXIS_DP_REPLICATE: return MeshAxis::kDpReplicate;
    case v1::MESH_AXIS_DP_SHARD: return MeshAxis::kDpShard;
    case v1::MESH_AXIS_CP: return MeshAxis::kCp;
    case v1::MESH_AXIS_TP: return MeshAxis::kTp;
    case v1::MESH_AXIS_DP: return MeshAxis::kDp;
    case v1::MESH_AXIS_DP_SHARD_CP: return MeshAxis::kDpShardCp;
    case v1::MESH_AXIS_DP_CP: return MeshAxis::kDpCp;
    case v1::MESH_AXIS_PP: return MeshAxis::kPp;
    default: return std::nullopt;
  }
}

}  // namespace meshrun
