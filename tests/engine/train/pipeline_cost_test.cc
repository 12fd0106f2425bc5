// The planner's pipeline terms (engine/train/pipeline_cost.h) on hand-computed cases: the
// micro-batches in flight per stage under each schedule, the bubble of each schedule, the
// point-to-point bytes, and the split of layers into stages by cost (docs/planning.md
// "Pipeline parallelism" derives each formula).
#include "engine/train/pipeline_cost.h"

#include <gtest/gtest.h>

#include <numeric>

namespace meshrun {
namespace {

PipelineShape Pipe(PpSchedule schedule, int stages, int micro_batches, int v = 1) {
  PipelineShape s;
  s.schedule = schedule;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.virtual_stages = v;
  return s;
}

TEST(PipelineCostTest, OneFOneBHoldsPMinusPMicroBatchesAtStageP) {
  // pp 4, 8 micro-batches: stage 0 runs 3 warm-up forwards and a 4th before its first backward.
  const PipelineShape s = Pipe(PpSchedule::k1F1B, 4, 8);
  EXPECT_EQ(PipelineActivationsInFlight(s, 0), 4);
  EXPECT_EQ(PipelineActivationsInFlight(s, 1), 3);
  EXPECT_EQ(PipelineActivationsInFlight(s, 2), 2);
  EXPECT_EQ(PipelineActivationsInFlight(s, 3), 1);
  // Fewer micro-batches than stages: a stage can hold no more than there are.
  EXPECT_EQ(PipelineActivationsInFlight(Pipe(PpSchedule::k1F1B, 4, 2), 0), 2);
  // No pipeline: one micro-batch at a time.
  EXPECT_EQ(PipelineActivationsInFlight(Pipe(PpSchedule::k1F1B, 1, 8), 0), 1);
  // Zero-bubble (ZB-H1) keeps 1F1B's count.
  EXPECT_EQ(PipelineActivationsInFlight(Pipe(PpSchedule::kZeroBubble, 4, 8), 0), 4);
  EXPECT_EQ(PipelineActivationsInFlight(Pipe(PpSchedule::kZeroBubble, 4, 8), 3), 1);
}

TEST(PipelineCostTest, InterleavedHoldsMoreChunksOfASmallerSize) {
  // pp 4, v 2, 8 micro-batches: stage 0 warms up (4−0−1)·2 + (2−1)·4 = 10 chunk forwards and
  // runs an 11th before its first backward; a chunk is half the stage: 5.5 micro-batches,
  // Megatron's P·(1 + (P−1)/(P·v)) = 4 + 3/2.
  const PipelineShape s = Pipe(PpSchedule::kInterleaved1F1B, 4, 8, 2);
  EXPECT_DOUBLE_EQ(PipelineActivationsInFlight(s, 0), 5.5);
  // The last stage: 0·2 + 4 + 1 = 5 chunks = 2.5 micro-batches.
  EXPECT_DOUBLE_EQ(PipelineActivationsInFlight(s, 3), 2.5);
  // At most all m·v chunks of the step: pp 4, v 2, 2 micro-batches hold 4 chunks = 2.
  EXPECT_DOUBLE_EQ(PipelineActivationsInFlight(Pipe(PpSchedule::kInterleaved1F1B, 4, 2, 2), 0), 2);
}

TEST(PipelineCostTest, BubbleOfEachSchedule) {
  MicroBatchTimes t;  // F = B = W = 1 s
  t.forward = t.backward_input = t.backward_weight = 1;
  // 1F1B, pp 4, 8 micro-batches: (P − 1)·3 s = 9 s idle; 9 / (24 + 9) = 3/11 = (P−1)/(m+P−1).
  const PipelineShape one = Pipe(PpSchedule::k1F1B, 4, 8);
  EXPECT_DOUBLE_EQ(PipelineBubbleSeconds(one, t), 9);
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(one, t), 3.0 / 11.0);
  // Interleaved, v 2: 9/2 s; 4.5 / 28.5 = 3/19 = (P−1)/(v·m + P − 1).
  const PipelineShape inter = Pipe(PpSchedule::kInterleaved1F1B, 4, 8, 2);
  EXPECT_DOUBLE_EQ(PipelineBubbleSeconds(inter, t), 4.5);
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(inter, t), 3.0 / 19.0);
  // ZB-H1: (P − 1)·(F + B − W) = 3 s; 3 / 27 = 1/9 = (P−1)/(3m + P − 1).
  const PipelineShape zb = Pipe(PpSchedule::kZeroBubble, 4, 8);
  EXPECT_DOUBLE_EQ(PipelineBubbleSeconds(zb, t), 3);
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(zb, t), 1.0 / 9.0);
  EXPECT_LT(PipelineBubbleFraction(zb, t), PipelineBubbleFraction(one, t));
  // Recomputation lengthens B: F 1, B 2, W 1 gives ZB-H1 (P−1)·2 = 6 s, 1F1B (P−1)·4 = 12 s.
  MicroBatchTimes r = t;
  r.backward_input = 2;
  EXPECT_DOUBLE_EQ(PipelineBubbleSeconds(zb, r), 6);
  EXPECT_DOUBLE_EQ(PipelineBubbleSeconds(one, r), 12);
  // No pipeline, no bubble.
  EXPECT_EQ(PipelineBubbleSeconds(Pipe(PpSchedule::k1F1B, 1, 8), t), 0);
  EXPECT_EQ(PipelineBubbleFraction(Pipe(PpSchedule::kZeroBubble, 1, 8), t), 0);
}

TEST(PipelineCostTest, PointToPointBytesPerMicroBatchAndStep) {
  // B 2 × T 1024 (cp 1) × d 4096 × 2 bytes = 16 MiB each way.
  const double msg = PipelineP2pBytesPerMicroBatch(2, 1024, 4096, 2);
  EXPECT_DOUBLE_EQ(msg, 16.0 * 1024 * 1024);
  // A stage sends one activation forward and one gradient backward per micro-batch: 8 × 2.
  EXPECT_DOUBLE_EQ(PipelineP2pBytesPerStep(Pipe(PpSchedule::k1F1B, 4, 8), msg), 16 * msg);
  EXPECT_DOUBLE_EQ(PipelineP2pCallsPerStep(Pipe(PpSchedule::kZeroBubble, 4, 8)), 16);
  // Interleaved crosses a stage boundary at each of its v chunks.
  EXPECT_DOUBLE_EQ(PipelineP2pBytesPerStep(Pipe(PpSchedule::kInterleaved1F1B, 4, 8, 2), msg),
                   32 * msg);
  EXPECT_EQ(PipelineP2pBytesPerStep(Pipe(PpSchedule::k1F1B, 1, 8), msg), 0);
}

TEST(PipelineCostTest, LayersSplitByCostWithTheHeadOnTheLastStage) {
  // 8 layers of cost 1 over 4 stages: 2 each.
  EXPECT_EQ(BalancedLayerSplit(8, 4, 1, 0, 0), (std::vector<int>{2, 2, 2, 2}));
  // A head worth 2 layers: the last stage takes fewer layers, the largest stage costs 3
  // (3, 3, 3, 1 + 2), against 4 for the split by count (2, 2, 2, 2 + 2).
  const std::vector<int> split = BalancedLayerSplit(10, 4, 1, 0, 2);
  EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), 10);
  EXPECT_EQ(split.back(), 1);
  const std::vector<double> cost = StageCosts(split, 4, 1, 0, 2);
  EXPECT_DOUBLE_EQ(*std::max_element(cost.begin(), cost.end()), 3);
  // Uneven: 7 layers over 4 stages, every stage at least one, the largest 2.
  const std::vector<int> uneven = BalancedLayerSplit(7, 4, 1, 0, 0);
  EXPECT_EQ(std::accumulate(uneven.begin(), uneven.end(), 0), 7);
  EXPECT_EQ(*std::max_element(uneven.begin(), uneven.end()), 2);
  EXPECT_EQ(*std::min_element(uneven.begin(), uneven.end()), 1);
  // Interleaved: 8 chunks over 4 stages, stage p holds chunks p and p + 4.
  const std::vector<int> chunks = BalancedLayerSplit(16, 8, 1, 0, 0);
  EXPECT_EQ(StageCosts(chunks, 4, 1, 0, 0), (std::vector<double>{4, 4, 4, 4}));
  // A head larger than a layer never leaves a chunk empty.
  const std::vector<int> big_head = BalancedLayerSplit(4, 4, 1, 0, 10);
  EXPECT_EQ(big_head, (std::vector<int>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace meshrun
