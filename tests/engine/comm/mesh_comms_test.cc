// MeshComms on the fake backend (one thread per rank): each axis gets the group
// ParallelDims::GroupOf names, in the right order, under its own store prefix, and an
// all-reduce over it sums exactly that group.
#include "engine/comm/mesh_comms.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "engine/comm/fake_backend.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;

struct MeshCase {
  int r, s, c, t;
};

class MeshCommsTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(MeshCommsTest, GroupsMatchParallelDims) {
  const MeshCase m = GetParam();
  auto dims_or = ParallelDims::Create(m.r, m.s, m.c, m.t);
  ASSERT_TRUE(dims_or.ok());
  const ParallelDims dims = *dims_or;
  const int world = dims.world_size();
  FakeBackend backend;
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::unique_ptr<MeshComms>> meshes(world);
  std::vector<std::shared_ptr<CommStats>> stats(world);
  std::vector<std::thread> threads;
  for (int g = 0; g < world; ++g) {
    threads.emplace_back([&, g] {
      stats[g] = std::make_shared<CommStats>();
      MeshCommsOptions options;
      options.timeout = milliseconds(5000);
      auto mesh = MeshComms::Create(dims, g, store, backend, stats[g], options);
      ASSERT_TRUE(mesh.ok()) << mesh.status().ToString();
      meshes[g] = std::move(mesh).value();
      // Every rank reduces its global rank over every axis: the sum must be that of the
      // members ParallelDims names, which proves the wiring, not just the bookkeeping.
      for (MeshAxis axis : kAllMeshAxes) {
        Communicator& comm = meshes[g]->Get(axis);
        float v = static_cast<float>(g);
        Status s = comm.AllReduce(&v, 1);
        ASSERT_TRUE(s.ok()) << s.ToString();
        float want = 0;
        for (int member : dims.GroupOf(g, axis)) want += static_cast<float>(member);
        EXPECT_EQ(v, want) << "rank " << g << " axis " << MeshAxisName(axis);
        // All-gather of global ranks gives the member list in group-rank order.
        std::vector<float> gathered(comm.size());
        float me = static_cast<float>(g);
        ASSERT_TRUE(comm.AllGather(&me, gathered.data(), 1).ok());
        std::vector<int> as_ranks(gathered.begin(), gathered.end());
        EXPECT_EQ(as_ranks, dims.GroupOf(g, axis)) << "rank " << g << " " << MeshAxisName(axis);
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  std::vector<std::string> expected_ids;
  for (int g = 0; g < world; ++g) {
    const MeshComms& mesh = *meshes[g];
    EXPECT_EQ(mesh.rank(), g);
    for (MeshAxis axis : kAllMeshAxes) {
      const Communicator& comm = mesh.Get(axis);
      const std::vector<int> group = dims.GroupOf(g, axis);
      EXPECT_EQ(mesh.Members(axis), group);
      EXPECT_EQ(comm.size(), static_cast<int>(group.size()));
      EXPECT_EQ(comm.rank(), dims.IndexInGroup(g, axis));
      EXPECT_EQ(comm.axis(), axis);
      EXPECT_STREQ(comm.name(), MeshAxisName(axis));
      const auto groups = dims.Groups(axis);
      const int index =
          static_cast<int>(std::find(groups.begin(), groups.end(), group) - groups.begin());
      EXPECT_EQ(mesh.GroupId(axis),
                std::string("comm/") + MeshAxisName(axis) + "/" + std::to_string(index));
      // Axes whose members equal an earlier axis's share its connections.
      bool repeats = false;
      for (MeshAxis earlier : kAllMeshAxes) {
        if (earlier == axis) break;
        if (dims.GroupOf(g, earlier) == group) repeats = true;
      }
      EXPECT_EQ(mesh.SharesConnection(axis), repeats && comm.size() > 1) << MeshAxisName(axis);
      if (comm.size() > 1 && !repeats) expected_ids.push_back(mesh.GroupId(axis));
    }
    // Size-1 axes count nothing; the others count one all_reduce and one all_gather each.
    for (MeshAxis axis : kAllMeshAxes) {
      const CommCounter c = stats[g]->AxisTotal(axis);
      EXPECT_EQ(c.calls, dims.AxisSize(axis) > 1 ? 2u : 0u) << MeshAxisName(axis);
    }
  }
  // Only groups with more than one member reached the backend.
  std::sort(expected_ids.begin(), expected_ids.end());
  expected_ids.erase(std::unique(expected_ids.begin(), expected_ids.end()), expected_ids.end());
  EXPECT_EQ(backend.GroupIds(), expected_ids);
}

INSTANTIATE_TEST_SUITE_P(Meshes, MeshCommsTest,
                         ::testing::Values(MeshCase{1, 2, 1, 2},   // FSDP × tp
                                           MeshCase{2, 1, 1, 2},   // replicas × tp
                                           MeshCase{2, 2, 1, 1},   // HSDP
                                           MeshCase{1, 1, 2, 2},   // cp × tp
                                           MeshCase{1, 2, 2, 1},   // FSDP × cp
                                           MeshCase{2, 2, 2, 1},   // 8 ranks
                                           MeshCase{1, 1, 1, 1}),  // one rank
                         [](const auto& info) {
                           const MeshCase& m = info.param;
                           char name[64];
                           std::snprintf(name, sizeof name, "r%ds%dc%dt%d", m.r, m.s, m.c, m.t);
                           return std::string(name);
                         });

TEST(MeshCommsErrorsTest, RankOutsideTheWorldIsInvalid) {
  auto dims = ParallelDims::Create(1, 2, 1, 1);
  ASSERT_TRUE(dims.ok());
  FakeBackend backend;
  auto mesh = MeshComms::Create(*dims, 2, std::make_shared<InMemoryStore>(), backend, nullptr);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidArgument);
}

TEST(MeshCommsErrorsTest, AMissingPeerFailsNamingTheGroup) {
  // Rank 0 of a 2-rank dp_shard mesh connects alone through a backend that waits for its
  // peer: it must fail in time, naming the axis and group.
  class WaitingBackend : public CommBackend {
   public:
    std::string name() const override { return "waiting"; }
    StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                    std::shared_ptr<Store> store) override {
      MESHRUN_RETURN_IF_ERROR(store->Set("rank_" + std::to_string(config.rank), "addr"));
      MESHRUN_RETURN_IF_ERROR(
          store->Wait({"rank_" + std::to_string(1 - config.rank)}, config.timeout));
      return InternalError("unreachable in this test");
    }
  };
  auto dims = ParallelDims::Create(1, 2, 1, 1);
  ASSERT_TRUE(dims.ok());
  WaitingBackend backend;
  auto store = std::make_shared<InMemoryStore>();
  MeshCommsOptions options;
  options.timeout = milliseconds(50);
  auto mesh = MeshComms::Create(*dims, 0, store, backend, nullptr, options);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(mesh.status().message().find("dp_shard group comm/dp_shard/0"), std::string::npos)
      << mesh.status().ToString();
  EXPECT_NE(mesh.status().message().find("comm/dp_shard/0/rank_1"), std::string::npos)
      << "the store key under the group prefix";
  EXPECT_TRUE(*store->Check({"comm/dp_shard/0/rank_0"}));
}

}  // namespace
}  // namespace meshrun
