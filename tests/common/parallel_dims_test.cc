// ParallelDims against an independent brute force, for every mesh of world size <= 64: ranks
// are enumerated by nested loops (not the formula) and groups by comparing coordinates.
#include "common/parallel_dims.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

namespace meshrun {
namespace {

struct Sizes {
  int r, s, c, t;
};

std::vector<Sizes> AllMeshesUpTo(int max_world) {
  std::vector<Sizes> meshes;
  for (int r = 1; r <= max_world; ++r)
    for (int s = 1; r * s <= max_world; ++s)
      for (int c = 1; r * s * c <= max_world; ++c)
        for (int t = 1; r * s * c * t <= max_world; ++t) meshes.push_back({r, s, c, t});
  return meshes;
}

// The test's own table of which dims (r, s, c, t) each axis spans.
std::array<bool, 4> Spans(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kDpReplicate: return {true, false, false, false};
    case MeshAxis::kDpShard: return {false, true, false, false};
    case MeshAxis::kCp: return {false, false, true, false};
    case MeshAxis::kTp: return {false, false, false, true};
    case MeshAxis::kDp: return {true, true, false, false};
    case MeshAxis::kDpShardCp: return {false, true, true, false};
    case MeshAxis::kDpCp: return {true, true, true, false};
  }
  return {};
}

ParallelDims MustCreate(const Sizes& m) {
  StatusOr<ParallelDims> dims = ParallelDims::Create(m.r, m.s, m.c, m.t);
  EXPECT_TRUE(dims.ok()) << dims.status().ToString();
  return *dims;
}

// Coordinates of every rank, by counting through the mesh with tp fastest.
std::vector<std::array<int, 4>> EnumerateCoords(const Sizes& m) {
  std::vector<std::array<int, 4>> coords;
  for (int r = 0; r < m.r; ++r)
    for (int s = 0; s < m.s; ++s)
      for (int c = 0; c < m.c; ++c)
        for (int t = 0; t < m.t; ++t) coords.push_back({r, s, c, t});
  return coords;
}

TEST(ParallelDimsTest, MeshCountCoversEveryFactorization) {
  // Sum over n <= 64 of the number of ordered 4-factorizations of n.
  int expected = 0;
  for (int n = 1; n <= 64; ++n) {
    for (int r = 1; r <= n; ++r)
      for (int s = 1; s <= n; ++s)
        for (int c = 1; c <= n; ++c)
          if (n % (r * s * c) == 0) ++expected;
  }
  EXPECT_EQ(AllMeshesUpTo(64).size(), static_cast<size_t>(expected));
}

TEST(ParallelDimsTest, RankAndCoordsMatchEnumerationForEveryMeshUpTo64) {
  for (const Sizes& m : AllMeshesUpTo(64)) {
    const ParallelDims dims = MustCreate(m);
    SCOPED_TRACE(dims.ToString());
    ASSERT_EQ(dims.world_size(), m.r * m.s * m.c * m.t);
    EXPECT_EQ(dims.dp_replicate(), m.r);
    EXPECT_EQ(dims.dp_shard(), m.s);
    EXPECT_EQ(dims.cp(), m.c);
    EXPECT_EQ(dims.tp(), m.t);
    const auto coords = EnumerateCoords(m);
    for (int g = 0; g < dims.world_size(); ++g) {
      const auto& [r, s, c, t] = coords[g];
      const MeshCoords expected{r, s, c, t};
      ASSERT_EQ(dims.CoordsOf(g), expected) << "rank " << g;
      ASSERT_EQ(dims.RankOf(expected), g);
      ASSERT_EQ(dims.RankOf(expected), ((r * m.s + s) * m.c + c) * m.t + t);
    }
  }
}

TEST(ParallelDimsTest, GroupsMatchBruteForceForEveryMeshUpTo64) {
  for (const Sizes& m : AllMeshesUpTo(64)) {
    const ParallelDims dims = MustCreate(m);
    const auto coords = EnumerateCoords(m);
    const std::array<int, 4> sizes = {m.r, m.s, m.c, m.t};
    for (MeshAxis axis : kAllMeshAxes) {
      SCOPED_TRACE(dims.ToString() + " axis " + MeshAxisName(axis));
      const auto spans = Spans(axis);
      int axis_size = 1;
      for (int d = 0; d < 4; ++d) axis_size *= spans[d] ? sizes[d] : 1;
      ASSERT_EQ(dims.AxisSize(axis), axis_size);

      // Brute force: ranks agreeing on every dim the axis does not span share a group.
      std::map<std::array<int, 4>, std::vector<int>> by_fixed;
      for (int g = 0; g < dims.world_size(); ++g) {
        std::array<int, 4> fixed = coords[g];
        for (int d = 0; d < 4; ++d) fixed[d] = spans[d] ? -1 : fixed[d];
        by_fixed[fixed].push_back(g);  // ascending, since g ascends
      }
      std::vector<std::vector<int>> expected;
      for (auto& [key, members] : by_fixed) expected.push_back(members);
      std::sort(expected.begin(), expected.end());  // by smallest rank

      const std::vector<std::vector<int>> groups = dims.Groups(axis);
      ASSERT_EQ(groups, expected);
      ASSERT_EQ(static_cast<int>(groups.size()) * axis_size, dims.world_size());

      std::vector<int> seen(dims.world_size(), 0);
      for (const auto& group : groups) {
        ASSERT_EQ(static_cast<int>(group.size()), axis_size);
        ASSERT_TRUE(std::is_sorted(group.begin(), group.end()));
        for (size_t i = 0; i < group.size(); ++i) {
          const int g = group[i];
          ++seen[g];
          ASSERT_EQ(dims.GroupOf(g, axis), group);
          ASSERT_EQ(dims.IndexInGroup(g, axis), static_cast<int>(i));
          ASSERT_EQ(dims.GroupIndexOf(g, axis), static_cast<int>(&group - groups.data()));
          for (int d = 0; d < 4; ++d) {
            if (!spans[d]) {
              ASSERT_EQ(coords[g][d], coords[group[0]][d]);
            }
          }
        }
      }
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST(ParallelDimsTest, FlattenedIndicesAreRowMajor) {
  for (const Sizes& m : AllMeshesUpTo(64)) {
    const ParallelDims dims = MustCreate(m);
    for (int g = 0; g < dims.world_size(); ++g) {
      const MeshCoords c = dims.CoordsOf(g);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kDp), c.dp_replicate * m.s + c.dp_shard);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kDpShardCp), c.dp_shard * m.c + c.cp);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kDpCp),
                (c.dp_replicate * m.s + c.dp_shard) * m.c + c.cp);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kTp), c.tp);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kCp), c.cp);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kDpShard), c.dp_shard);
      ASSERT_EQ(dims.IndexInGroup(g, MeshAxis::kDpReplicate), c.dp_replicate);
    }
  }
}

TEST(ParallelDimsTest, HandWorkedHsdpExample) {
  // R=2, S=2, C=1, T=2: ranks (r, s, t) = 0:(0,0,0) 1:(0,0,1) 2:(0,1,0) 3:(0,1,1) 4:(1,0,0) ...
  const ParallelDims dims = MustCreate({2, 2, 1, 2});
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(dims.Groups(MeshAxis::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(dims.Groups(MeshAxis::kDpShard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dims.Groups(MeshAxis::kDpReplicate), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dims.Groups(MeshAxis::kCp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(dims.Groups(MeshAxis::kDp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(dims.GroupOf(5, MeshAxis::kDpCp), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(dims.IndexInGroup(6, MeshAxis::kDp), 3);
  EXPECT_EQ(dims.ToString(), "dp_replicate=2 dp_shard=2 cp=1 tp=2 (world size 8)");
}

TEST(ParallelDimsTest, CreateNamesTheFieldOfASizeBelowOne) {
  const char* fields[] = {"dp_replicate_size", "dp_shard_size", "cp_size", "tp_size"};
  for (int bad : {0, -1, -100}) {
    for (int d = 0; d < 4; ++d) {
      std::array<int, 4> sizes = {2, 2, 2, 2};
      sizes[d] = bad;
      StatusOr<ParallelDims> dims = ParallelDims::Create(sizes[0], sizes[1], sizes[2], sizes[3]);
      ASSERT_FALSE(dims.ok());
      EXPECT_EQ(dims.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(dims.status().message().rfind(std::string("parallelism.") + fields[d] + ": ", 0),
                0u)
          << dims.status().message();
      EXPECT_NE(dims.status().message().find("got " + std::to_string(bad)), std::string::npos);
      EXPECT_NE(dims.status().message().find("(hint: "), std::string::npos);
    }
  }
}

TEST(ParallelDimsTest, CreateRejectsWorldsTooLargeForInt) {
  StatusOr<ParallelDims> dims = ParallelDims::Create(65536, 65536, 65536, 65536);
  ASSERT_FALSE(dims.ok());
  EXPECT_EQ(dims.status().message().rfind("parallelism: ", 0), 0u);
  EXPECT_TRUE(ParallelDims::Create(1, 1, 1, ParallelDims::kMaxWorldSize).ok());
  EXPECT_FALSE(ParallelDims::Create(2, 1, 1, ParallelDims::kMaxWorldSize).ok());
}

TEST(ParallelDimsTest, AxisNamesRoundTrip) {
  std::set<std::string> names;
  for (MeshAxis axis : kAllMeshAxes) {
    names.insert(MeshAxisName(axis));
    EXPECT_EQ(MeshAxisFromName(MeshAxisName(axis)), axis);
  }
  EXPECT_EQ(names, (std::set<std::string>{"pp", "dp_replicate", "dp_shard", "cp", "tp", "dp",
                                          "dp_shard_cp", "dp_cp"}));
  EXPECT_EQ(MeshAxisFromName("ep"), std::nullopt);
}

}  // namespace
}  // namespace meshrun
