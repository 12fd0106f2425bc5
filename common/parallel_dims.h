// The device mesh of docs/parallelism.md: axis sizes (P, R, S, C, T), rank <-> coordinates, and the
// process groups of every axis (single and flattened). Pure arithmetic: no I/O, no threads.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshrun {

// Mesh axes. kDpReplicate..kTp are the mesh's own inner axes, outermost to innermost; kDp,
// kDpShardCp and kDpCp are flattened products of adjacent axes; kPp, the pipeline axis, is the
// outermost axis of the mesh (listed first in kAllMeshAxes) but numbered last, so that the values
// of the older axes stay what they were.
enum class MeshAxis {
  kDpReplicate,  // "dp_replicate": full replicas, gradients all-reduced (HSDP outer axis)
  kDpShard,      // "dp_shard": FSDP sharding
  kCp,           // "cp": context parallel
  kTp,           // "tp": tensor parallel
  kDp,           // "dp" = dp_replicate x dp_shard: ranks that see different data
  kDpShardCp,    // "dp_shard_cp" = dp_shard x cp: the group FSDP shards parameters over
  kDpCp,         // "dp_cp" = dp_replicate x dp_shard x cp: ranks that hold different tokens
  kPp,           // "pp": pipeline stages (outermost); every other group lives inside one stage
};

// Every axis: the five mesh axes outermost first, then the three flattened ones.
inline constexpr std::array<MeshAxis, 8> kAllMeshAxes = {
    MeshAxis::kPp, MeshAxis::kDpReplicate, MeshAxis::kDpShard,   MeshAxis::kCp,
    MeshAxis::kTp, MeshAxis::kDp,          MeshAxis::kDpShardCp, MeshAxis::kDpCp};

// Whether `axis` is one of the three flattened products (dp, dp_shard_cp, dp_cp).
inline constexpr bool IsFlattenedAxis(MeshAxis axis) {
  return axis == MeshAxis::kDp || axis == MeshAxis::kDpShardCp || axis == MeshAxis::kDpCp;
}

// "pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp".
const char* MeshAxisName(MeshAxis axis);
// The inverse of MeshAxisName; nullopt for an unknown name.
std::optional<MeshAxis> MeshAxisFromName(std::string_view name);

// A rank's position on the five mesh axes (each in [0, size)). `pp` is the outermost axis but the
// last member, so that {r, s, c, t} still reads as a pp-0 coordinate.
struct MeshCoords {
  int dp_replicate = 0;
  int dp_shard = 0;
  int cp = 0;
  int tp = 0;
  int pp = 0;

  bool operator==(const MeshCoords&) const = default;
};

// Axis sizes of one job's mesh and the rank arithmetic on them. A value type: immutable after
// Create, cheap to copy, safe to share between threads. Rank arguments outside
// [0, world_size()) are a caller bug (asserted).
class ParallelDims {
 public:
  // Largest world size accepted; keeps every rank computation inside int.
  static constexpr int kMaxWorldSize = 1 << 20;

  // Fails with INVALID_ARGUMENT naming the field (e.g. `parallelism.cp_size`) when a size is
  // below 1, or naming `parallelism` when the product exceeds kMaxWorldSize.
  static StatusOr<ParallelDims> Create(int pp, int dp_replicate, int dp_shard, int cp, int tp);
  // A mesh without pipeline parallelism (pp = 1).
  static StatusOr<ParallelDims> Create(int dp_replicate, int dp_shard, int cp, int tp) {
    return Create(1, dp_replicate, dp_shard, cp, tp);
  }

  int pp() const { return sizes_[0]; }
  int dp_replicate() const { return sizes_[1]; }
  int dp_shard() const { return sizes_[2]; }
  int cp() const { return sizes_[3]; }
  int tp() const { return sizes_[4]; }
  int world_size() const { return sizes_[0] * sizes_[1] * sizes_[2] * sizes_[3] * sizes_[4]; }
  // Ranks per pipeline stage: R·S·C·T.
  int stage_size() const { return world_size() / pp(); }

  // Number of ranks in one group of `axis` (the product for flattened axes).
  int AxisSize(MeshAxis axis) const;

  // g = (((p·R + r)·S + s)·C + c)·T + t and its inverse.
  MeshCoords CoordsOf(int rank) const;
  int RankOf(const MeshCoords& coords) const;

  // Every group of `axis`, each sorted ascending, ordered by their smallest rank. The groups
  // partition the world; members differ only in the coordinates the axis spans.
  std::vector<std::vector<int>> Groups(MeshAxis axis) const;
  // The group of `axis` that holds `rank`, sorted ascending.
  std::vector<int> GroupOf(int rank, MeshAxis axis) const;
  // Position of `rank` in GroupOf(rank, axis): the row-major index over the spanned axes,
  // e.g. d = r·S + s for dp and s·C + c for dp_shard_cp.
  int IndexInGroup(int rank, MeshAxis axis) const;
  // Position of `rank`'s group in Groups(axis), without enumerating them: the row-major index
  // over the axes `axis` does not span (groups are ordered by their first member, whose
  // spanned coordinates are 0).
  int GroupIndexOf(int rank, MeshAxis axis) const;

  // "dp_replicate=1 dp_shard=2 cp=1 tp=2 (world size 4)"; with pp > 1 prefixed "pp=2 ".
  std::string ToString() const;

  bool operator==(const ParallelDims&) const = default;

 private:
  explicit ParallelDims(std::array<int, 5> sizes) : sizes_(sizes) {}

  std::array<int, 5> sizes_;  // P, R, S, C, T
};

// The context-parallel layout of a sequence (docs/data.md), the one copy of its index math:
// the sequence is cut into 2·cp_size equal chunks and cp rank c holds chunk c, then chunk
// 2·cp_size − 1 − c (load balancing for causal attention). `half` is 0 or 1: the chunk index of
// the rank's first or second half. With cp_size 1 the one rank holds chunks 0 and 1 of 2.
constexpr int CpChunkIndex(int cp_size, int cp_rank, int half) {
  return half == 0 ? cp_rank : 2 * cp_size - 1 - cp_rank;
}

}  // namespace meshrun
