// The pipeline axis of ParallelDims against an independent brute force over every five-axis mesh
// of world size <= 32: ranks enumerated by nested loops with pp outermost, groups by comparing
// coordinates.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "common/parallel_dims.h"

namespace meshrun {
namespace {

using Five = std::array<int, 5>;  // (p, r, s, c, t)

std::vector<Five> AllFiveAxisMeshesUpTo(int max_world) {
  std::vector<Five> meshes;
  for (int p = 1; p <= max_world; ++p)
    for (int r = 1; p * r <= max_world; ++r)
      for (int s = 1; p * r * s <= max_world; ++s)
        for (int c = 1; p * r * s * c <= max_world; ++c)
          for (int t = 1; p * r * s * c * t <= max_world; ++t) meshes.push_back({p, r, s, c, t});
  return meshes;
}

// The test's own table of which of (p, r, s, c, t) each axis spans.
std::array<bool, 5> PpSpans(MeshAxis axis) {
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
  return {};
}

TEST(ParallelDimsPpTest, EveryRankRoundTripsThroughTheFiveAxisFormula) {
  for (const Five& m : AllFiveAxisMeshesUpTo(32)) {
    StatusOr<ParallelDims> made = ParallelDims::Create(m[0], m[1], m[2], m[3], m[4]);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    const ParallelDims& dims = *made;
    SCOPED_TRACE(dims.ToString());
    ASSERT_EQ(dims.pp(), m[0]);
    ASSERT_EQ(dims.world_size(), m[0] * m[1] * m[2] * m[3] * m[4]);
    ASSERT_EQ(dims.stage_size(), m[1] * m[2] * m[3] * m[4]);
    int g = 0;
    for (int p = 0; p < m[0]; ++p)
      for (int r = 0; r < m[1]; ++r)
        for (int s = 0; s < m[2]; ++s)
          for (int c = 0; c < m[3]; ++c)
            for (int t = 0; t < m[4]; ++t, ++g) {
              MeshCoords want;
              want.pp = p;
              want.dp_replicate = r;
              want.dp_shard = s;
              want.cp = c;
              want.tp = t;
              ASSERT_EQ(dims.CoordsOf(g), want) << "rank " << g;
              ASSERT_EQ(dims.RankOf(want), g);
              ASSERT_EQ(g, (((p * m[1] + r) * m[2] + s) * m[3] + c) * m[4] + t);
              ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kPp), p);
            }
  }
}

TEST(ParallelDimsPpTest, GroupsOfEveryAxisPartitionTheWorldAndMatchBruteForce) {
  for (const Five& m : AllFiveAxisMeshesUpTo(32)) {
    const ParallelDims dims = *ParallelDims::Create(m[0], m[1], m[2], m[3], m[4]);
    std::vector<Five> coords;
    for (int g = 0; g < dims.world_size(); ++g) {
      const MeshCoords c = dims.CoordsOf(g);
      coords.push_back({c.pp, c.dp_replicate, c.dp_shard, c.cp, c.tp});
    }
    for (MeshAxis axis : kAllMeshAxes) {
      SCOPED_TRACE(dims.ToString() + " axis " + MeshAxisName(axis));
      const std::array<bool, 5> spans = PpSpans(axis);
      int axis_size = 1;
      for (int d = 0; d < 5; ++d) axis_size *= spans[d] ? m[d] : 1;
      ASSERT_EQ(dims.AxisSize(axis), axis_size);
      std::map<Five, std::vector<int>> by_fixed;
      for (int g = 0; g < dims.world_size(); ++g) {
        Five fixed = coords[g];
        for (int d = 0; d < 5; ++d) fixed[d] = spans[d] ? -1 : fixed[d];
        by_fixed[fixed].push_back(g);
      }
      std::vector<std::vector<int>> expected;
      for (auto& [key, members] : by_fixed) expected.push_back(members);
      std::sort(expected.begin(), expected.end());
      const std::vector<std::vector<int>> groups = dims.Groups(axis);
      ASSERT_EQ(groups, expected);
      std::vector<int> seen(dims.world_size(), 0);
      for (const std::vector<int>& group : groups) {
        for (size_t i = 0; i < group.size(); ++i) {
          ++seen[group[i]];
          ASSERT_EQ(dims.GroupOf(group[i], axis), group);
          ASSERT_EQ(dims.IndexInGroup(group[i], axis), static_cast<int>(i));
          ASSERT_EQ(dims.GroupIndexOf(group[i], axis), static_cast<int>(&group - groups.data()));
        }
      }
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST(ParallelDimsPpTest, EveryInnerGroupLivesInsideOneStage) {
  const ParallelDims dims = *ParallelDims::Create(2, 1, 2, 1, 2);
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(dims.Groups(MeshAxis::kPp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dims.Groups(MeshAxis::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(dims.Groups(MeshAxis::kDpShard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dims.GroupOf(6, MeshAxis::kDpCp), (std::vector<int>{4, 6}));
  EXPECT_EQ(dims.ToString(), "pp=2 dp_replicate=1 dp_shard=2 cp=1 tp=2 (world size 8)");
  // The four-size Create is the pp = 1 mesh.
  EXPECT_EQ(*ParallelDims::Create(1, 2, 1, 2), *ParallelDims::Create(1, 1, 2, 1, 2));
  EXPECT_EQ(MeshAxisFromName("pp"), MeshAxis::kPp);
}

TEST(ParallelDimsPpTest, CreateNamesPpSizeBelowOne) {
  StatusOr<ParallelDims> dims = ParallelDims::Create(0, 1, 1, 1, 1);
  ASSERT_FALSE(dims.ok());
  EXPECT_EQ(dims.status().message(),
            "parallelism.pp_size: must be at least 1, got 0 (hint: set pp_size to 1 or more; 1 "
            "means no pipeline parallelism)");
  EXPECT_FALSE(ParallelDims::Create(2, 1, 1, 1, ParallelDims::kMaxWorldSize).ok());
}

}  // namespace
}  // namespace meshrun
