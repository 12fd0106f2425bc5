// The pipeline's bubble in the step report (decision 0060): the measured bubble and, beside it,
// the schedule's theory travel StepMetrics -> RankStep -> the step line of `meshrun train -o
// json` and -> SampleOfStep (what the worker forwards to the coordinator); a rank without
// pipeline parallelism carries neither.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/train/trainer.h"
#include "rank/rank_reports.h"
#include "worker/rank_protocol.h"

namespace meshrun {
namespace {

TEST(StepLineBubble, MeasuredAndTheoryTravelTogether) {
  StepMetrics m;
  m.step = 3;
  m.step_seconds = 0.5;
  m.pipeline_bubble_ratio = 0.25;
  m.pipeline_bubble_theory = 3.0 / 11;  // 1F1B, 4 stages, 8 micro-batches
  const v1::RankStep step = rank::StepReport(m);
  ASSERT_TRUE(step.has_pipeline_bubble_theory());
  EXPECT_DOUBLE_EQ(step.pipeline_bubble_theory(), 3.0 / 11);
  const nlohmann::json line = nlohmann::json::parse(rank::StepLineJson(step));
  EXPECT_DOUBLE_EQ(line.at("pipeline_bubble_ratio").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(line.at("pipeline_bubble_theory").get<double>(), 3.0 / 11);
  const v1::MetricsSample s = SampleOfStep(step, "job-pp", 1, 2);
  ASSERT_TRUE(s.has_pipeline_bubble_ratio());
  ASSERT_TRUE(s.has_pipeline_bubble_theory());
  EXPECT_DOUBLE_EQ(s.pipeline_bubble_ratio(), 0.25);
  EXPECT_DOUBLE_EQ(s.pipeline_bubble_theory(), 3.0 / 11);
}

TEST(StepLineBubble, NoPipelineNoBubbleFields) {
  StepMetrics m;
  m.step = 1;
  m.step_seconds = 0.5;
  const v1::RankStep step = rank::StepReport(m);
  EXPECT_FALSE(step.has_pipeline_bubble_ratio());
  EXPECT_FALSE(step.has_pipeline_bubble_theory());
  const nlohmann::json line = nlohmann::json::parse(rank::StepLineJson(step));
  EXPECT_FALSE(line.contains("pipeline_bubble_theory"));
  EXPECT_FALSE(SampleOfStep(step, "j", 1, 0).has_pipeline_bubble_theory());
}

TEST(StepLineBubble, ATheoryOutsideZeroToOneIsNotForwarded) {
  v1::RankStep step;
  step.set_step(1);
  step.set_pipeline_bubble_theory(1.5);  // a rank's bug, not a theory
  EXPECT_FALSE(SampleOfStep(step, "j", 1, 0).has_pipeline_bubble_theory());
}

}  // namespace
}  // namespace meshrun
