// Placement, exhaustively: every small mesh against every layout of up to four workers' free
// slots. Checks the all-or-nothing contract, the slot budget, that a tp group never spans
// workers, local ranks, and the preference order (whole job, then whole replicas, then whole
// cp groups) wherever it is achievable.
#include "coordinator/placement.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace meshrun::coordinator {
namespace {

ParallelDims Mesh(int r, int s, int c, int t) {
  return *ParallelDims::Create(r, s, c, t);
}

std::vector<PlacementWorker> Workers(const std::vector<int>& free) {
  std::vector<PlacementWorker> out;
  for (size_t i = 0; i < free.size(); ++i) {
    std::string id = "w";
    id += std::to_string(i);
    out.push_back({id, std::max(8, free[i]), free[i]});
  }
  return out;
}

// Whether every unit of `size` consecutive ranks sits on one worker.
bool UnitsWhole(const Placement& p, int size) {
  for (size_t begin = 0; begin < p.ranks.size(); begin += size) {
    for (size_t r = begin; r < begin + size; ++r) {
      if (p.ranks[r].worker != p.ranks[begin].worker) return false;
    }
  }
  return true;
}

void CheckOne(const ParallelDims& mesh, const std::vector<int>& free) {
  SCOPED_TRACE(mesh.ToString() + " free=" + ::testing::PrintToString(free));
  const int T = mesh.tp(), W = mesh.world_size(), groups = W / T;
  std::vector<int> cap;
  int total = 0, largest = 0;
  for (int f : free) {
    cap.push_back(f / T);
    total += f / T;
    largest = std::max(largest, f);
  }
  StatusOr<Placement> p = PlaceJob(mesh, Workers(free));
  if (total < groups) {
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
    return;
  }
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(static_cast<int>(p->ranks.size()), W);

  // Budget, local ranks in global-rank order, local world sizes.
  std::map<int, int> count;
  for (int r = 0; r < W; ++r) {
    const RankPlacement& rp = p->ranks[r];
    ASSERT_GE(rp.worker, 0);
    ASSERT_LT(rp.worker, static_cast<int>(free.size()));
    EXPECT_EQ(rp.local_rank, count[rp.worker]++);
  }
  int used = 0;
  for (size_t w = 0; w < free.size(); ++w) {
    EXPECT_LE(count[w], free[w]);
    EXPECT_EQ(p->local_world_size[w], count[w]);
    used += count[w] > 0;
  }
  EXPECT_EQ(p->workers_used, used);

  // A tp group never spans workers.
  EXPECT_TRUE(UnitsWhole(*p, T));

  // Preferences, where achievable.
  if (largest >= W) {
    EXPECT_EQ(p->workers_used, 1) << "the whole job fits on one worker";
  }
  const int replica = mesh.dp_shard() * mesh.cp();  // in tp groups
  int whole_replicas = 0;
  for (int c : cap) whole_replicas += c / replica;
  if (whole_replicas >= mesh.dp_replicate()) {
    EXPECT_TRUE(UnitsWhole(*p, replica * T)) << "every replica fits whole somewhere";
  }
  bool caps_multiple_of_cp = true, caps_multiple_of_replica = true;
  for (int c : cap) {
    caps_multiple_of_cp &= c % mesh.cp() == 0;
    caps_multiple_of_replica &= c % replica == 0;
  }
  if (caps_multiple_of_cp) {
    EXPECT_TRUE(UnitsWhole(*p, mesh.cp() * T));
  }
  if (caps_multiple_of_replica) {
    EXPECT_TRUE(UnitsWhole(*p, replica * T));
  }

  // Deterministic.
  StatusOr<Placement> again = PlaceJob(mesh, Workers(free));
  ASSERT_TRUE(again.ok());
  for (int r = 0; r < W; ++r) EXPECT_EQ(again->ranks[r].worker, p->ranks[r].worker);
}

TEST(PlacementTest, ExhaustiveSmallMeshesAndLayouts) {
  const std::vector<int> sizes = {1, 2, 3, 4};
  const std::vector<int> slot_choices = {0, 1, 2, 3, 4, 6, 8};
  std::vector<std::vector<int>> layouts;
  for (int n = 1; n <= 4; ++n) {
    std::vector<int> idx(n, 0);
    while (true) {
      std::vector<int> layout;
      for (int i : idx) layout.push_back(slot_choices[i]);
      layouts.push_back(layout);
      int k = 0;
      while (k < n && ++idx[k] == static_cast<int>(slot_choices.size())) idx[k++] = 0;
      if (k == n) break;
    }
  }
  int meshes = 0;
  for (int r : sizes) {
    for (int s : sizes) {
      for (int c : sizes) {
        for (int t : sizes) {
          if (r * s * c * t > 24) continue;
          ++meshes;
          for (const auto& layout : layouts) {
            CheckOne(Mesh(r, s, c, t), layout);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_GT(meshes, 100);
  EXPECT_EQ(layouts.size(), 7u + 49u + 343u + 2401u);
}

TEST(PlacementTest, ArchitectureExampleKeepsTpGroupsInsideWorkers) {
  // dp_shard 2 × tp 2 on two workers with two slots each (docs/architecture.md).
  StatusOr<Placement> p = PlaceJob(Mesh(1, 2, 1, 2), Workers({2, 2}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ranks[0].worker, p->ranks[1].worker);
  EXPECT_EQ(p->ranks[2].worker, p->ranks[3].worker);
  EXPECT_NE(p->ranks[0].worker, p->ranks[2].worker);
  EXPECT_EQ(p->ranks[2].local_rank, 0);
  EXPECT_EQ(p->ranks[3].local_rank, 1);
}

TEST(PlacementTest, HsdpPutsDpReplicateAcrossWorkers) {
  // R=2 replicas of dp_shard 4 on two 4-slot workers: each replica's shards stay together.
  StatusOr<Placement> p = PlaceJob(Mesh(2, 4, 1, 1), Workers({4, 4}));
  ASSERT_TRUE(p.ok());
  for (int r = 1; r < 4; ++r) EXPECT_EQ(p->ranks[r].worker, p->ranks[0].worker);
  for (int r = 5; r < 8; ++r) EXPECT_EQ(p->ranks[r].worker, p->ranks[4].worker);
  EXPECT_NE(p->ranks[0].worker, p->ranks[4].worker);
}

TEST(PlacementTest, BestFitLeavesLargeHolesForLargeJobs) {
  // A 2-rank job on workers with 8 and 2 free takes the 2-slot worker.
  StatusOr<Placement> p = PlaceJob(Mesh(1, 2, 1, 1), Workers({8, 2}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ranks[0].worker, 1);
  EXPECT_EQ(p->ranks[1].worker, 1);
}

TEST(PlacementTest, FreeSlotsOutsideWholeTpGroupsDoNotCount) {
  // 4 ranks in tp groups of 2 need two groups; 3 + 1 free slots hold only one.
  StatusOr<Placement> p = PlaceJob(Mesh(1, 2, 1, 2), Workers({3, 1}));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("whole tp groups of 2"), std::string::npos);
}

TEST(PlacementTest, EightThousandRanksOnAThousandWorkers) {
  std::vector<int> free(1024, 8);
  StatusOr<Placement> p = PlaceJob(Mesh(64, 16, 1, 8), Workers(free));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->workers_used, 1024);
  EXPECT_TRUE(UnitsWhole(*p, 8));
}

TEST(PlacementTest, CheckPlaceable) {
  EXPECT_EQ(CheckPlaceable(Mesh(1, 1, 1, 8), {4, 4}).verdict, Placeability::kTpGroupTooLarge);
  const PlaceabilityVerdict tp = CheckPlaceable(Mesh(1, 1, 1, 8), {4, 4});
  EXPECT_EQ(tp.message.rfind("parallelism.tp_size: ", 0), 0u) << tp.message;
  EXPECT_NE(tp.message.find("(hint: "), std::string::npos);
  EXPECT_EQ(CheckPlaceable(Mesh(1, 4, 1, 2), {4}).verdict, Placeability::kTooFewSlots);
  EXPECT_EQ(CheckPlaceable(Mesh(1, 2, 1, 2), {3, 3}).verdict, Placeability::kPlaceable);
  // Three slots each hold one tp group of 2: four groups need four such workers.
  EXPECT_EQ(CheckPlaceable(Mesh(1, 4, 1, 2), {3, 3, 3}).verdict, Placeability::kTooFewSlots);
  EXPECT_EQ(CheckPlaceable(Mesh(1, 1, 1, 1), {}).verdict, Placeability::kTooFewSlots);
}

}  // namespace
}  // namespace meshrun::coordinator
