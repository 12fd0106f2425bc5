// The one boundary between the in-process mesh axis (meshrun::MeshAxis, common/parallel_dims.h)
// and the API's enum (meshrun.v1.MeshAxis). Inside a process an axis is a MeshAxis and its
// label or log spelling is MeshAxisName ("dp_shard"); the proto enum exists only on the wire.
// Header-only, pure.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// The mesh's own axes, outermost first: the order of every list of axes the control plane
// writes (the API's MeshAxisCoord lists, the coordinator's stored coordinates, labels).
inline constexpr std::array<MeshAxis, 5> kMeshOwnAxes = {
    MeshAxis::kPp, MeshAxis::kDpReplicate, MeshAxis::kDpShard, MeshAxis::kCp, MeshAxis::kTp};

// A rank's coordinate on one of the mesh's own axes (0 for a flattened one).
inline int CoordOn(const MeshCoords& c, MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kPp: return c.pp;
    case MeshAxis::kDpReplicate: return c.dp_replicate;
    case MeshAxis::kDpShard: return c.dp_shard;
    case MeshAxis::kCp: return c.cp;
    case MeshAxis::kTp: return c.tp;
    default: return 0;
  }
}

// Sets a rank's coordinate on one of the mesh's own axes (a flattened one is ignored).
inline void SetCoordOn(MeshCoords& c, MeshAxis axis, int value) {
  switch (axis) {
    case MeshAxis::kPp: c.pp = value; break;
    case MeshAxis::kDpReplicate: c.dp_replicate = value; break;
    case MeshAxis::kDpShard: c.dp_shard = value; break;
    case MeshAxis::kCp: c.cp = value; break;
    case MeshAxis::kTp: c.tp = value; break;
    default: break;
  }
}

// The wire's MeshCoords of a rank (every field, pp included).
inline void SetProtoCoords(const MeshCoords& c, v1::MeshCoords* out) {
  out->set_dp_replicate(c.dp_replicate);
  out->set_dp_shard(c.dp_shard);
  out->set_cp(c.cp);
  out->set_tp(c.tp);
  out->set_pp(c.pp);
}

// A rank's place on `mesh` as the ordered list of the mesh's own axes (kMeshOwnAxes), each with
// its size: what RankInfo.axes and RankAssignment.axes carry.
template <typename Repeated>
void AddMeshAxes(const ParallelDims& mesh, const MeshCoords& c, Repeated* out) {
  for (MeshAxis axis : kMeshOwnAxes) {
    v1::MeshAxisCoord* a = out->Add();
    a->set_axis(MeshAxisToProto(axis));
    a->set_size(mesh.AxisSize(axis));
    a->set_index(CoordOn(c, axis));
  }
}

// A rank's place on one of its mesh's own axes.
struct AxisPlace {
  MeshAxis axis;
  int size;  // 0 when a peer that predates RankInfo.axes did not say
  int index;
};

// A rank's places on its mesh's own axes, outermost first: RankInfo.axes as the coordinator
// lists them; from the per-axis MeshCoords (sizes unknown) when a coordinator sent no list. What
// every table, line and JSON object of a rank's coordinates is made from.
inline std::vector<AxisPlace> RankAxes(const v1::RankInfo& r) {
  std::vector<AxisPlace> out;
  for (const v1::MeshAxisCoord& a : r.axes()) {
    const std::optional<MeshAxis> axis = MeshAxisFromProto(a.axis());
    if (axis) out.push_back({*axis, a.size(), a.index()});
  }
  if (!out.empty()) return out;
  const v1::MeshCoords& c = r.coords();
  for (MeshAxis axis : kMeshOwnAxes) {
    int index = 0;
    switch (axis) {
      case MeshAxis::kPp: index = c.pp(); break;
      case MeshAxis::kDpReplicate: index = c.dp_replicate(); break;
      case MeshAxis::kDpShard: index = c.dp_shard(); break;
      case MeshAxis::kCp: index = c.cp(); break;
      case MeshAxis::kTp: index = c.tp(); break;
      default: break;
    }
    out.push_back({axis, 0, index});
  }
  return out;
}

// Whether a rank's mesh has pipeline stages (a pp axis of size > 1, or a stage past the first).
inline bool RankPipelined(const std::vector<AxisPlace>& places) {
  for (const AxisPlace& a : places) {
    if (a.axis == MeshAxis::kPp && (a.size > 1 || a.index > 0)) return true;
  }
  return false;
}
inline bool RankPipelined(const v1::RankInfo& r) {
  return RankPipelined(RankAxes(r));
}

// The axes a table or a line of ranks shows: every own axis, pp only on a pipelined mesh (as
// ParallelDims::ToString writes a mesh).
inline bool AxisShown(MeshAxis axis, bool pipelined) {
  return axis != MeshAxis::kPp || pipelined;
}

}  // namespace meshrun
