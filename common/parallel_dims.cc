// Rank arithmetic of the device mesh (docs/parallelism.md). Axes are stored as an array indexed
// 0..4 = (pp, dp_replicate, dp_shard, cp, tp) so that single and flattened axes share one code
// path: an axis is the set of mesh dims it spans.
#include "common/parallel_dims.h"

#include <algorithm>
#include <cassert>
#include <cstdint>

namespace meshrun {
namespace {

constexpr int kNumDims = 5;
using DimMask = std::array<bool, kNumDims>;

// Which of the mesh dims (P, R, S, C, T) an axis spans.
DimMask SpannedDims(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kPp: return {true, false, false, false, false};
    case MeshAxis::kDpReplicate: return {false, true, false, false, false};
    case MeshAxis::kDpShard: return {false, false, true, false, false};
    case MeshAxis::kCp: return {false, false, false, true, false};
    case MeshAxis::kTp: return {false, false, false, false, true};
    case MeshAxis::kDp: return {false, true, true, false, false};
    case MeshAxis::kDpShardCp: return {false, false, true, true, false};
    case MeshAxis::kDpCp: return {false, true, true, true, false};
  }
  assert(false && "unknown MeshAxis");
  return {false, false, false, false, false};
}

std::array<int, kNumDims> ToArray(const MeshCoords& c) {
  return {c.pp, c.dp_replicate, c.dp_shard, c.cp, c.tp};
}

MeshCoords FromArray(const std::array<int, kNumDims>& a) {
  MeshCoords c;
  c.pp = a[0];
  c.dp_replicate = a[1];
  c.dp_shard = a[2];
  c.cp = a[3];
  c.tp = a[4];
  return c;
}

// Field names and what size 1 means, for error messages.
constexpr const char* kSizeFields[kNumDims] = {"pp_size", "dp_replicate_size", "dp_shard_size",
                                               "cp_size", "tp_size"};
constexpr const char* kSizeOneMeaning[kNumDims] = {
    "1 means no pipeline parallelism", "1 means no replication", "1 means no FSDP sharding",
    "1 means no context parallelism", "1 means no tensor parallelism"};

}  // namespace

const char* MeshAxisName(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kPp: return "pp";
    case MeshAxis::kDpReplicate: return "dp_replicate";
    case MeshAxis::kDpShard: return "dp_shard";
    case MeshAxis::kCp: return "cp";
    case MeshAxis::kTp: return "tp";
    case MeshAxis::kDp: return "dp";
    case MeshAxis::kDpShardCp: return "dp_shard_cp";
    case MeshAxis::kDpCp: return "dp_cp";
  }
  return "unknown";
}

std::optional<MeshAxis> MeshAxisFromName(std::string_view name) {
  for (MeshAxis axis : kAllMeshAxes) {
    if (name == MeshAxisName(axis)) return axis;
  }
  return std::nullopt;
}

StatusOr<ParallelDims> ParallelDims::Create(int pp, int dp_replicate, int dp_shard, int cp,
                                            int tp) {
  const std::array<int, kNumDims> sizes = {pp, dp_replicate, dp_shard, cp, tp};
  for (int d = 0; d < kNumDims; ++d) {
    if (sizes[d] < 1) {
      return InvalidArgumentError(std::string("parallelism.") + kSizeFields[d] +
                                  ": must be at least 1, got " + std::to_string(sizes[d]) +
                                  " (hint: set " + kSizeFields[d] + " to 1 or more; " +
                                  kSizeOneMeaning[d] + ")");
    }
  }
  int64_t world = 1;
  for (int size : sizes) world = std::min<int64_t>(world * size, int64_t{kMaxWorldSize} + 1);
  if (world > kMaxWorldSize) {
    return InvalidArgumentError(
        "parallelism: " + (pp > 1 ? "pp_size(" + std::to_string(pp) + ")·" : std::string()) +
        "dp_replicate_size(" + std::to_string(dp_replicate) + ")·dp_shard_size(" +
        std::to_string(dp_shard) + ")·cp_size(" + std::to_string(cp) + ")·tp_size(" +
        std::to_string(tp) + ") exceeds the largest supported world size " +
        std::to_string(kMaxWorldSize) + " (hint: use smaller parallelism sizes)");
  }
  return ParallelDims(sizes);
}

int ParallelDims::AxisSize(MeshAxis axis) const {
  const DimMask mask = SpannedDims(axis);
  int size = 1;
  for (int d = 0; d < kNumDims; ++d) {
    if (mask[d]) size *= sizes_[d];
  }
  return size;
}

MeshCoords ParallelDims::CoordsOf(int rank) const {
  assert(rank >= 0 && rank < world_size());
  std::array<int, kNumDims> coords{};
  for (int d = kNumDims - 1; d >= 0; --d) {
    coords[d] = rank % sizes_[d];
    rank /= sizes_[d];
  }
  return FromArray(coords);
}

int ParallelDims::RankOf(const MeshCoords& coords) const {
  const std::array<int, kNumDims> c = ToArray(coords);
  int rank = 0;
  for (int d = 0; d < kNumDims; ++d) {
    assert(c[d] >= 0 && c[d] < sizes_[d]);
    rank = rank * sizes_[d] + c[d];
  }
  return rank;
}

std::vector<int> ParallelDims::GroupOf(int rank, MeshAxis axis) const {
  const DimMask mask = SpannedDims(axis);
  std::array<int, kNumDims> coords = ToArray(CoordsOf(rank));
  // Start at coordinate 0 on every spanned dim, then count through them like an odometer with
  // the innermost dim fastest. Rank grows with that row-major order, so the group comes out
  // sorted.
  for (int d = 0; d < kNumDims; ++d) {
    if (mask[d]) coords[d] = 0;
  }
  std::vector<int> group;
  group.reserve(AxisSize(axis));
  while (true) {
    group.push_back(RankOf(FromArray(coords)));
    int d = kNumDims - 1;
    for (; d >= 0; --d) {
      if (!mask[d]) continue;
      if (++coords[d] < sizes_[d]) break;
      coords[d] = 0;
    }
    if (d < 0) break;  // wrapped around every spanned dim
  }
  return group;
}

int ParallelDims::IndexInGroup(int rank, MeshAxis axis) const {
  const DimMask mask = SpannedDims(axis);
  const std::array<int, kNumDims> coords = ToArray(CoordsOf(rank));
  int index = 0;
  for (int d = 0; d < kNumDims; ++d) {
    if (mask[d]) index = index * sizes_[d] + coords[d];
  }
  return index;
}

int ParallelDims::GroupIndexOf(int rank, MeshAxis axis) const {
  const DimMask mask = SpannedDims(axis);
  const std::array<int, kNumDims> coords = ToArray(CoordsOf(rank));
  int index = 0;
  for (int d = 0; d < kNumDims; ++d) {
    if (!mask[d]) index = index * sizes_[d] + coords[d];
  }
  return index;
}

std::vector<std::vector<int>> ParallelDims::Groups(MeshAxis axis) const {
  std::vector<std::vector<int>> groups;
  groups.reserve(world_size() / AxisSize(axis));
  // Each group is emitted once, by its first member (index 0); iterating ranks upwards orders
  // the groups by their smallest rank.
  for (int rank = 0; rank < world_size(); ++rank) {
    if (IndexInGroup(rank, axis) == 0) groups.push_back(GroupOf(rank, axis));
  }
  return groups;
}

std::string ParallelDims::ToString() const {
  return (pp() > 1 ? "pp=" + std::to_string(pp()) + " " : std::string()) +
         "dp_replicate=" + std::to_string(dp_replicate()) +
         " dp_shard=" + std::to_string(dp_shard()) + " cp=" + std::to_string(cp()) +
         " tp=" + std::to_string(tp()) + " (world size " + std::to_string(world_size()) + ")";
}

}  // namespace meshrun
