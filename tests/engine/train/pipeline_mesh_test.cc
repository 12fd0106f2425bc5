// Pipeline parallelism (issue 33, decision 0054) in one process: the ranks are threads over the
// fake backend. GPT-2 (tied embeddings) and Llama train one rank's losses and global grad norms
// at every step (within 1e-5 relative) under pp 2, pp 4 with 6 layers (not divisible by 4) and
// pp 2 × dp_shard 2 × tp 2; a pp 2 checkpoint resumes under pp 4 and under one rank with the
// uninterrupted losses. Also: the stage split by cost and the 1F1B schedule as data.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/train/pipeline.h"
#include "tests/engine/train/pipeline_mesh_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

TEST(PipelineScheduleTest, OneFOneBIsWarmupThenAlternationThenCooldown) {
  EXPECT_EQ(ScheduleText(OneFOneBSchedule(4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(ScheduleText(OneFOneBSchedule(4, 2, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(ScheduleText(OneFOneBSchedule(4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(ScheduleText(OneFOneBSchedule(2, 0, 2)), "F0 F1 B0 B1");
  // Every micro-batch runs forward once and backward once, its forward first; at most P − p
  // micro-batches are in flight on stage p.
  for (int P = 1; P <= 5; ++P) {
    for (int M = P; M <= 9; ++M) {
      for (int p = 0; p < P; ++p) {
        const std::vector<PipeOp> ops = OneFOneBSchedule(P, p, M);
        ASSERT_EQ(ops.size(), static_cast<size_t>(2 * M));
        std::vector<int> state(M, 0);
        int in_flight = 0, most = 0;
        for (const PipeOp& op : ops) {
          if (op.kind == PipeOpKind::kForward) {
            ASSERT_EQ(state[op.micro]++, 0);
            most = std::max(most, ++in_flight);
          } else {
            ASSERT_EQ(state[op.micro]++, 1);
            --in_flight;
          }
        }
        EXPECT_LE(most, P - p);
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavedGoesRoundTheChunksInGroupsOfPMicroBatches) {
  // Megatron's order, stage 0 of 2 with 2 chunks and 4 micro-batches: warm-up of
  // (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards.
  EXPECT_EQ(ScheduleText(InterleavedSchedule(2, 0, 4, 2)),
            "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(ScheduleText(InterleavedSchedule(2, 1, 4, 2)),
            "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  // The last stage's forwards of the pipeline's last chunk run inside its backwards.
  EXPECT_EQ(ScheduleText(PipelineOps(PpSchedule::kInterleaved1F1B, 2, 1, 4, 2)),
            "F0 F1 B0.1 B1.1 F2 B0 F3 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(ScheduleText(PipelineOps(PpSchedule::k1F1B, 2, 1, 2, 1)), "B0 B1");
}

TEST(PipelineScheduleTest, EveryScheduleHasATimetableThatRunsEachOperationOnce) {
  for (const auto& [schedule, v] :
       std::vector<std::pair<PpSchedule, int>>{{PpSchedule::k1F1B, 1},
                                               {PpSchedule::kInterleaved1F1B, 2},
                                               {PpSchedule::kInterleaved1F1B, 3}}) {
    for (int P = 2; P <= 4; ++P) {
      for (int M = P; M <= 3 * P; M += (v > 1 ? P : 1)) {
        SCOPED_TRACE("v " + std::to_string(v) + " P " + std::to_string(P) + " M " +
                     std::to_string(M));
        std::vector<std::vector<PipeOp>> ops(P);
        for (int p = 0; p < P; ++p) ops[p] = PipelineOps(schedule, P, p, M, v);
        StatusOr<PipeTimetable> table = BuildTimetable(ops, P, v, M);
        ASSERT_TRUE(table.ok()) << table.status().ToString();
        std::vector<size_t> seen(P, 0);
        for (const std::vector<int>& slot : table->slots) {
          for (int p = 0; p < P; ++p) {
            if (slot[p] < 0) continue;
            ASSERT_EQ(slot[p], static_cast<int>(seen[p]));  // in list order, each once
            ++seen[p];
          }
        }
        for (int p = 0; p < P; ++p) EXPECT_EQ(seen[p], ops[p].size());
      }
    }
  }
  // 1F1B on 4 stages and 8 micro-batches: 2·(M + P − 1) = 22 slots when the last stage's
  // forwards take slots of their own; run inside its backwards, 20, of which stage 0 waits 4
  // (the fill before its first backward can start, and the drain after its last forward).
  std::vector<std::vector<PipeOp>> ops(4);
  for (int p = 0; p < 4; ++p) ops[p] = PipelineOps(PpSchedule::k1F1B, 4, p, 8, 1);
  const PipeTimetable table = BuildTimetable(ops, 4, 1, 8).value();
  int idle = 0;
  for (const std::vector<int>& slot : table.slots) idle += slot[0] < 0 ? 1 : 0;
  EXPECT_EQ(table.slots.size(), 20u);
  EXPECT_EQ(idle, 4);
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::k1F1B, 4, 8, 1), 3.0 / 11);
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kInterleaved1F1B, 4, 8, 2), 3.0 / 19);
}

TEST(PipelineSplitTest, LayersSplitByCostCountingEmbeddingAndHead) {
  JobSpec spec;
  spec.model.n_layer = 6;
  spec.model.d_model = 32;
  spec.model.seq_len = 32;
  spec.model.vocab_size = 4096;  // a large table: the end stages hold fewer layers
  spec.parallelism.pp_size = 4;
  const GPT2Config cfg = GPT2ConfigOf(spec.model);
  const PipelineCosts c = PipelineCostsOf(cfg, spec.model.seq_len);
  EXPECT_GT(c.embedding, c.layer);
  EXPECT_GT(c.head, c.layer);
  // The table and the head each cost about nine layers here: the end stages hold one layer.
  EXPECT_EQ(PipelineLayers(spec), (std::vector<int>{1, 3, 1, 1}));
  // A small vocabulary still weighs: 1, 2, 2, 1 where counting layers would give 2, 2, 1, 1.
  spec.model.vocab_size = 64;
  EXPECT_EQ(PipelineLayers(spec), (std::vector<int>{1, 2, 2, 1}));
  spec.parallelism.pp_size = 2;
  EXPECT_EQ(PipelineLayers(spec), (std::vector<int>{3, 3}));
  // The spec's list wins.
  spec.parallelism.pp_layers = {5, 1};
  EXPECT_EQ(PipelineLayers(spec), (std::vector<int>{5, 1}));
  // Every split is a partition of the layers into non-empty chunks.
  for (int L = 1; L <= 9; ++L) {
    GPT2Config g = cfg;
    g.n_layer = L;
    for (int k = 1; k <= L; ++k) {
      const std::vector<int> layers = SplitLayersByCost(g, 32, k);
      ASSERT_EQ(layers.size(), static_cast<size_t>(k));
      int sum = 0;
      for (int n : layers) {
        EXPECT_GE(n, 1);
        sum += n;
      }
      EXPECT_EQ(sum, L);
    }
  }
}

class PipelineMeshTest : public PipelineMeshRunner {};

TEST_F(PipelineMeshTest, Gpt2TwoStagesTrainsLikeOneRank) {
  ExpectTrainsLike(Run(Spec("gpt2", 4, {.P = 2})), OneRank("gpt2", 4));
}

TEST_F(PipelineMeshTest, LlamaTwoStagesTrainsLikeOneRank) {
  ExpectTrainsLike(Run(Spec("llama", 4, {.P = 2})), OneRank("llama", 4));
}

TEST_F(PipelineMeshTest, Gpt2FourStagesOfSixLayersTrainsLikeOneRank) {
  ExpectTrainsLike(Run(Spec("gpt2", 6, {.P = 4})), OneRank("gpt2", 6));
}

TEST_F(PipelineMeshTest, LlamaFourStagesOfSixLayersTrainsLikeOneRank) {
  ExpectTrainsLike(Run(Spec("llama", 6, {.P = 4})), OneRank("llama", 6));
}

TEST_F(PipelineMeshTest, LlamaTiedFourStagesWithGivenLayersTrainsLikeOneRank) {
  JobSpec spec = Spec("llama", 6, {.P = 4});
  spec.model.tie_embeddings = true;
  spec.parallelism.pp_layers = {1, 1, 1, 3};
  JobSpec one = Spec("llama", 6, {});
  one.model.tie_embeddings = true;
  std::vector<StatusOr<PipeStepRecord>> alone = Run(one);
  ASSERT_TRUE(alone[0].ok()) << alone[0].status().ToString();
  ExpectTrainsLike(Run(spec), *alone[0]);
}

TEST_F(PipelineMeshTest, Gpt2TwoStagesTimesFsdpTimesTpTrainsLikeOneRank) {
  ExpectTrainsLike(Run(Spec("gpt2", 4, {.P = 2, .S = 2, .T = 2})), OneRank("gpt2", 4));
}

TEST_F(PipelineMeshTest, LlamaTwoStagesTimesFsdpTimesTpTrainsLikeOneRank) {
  ExpectTrainsLike(Run(Spec("llama", 4, {.P = 2, .S = 2, .T = 2})), OneRank("llama", 4));
}

TEST_F(PipelineMeshTest, Gpt2TwoStagesTimesReplicasTimesCpTrainsLikeOneRank) {
  JobSpec spec = Spec("gpt2", 4, {.P = 2, .R = 2, .C = 2});
  spec.parallelism.cp_comm_strategy = "ring";
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 4));
}

TEST_F(PipelineMeshTest, Gpt2InterleavedTwoStagesOfTwoChunksTrainsLikeOneRank) {
  JobSpec spec = Spec("gpt2", 4, {.P = 2});
  spec.parallelism.pp_schedule = "interleaved_1f1b";
  spec.parallelism.pp_virtual_stages = 2;
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 4));
}

TEST_F(PipelineMeshTest, LlamaInterleavedFourStagesOfTwoChunksTrainsLikeOneRank) {
  JobSpec spec = Spec("llama", 8, {.P = 4});
  spec.parallelism.pp_schedule = "interleaved_1f1b";
  spec.parallelism.pp_virtual_stages = 2;
  ExpectTrainsLike(Run(spec), OneRank("llama", 8));
}

TEST_F(PipelineMeshTest, Gpt2InterleavedTimesReplicasTimesCpTrainsLikeOneRank) {
  JobSpec spec = Spec("gpt2", 4, {.P = 2, .R = 2, .C = 2});
  spec.parallelism.pp_schedule = "interleaved_1f1b";
  spec.parallelism.pp_virtual_stages = 2;
  spec.parallelism.cp_comm_strategy = "ring";
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 4));
}

TEST_F(PipelineMeshTest, Gpt2InterleavedTimesFsdpTimesTpTrainsLikeOneRank) {
  JobSpec spec = Spec("gpt2", 4, {.P = 2, .S = 2, .T = 2});
  spec.parallelism.pp_schedule = "interleaved_1f1b";
  spec.parallelism.pp_virtual_stages = 2;
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 4));
}

TEST_F(PipelineMeshTest, APipelineCheckpointResumesUnderFourStagesAndOneRank) {
  const PipeStepRecord& uninterrupted = OneRank("gpt2", 4);
  for (const PipeMesh resume : {PipeMesh{.P = 4}, PipeMesh{}}) {
    SCOPED_TRACE("resumed under pp " + std::to_string(resume.P));
    const fs::path ckpt = *dir_ / ("ckpt-pp" + std::to_string(resume.P));
    JobSpec saved = Spec("gpt2", 4, {.P = 2});
    saved.checkpoint.dir = ckpt.string();
    std::vector<StatusOr<PipeStepRecord>> first = Run(saved, /*stop_after=*/5);
    // Its first 5 steps, and the evaluation after step 5, are the uninterrupted run's.
    PipeStepRecord first_five;
    first_five.losses.assign(uninterrupted.losses.begin(), uninterrupted.losses.begin() + 5);
    first_five.grad_norms.assign(uninterrupted.grad_norms.begin(),
                                 uninterrupted.grad_norms.begin() + 5);
    first_five.evals.assign(uninterrupted.evals.begin(), uninterrupted.evals.begin() + 1);
    ExpectTrainsLike(first, first_five);
    JobSpec resumed = Spec("gpt2", 4, resume);
    resumed.checkpoint.dir = ckpt.string();
    ExpectTrainsLike(Run(resumed), uninterrupted, /*first_step=*/5);
  }
}

}  // namespace
}  // namespace meshrun
