// The planner's enumeration, its fit decisions, its link model and its order, on specs whose
// answers can be worked out by hand.
#include "engine/train/planner.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "common/job_spec.h"

namespace meshrun {
namespace {

JobSpec Tiny() {
  JobSpec s;  // the defaults: 2 layers, 4 heads, d_model 64, seq 64, batch 8, micro batch 2
  s.data.train = "/dev/null";
  return s;
}

ClusterShape Cluster(int nodes, int per_node, double memory_bytes = 1e12) {
  ClusterShape c;
  c.nodes = nodes;
  c.per_node = per_node;
  c.device = {"test", memory_bytes, 1e12, 100e9, 10e9, 0.5};
  return c;
}

TEST(PlannerTest, EnumeratesEveryValidConfigurationOnce) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 4));
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  std::set<std::tuple<int, int, int, int, std::string, std::string, bool>> seen;
  for (const PlanRow& r : *rows) {
    const ParallelismSpec& p = r.spec.parallelism;
    EXPECT_EQ(p.dp_replicate_size * p.dp_shard_size * p.cp_size * p.tp_size, 4);
    EXPECT_TRUE(ValidateJobSpec(r.spec, 4).ok()) << ValidateJobSpec(r.spec, 4).message();
    EXPECT_TRUE(
        seen.insert({p.dp_replicate_size, p.dp_shard_size, p.cp_size, p.tp_size, p.cp_comm_strategy,
                     r.spec.train.activation_checkpointing, p.fsdp_reshard_after_forward})
            .second)
        << "listed twice";
    if (p.cp_size == 1) EXPECT_EQ(p.cp_comm_strategy, "allgather");
    if (p.dp_shard_size * p.cp_size == 1) EXPECT_TRUE(p.fsdp_reshard_after_forward);
    EXPECT_EQ(r.memory.peak_bytes, PredictRankMemory(r.spec).peak_bytes);
  }
  // Count by hand: every (R, S, C, T) of 4 whose dp ranks split batch 8 into micro-batches of
  // 2 (tiny's heads and sequence allow every tp and cp of 4); those with cp > 1 come in two
  // strategies, those with FSDP in two residencies, each in three checkpointing modes.
  size_t want = 0;
  for (int t : {1, 2, 4}) {
    for (int c : {1, 2, 4}) {
      for (int s : {1, 2, 4}) {
        if (4 % (t * c * s) != 0) continue;
        const int r = 4 / (t * c * s);
        // batch 8 over R·S dp ranks in micro-batches of 2
        if (8 % (r * s * 2) != 0) continue;
        want += 3 * (c > 1 ? 2 : 1) * (s * c > 1 ? 2 : 1);
      }
    }
  }
  EXPECT_EQ(rows->size(), want);
}

TEST(PlannerTest, FitsFollowsTheMemoryModelAndSaysWhyNot) {
  // Room for the sharded configurations only: below one rank's full state.
  const JobSpec spec = Tiny();
  const double full = static_cast<double>(PredictRankMemory(spec).peak_bytes);
  StatusOr<std::vector<PlanRow>> rows = Plan(spec, Cluster(1, 4, full * 0.8 / 0.9));
  ASSERT_TRUE(rows.ok());
  bool some_fit = false, some_not = false, order_ok = true, seen_misfit = false;
  for (const PlanRow& r : *rows) {
    EXPECT_EQ(r.fits, r.memory.peak_bytes <= full * 0.8 + 1) << r.reason;
    if (r.fits) {
      EXPECT_TRUE(r.reason.empty());
      some_fit = true;
      if (seen_misfit) order_ok = false;
    } else {
      EXPECT_NE(r.reason.find("GiB per rank"), std::string::npos) << r.reason;
      some_not = true;
      seen_misfit = true;
    }
  }
  EXPECT_TRUE(some_fit);
  EXPECT_TRUE(some_not);
  EXPECT_TRUE(order_ok) << "every fitting row comes before every other";
}

TEST(PlannerTest, FittingRowsAreOrderedByPredictedThroughput) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(2, 2));
  ASSERT_TRUE(rows.ok());
  for (size_t i = 1; i < rows->size(); ++i) {
    if ((*rows)[i].fits && (*rows)[i - 1].fits) {
      EXPECT_GE((*rows)[i - 1].tokens_per_second, (*rows)[i].tokens_per_second);
    }
    EXPECT_GT((*rows)[i].step_seconds, 0);
  }
}

TEST(PlannerTest, AGroupInsideANodeUsesTheFastLink) {
  // tp 2 on 1 node × 2: inside a node. The same mesh on 2 nodes × 1 sends the same tp bytes
  // across nodes: intra/inter = 10× longer.
  auto tp_seconds = [](int nodes, int per_node) {
    StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(nodes, per_node));
    EXPECT_TRUE(rows.ok());
    for (const PlanRow& r : *rows) {
      const ParallelismSpec& p = r.spec.parallelism;
      if (p.tp_size == 2 &&
          p.dp_replicate_size * p.dp_shard_size * p.cp_size == nodes * per_node / 2 &&
          p.dp_shard_size == 1 && p.cp_size == 1 &&
          r.spec.train.activation_checkpointing == "none") {
        return r.comm_seconds.at("tp");
      }
    }
    return -1.0;
  };
  const double inside = tp_seconds(1, 2), across = tp_seconds(2, 1);
  ASSERT_GT(inside, 0);
  EXPECT_NEAR(across / inside, 10.0, 1e-9);
}

TEST(PlannerTest, RecomputationCostsTimeAndSavesActivations) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 1));
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 3u);  // one mesh, three modes
  std::map<std::string, const PlanRow*> by_mode;
  for (const PlanRow& r : *rows) by_mode[r.spec.train.activation_checkpointing] = &r;
  EXPECT_LT(by_mode["full"]->memory.of(MemoryKind::kActivations),
            by_mode["none"]->memory.of(MemoryKind::kActivations));
  EXPECT_GT(by_mode["full"]->compute_seconds, by_mode["selective"]->compute_seconds);
  EXPECT_GT(by_mode["selective"]->compute_seconds, by_mode["none"]->compute_seconds);
  EXPECT_EQ(rows->front().spec.train.activation_checkpointing, "none");
}

TEST(PlannerTest, UnknownDevicesAndEmptyClustersAreErrors) {
  EXPECT_EQ(DeviceProfileNamed("tpu").status().code(), StatusCode::kNotFound);
  EXPECT_NE(DeviceProfileNamed("tpu").status().message().find("h100"), std::string::npos);
  EXPECT_TRUE(DeviceProfileNamed("h100").ok());
  EXPECT_EQ(Plan(Tiny(), Cluster(0, 4)).status().code(), StatusCode::kInvalidArgument);
}

TEST(PlannerTest, ExplainsTheBestAndWhenNothingFits) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 2));
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(ExplainBest(*rows, Cluster(1, 2)).rfind("Best: dp_replicate", 0), 0u);
  StatusOr<std::vector<PlanRow>> none = Plan(Tiny(), Cluster(1, 2, 1000));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(ExplainBest(*none, Cluster(1, 2, 1000)).rfind("No configuration fits", 0), 0u);
}

}  // namespace
}  // namespace meshrun
