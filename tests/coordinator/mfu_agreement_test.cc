// The job-level MFU the coordinator derives (StepAggregator: `meshrun status`,
// meshrun_job_mfu_ratio, `submit --follow` and `meshrun demo`) is ModelFlopsUtilization of the
// job's own reported tokens/s, the figure `meshrun train` prints for the same step times: one
// definition in every path (docs/metrics.md "MFU").
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/mfu.h"
#include "coordinator/step_aggregator.h"

namespace meshrun::coordinator {
namespace {

constexpr int64_t kMfuTokensPerStep = 8 * 64;  // global_batch_size × seq_len
constexpr double kMfuFlopsPerToken = 6.0e6;    // GPT2FlopsPerToken of some tiny model

// A rank's sample as the trainer fills it: tokens/s and MFU of the job by its own step time.
v1::MetricsSample MfuRankSample(int rank, int64_t step, double seconds, double peak, int ranks) {
  v1::MetricsSample s;
  s.set_job_id("job-mfu");
  s.set_attempt(1);
  s.set_rank(rank);
  s.set_step(step);
  s.set_step_seconds(seconds);
  s.set_tokens_per_second(kMfuTokensPerStep / seconds);
  s.set_tflops(s.tokens_per_second() * kMfuFlopsPerToken / 1e12);
  s.set_mfu(ModelFlopsUtilization(s.tokens_per_second(), kMfuFlopsPerToken, peak, ranks));
  return s;
}

void ExpectMfuRelNear(double got, double want) {
  EXPECT_NEAR(got, want, 1e-9 * std::abs(want)) << "got " << got << ", want " << want;
}

TEST(MfuAgreement, JobSampleIsTheMfuOfItsTokensPerSecond) {
  // Two ranks of equal peak, one slower: the job runs at the slowest rank's rate, and its MFU
  // must be that rate's, not the mean of the ranks' own rates (1.0 s and 1.6 s read 25% apart).
  const double peak = 2.0e9;
  StepAggregator agg(2, kMfuTokensPerStep);
  ASSERT_FALSE(agg.Add(MfuRankSample(0, 1, 1.0, peak, 2)).has_value());
  std::optional<v1::MetricsSample> job = agg.Add(MfuRankSample(1, 1, 1.6, peak, 2));
  ASSERT_TRUE(job.has_value());
  ExpectMfuRelNear(job->tokens_per_second(), kMfuTokensPerStep / 1.6);
  ExpectMfuRelNear(job->mfu(),
                   ModelFlopsUtilization(job->tokens_per_second(), kMfuFlopsPerToken, peak, 2));
  // The same step through `meshrun train` (one process's view of the slowest time).
  ExpectMfuRelNear(job->mfu(), MfuRankSample(1, 1, 1.6, peak, 2).mfu());
}

TEST(MfuAgreement, UnequalPeaksSumToTheJobsPeak) {
  // Ranks of 1 and 3 threads (peak linear in threads): the job's peak is their sum.
  const double per_thread = 1.0e9;
  const std::vector<double> peaks = {1 * per_thread, 3 * per_thread};
  StepAggregator agg(2, kMfuTokensPerStep);
  agg.Add(MfuRankSample(0, 1, 0.5, peaks[0], 2));
  std::optional<v1::MetricsSample> job = agg.Add(MfuRankSample(1, 1, 0.8, peaks[1], 2));
  ASSERT_TRUE(job.has_value());
  ExpectMfuRelNear(job->mfu(),
                   job->tokens_per_second() * kMfuFlopsPerToken / (peaks[0] + peaks[1]));
}

TEST(MfuAgreement, StepsWeightedByTimeMatchTheRunsRate) {
  // `submit --follow` and `demo` weight the job samples' MFU by step time; the trainer's
  // summary takes the MFU of all tokens over all time. Same figures, same result.
  const double peak = 4.0e9;
  StepAggregator agg(2, kMfuTokensPerStep);
  const std::vector<std::vector<double>> times = {{0.9, 1.1}, {2.0, 1.0}, {0.7, 0.7}};
  double seconds = 0, tokens = 0, mfu_seconds = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    agg.Add(MfuRankSample(0, step, times[i][0], peak, 2));
    std::optional<v1::MetricsSample> job = agg.Add(MfuRankSample(1, step, times[i][1], peak, 2));
    ASSERT_TRUE(job.has_value());
    seconds += job->step_seconds();
    tokens += job->tokens_per_second() * job->step_seconds();
    mfu_seconds += job->mfu() * job->step_seconds();
  }
  ExpectMfuRelNear(mfu_seconds / seconds,
                   ModelFlopsUtilization(tokens / seconds, kMfuFlopsPerToken, peak, 2));
}

TEST(MfuAgreement, ARankWithoutAPeakReadsZero) {
  StepAggregator agg(2, kMfuTokensPerStep);
  agg.Add(MfuRankSample(0, 1, 1.0, 1.0e9, 2));
  std::optional<v1::MetricsSample> job = agg.Add(MfuRankSample(1, 1, 1.0, 0, 2));
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->mfu(), 0);
}

}  // namespace
}  // namespace meshrun::coordinator
