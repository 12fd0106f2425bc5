// Metrics ingestion without JobManager: a rank's sample feeds its Prometheus series at once and
// the job row's progress columns once every rank reported the step.
#include "coordinator/metrics_ingest.h"

#include <gtest/gtest.h>

#include "tests/coordinator/test_util.h"

namespace meshrun::coordinator {
namespace {

v1::MetricsSample Sample(int rank, int64_t step, double seconds) {
  v1::MetricsSample s;
  s.set_job_id("job-1");
  s.set_attempt(1);
  s.set_rank(rank);
  s.set_step(step);
  s.set_loss(4.0);
  s.set_step_seconds(seconds);
  s.set_mfu(rank == 0 ? 0.4 : 0.2);  // the job's MFU by each rank's own step time
  return s;
}

TEST(MetricsIngestTest, RankSeriesAtOnceJobRowWhenTheStepIsComplete) {
  auto series = std::make_shared<RankSeries>();
  MetricsIngest ingest(series);
  const v1::JobSpec spec = testing::SpecProto(1, 2, 1, 1);  // global batch 16 × seq_len 64
  std::unique_ptr<StepAggregator> steps = MetricsIngest::NewAggregator(spec, 2);
  JobRow row;
  JobTotals totals;
  RankLabels where{"a", {0, 0, 0, 0}, "cpu", 0};
  EXPECT_FALSE(ingest.Ingest(where, Sample(0, 1, 0.5), spec, *steps, row, totals));
  EXPECT_EQ(row.step, 0) << "a step counts once every rank reported it";
  ASSERT_EQ(series->Snapshot().size(), 1u);
  EXPECT_EQ(series->Snapshot()[0].ranks.size(), 1u) << "the rank's series is fed at once";

  where.coords.dp_shard = 1;
  where.local_rank = 1;
  std::optional<v1::MetricsSample> job =
      ingest.Ingest(where, Sample(1, 1, 1.0), spec, *steps, row, totals);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->step(), 1);
  EXPECT_EQ(row.step, 1);
  EXPECT_DOUBLE_EQ(row.loss, 4.0);
  EXPECT_DOUBLE_EQ(row.tokens_per_second, 16 * 64 / 1.0);
  EXPECT_DOUBLE_EQ(row.mfu, 0.2) << "the MFU of the job's tokens/s (slowest rank), not the mean";
  EXPECT_DOUBLE_EQ(totals.tokens_total, 16 * 64);
  EXPECT_DOUBLE_EQ(totals.step_time_skew, 1.0 / 0.75);

  ingest.JobFinished("job-1");
  EXPECT_TRUE(series->Snapshot()[0].finished);
}

TEST(MetricsIngestTest, WithoutSeriesOnlyTheJobRow) {
  MetricsIngest ingest(nullptr);
  const v1::JobSpec spec = testing::SpecProto(1, 1, 1, 1);
  std::unique_ptr<StepAggregator> steps = MetricsIngest::NewAggregator(spec, 1);
  JobRow row;
  JobTotals totals;
  ASSERT_TRUE(ingest.Ingest({"a", {}, "cpu", 0}, Sample(0, 1, 0.5), spec, *steps, row, totals));
  ASSERT_TRUE(ingest.Ingest({"a", {}, "cpu", 0}, Sample(0, 2, 0.5), spec, *steps, row, totals));
  EXPECT_EQ(row.step, 2);
  EXPECT_DOUBLE_EQ(totals.tokens_total, 2.0 * 8 * 64) << "every job-level step counts";
  ingest.JobFinished("job-1");  // no series: nothing to do
}

}  // namespace
}  // namespace meshrun::coordinator
