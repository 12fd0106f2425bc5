// The planner's calibration made repeatable (`meshrun plan --calibrate`, docs/planning.md): each
// figure is the median of several measurements and the prediction's spread is their median
// absolute deviation, so one measurement the scheduler preempted (a busy host) moves neither.
#include <gtest/gtest.h>

#include <vector>

#include "client/plan_support.h"
#include "engine/calibration/calibration.h"

namespace meshrun {
namespace {

TEST(CalibrationSpreadTest, MedianAndSpreadIgnoreOneOutlier) {
  // Four quiet measurements and one 10x slower (preempted) one.
  const RobustFigure f = Robust({0.41, 0.42, 0.40, 0.43, 4.1});
  EXPECT_DOUBLE_EQ(f.median, 0.42);
  EXPECT_NEAR(f.spread, 0.01 / 0.42, 1e-12);  // deviations .01 .00 .02 .01 3.68: median .01
  // The mean (what one bad sample drags) would be 1.15; the statistic stays within 3% of quiet.
  const RobustFigure quiet = Robust({0.41, 0.42, 0.40, 0.43});
  EXPECT_NEAR(f.median, quiet.median, 0.03 * quiet.median);
  // Even sizes take the middle two; no samples: zeros.
  EXPECT_DOUBLE_EQ(Robust({1, 2, 3, 10}).median, 2.5);
  EXPECT_DOUBLE_EQ(Robust({}).median, 0);
  EXPECT_DOUBLE_EQ(Robust({}).spread, 0);
  EXPECT_DOUBLE_EQ(Robust({5, 5, 5}).spread, 0);
}

TEST(CalibrationSpreadTest, PredictionSpreadIsTheMedianOverTheMeasurements) {
  JobSpec spec;
  spec.data.train = "unused";
  auto cluster = [](double gemm_flops) {
    ClusterShape c;
    c.device = CalibratedCpuProfile(gemm_flops, 64e9, 1, 0, 0);
    return c;
  };
  // One GEMM measurement 20x low (the host was busy for its 60 ms).
  const std::vector<ClusterShape> rounds = {cluster(1e11), cluster(1.02e11), cluster(0.98e11),
                                            cluster(5e9), cluster(1.01e11)};
  const RobustFigure f = client::PredictionSpread(spec, rounds);
  const double quiet = PredictConfiguration(spec, cluster(1.01e11)).step_seconds;
  EXPECT_GT(quiet, 0);
  EXPECT_NEAR(f.median, quiet, 0.01 * quiet);
  EXPECT_LT(f.spread, 0.03);
}

}  // namespace
}  // namespace meshrun
