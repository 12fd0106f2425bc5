// The attempt rules of JobManager without it: restart backoff and outcome messages, how a
// rank's exit reads, the resume checkpoint decision, and the StopLedger's resend and bound.
#include "coordinator/restart_policy.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;

TEST(RestartPolicyTest, BackoffDoublesUpToItsMaximum) {
  RestartPolicy p(milliseconds(1000), milliseconds(5000));
  EXPECT_EQ(p.Backoff(1), milliseconds(1000));
  EXPECT_EQ(p.Backoff(2), milliseconds(2000));
  EXPECT_EQ(p.Backoff(3), milliseconds(4000));
  EXPECT_EQ(p.Backoff(4), milliseconds(5000));
  EXPECT_EQ(p.Backoff(1000), milliseconds(5000)) << "no overflow";
  EXPECT_EQ(RestartPolicy(milliseconds(0), milliseconds(5000)).Backoff(3), milliseconds(0));
  EXPECT_EQ(RestartPolicy(milliseconds(3000), milliseconds(1000)).Backoff(2), milliseconds(3000))
      << "a maximum below the base is the base";
}

TEST(RestartPolicyTest, AfterFailureRestartsUntilTheRestartsAreUsed) {
  RestartPolicy p(milliseconds(1500), milliseconds(60'000));
  RestartPolicy::Outcome first = p.AfterFailure(1, 2, "rank 0 exited with code 1");
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.wait, milliseconds(1500));
  EXPECT_EQ(first.message,
            "attempt 1 failed: rank 0 exited with code 1; restart 1 of 2 queued after a backoff "
            "of 1.5 s");
  RestartPolicy::Outcome last = p.AfterFailure(3, 2, "boom");
  EXPECT_FALSE(last.restart);
  EXPECT_EQ(last.message, "boom (all 2 restarts used)");
  EXPECT_EQ(p.AfterFailure(1, 0, "boom").message, "boom");
  EXPECT_EQ(RestartPolicy(milliseconds(0), milliseconds(0)).AfterFailure(1, 1, "x").message,
            "attempt 1 failed: x; restart 1 of 1 queued");
}

TEST(RestartPolicyTest, DescribeExit) {
  v1::RankExited e;
  e.set_rank(3);
  e.set_exit_code(1);
  e.set_error("out of memory");
  EXPECT_EQ(DescribeExit(e, "a"), "rank 3 on worker a exited with code 1: out of memory");
  e.set_error("");
  e.set_signal(9);
  EXPECT_EQ(DescribeExit(e, "a"), "rank 3 on worker a was killed by signal 9");
  e.set_signal(0);
  e.set_exit_code(-1);
  EXPECT_EQ(DescribeExit(e, "a"), "rank 3 on worker a could not be started");
  e.set_exit_code(0);
  e.set_stopped(true);
  EXPECT_EQ(DescribeExit(e, "a"), "rank 3 on worker a was stopped");
  e.set_error(std::string(2000, 'x'));
  EXPECT_EQ(DescribeExit(e, "a").size(),
            std::string("rank 3 on worker a was stopped: ").size() + 512);
}

TEST(StopLedgerTest, ResendsOnlyAfterTheIntervalUnlessForced) {
  StopLedger stops(milliseconds(1000), 8);
  const MonoTime t0{std::chrono::seconds(100)};
  EXPECT_TRUE(stops.ShouldSend("w", "job-1", 1, t0, false));
  EXPECT_TRUE(stops.Outstanding("w", "job-1", 1));
  EXPECT_FALSE(stops.ShouldSend("w", "job-1", 1, t0 + milliseconds(999), false));
  EXPECT_TRUE(stops.ShouldSend("w", "job-1", 1, t0 + milliseconds(999), true));
  EXPECT_TRUE(stops.ShouldSend("w", "job-1", 1, t0 + milliseconds(2000), false));
  EXPECT_EQ(stops.OutstandingFor("w"), 1u) << "one entry per (job, attempt)";
}

TEST(StopLedgerTest, BoundedPerWorkerAndExpired) {
  StopLedger stops(milliseconds(1000), 2);
  const MonoTime t0{std::chrono::seconds(100)};
  EXPECT_TRUE(stops.ShouldSend("w", "job-1", 1, t0, false));
  EXPECT_TRUE(stops.ShouldSend("w", "job-2", 1, t0 + milliseconds(5000), false));
  EXPECT_EQ(stops.OutstandingFor("w"), 2u);
  EXPECT_EQ(stops.OutstandingFor("v"), 0u);
  EXPECT_TRUE(stops.WouldExceed("w", 1));
  EXPECT_FALSE(stops.WouldExceed("w", 0));
  EXPECT_FALSE(stops.WouldExceed("v", 2));
  // Entries older than 10·resend are forgotten.
  stops.Expire(t0 + milliseconds(10'001));
  EXPECT_FALSE(stops.Outstanding("w", "job-1", 1));
  EXPECT_TRUE(stops.Outstanding("w", "job-2", 1));
  EXPECT_EQ(stops.OutstandingFor("w"), 1u);
  stops.Expire(t0 + milliseconds(60'000));
  EXPECT_EQ(stops.OutstandingFor("w"), 0u);
}

}  // namespace
}  // namespace meshrun::coordinator
