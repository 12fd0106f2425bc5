// RateLimiter with a fake clock: the burst, the refill rate, separate callers, the wait it
// reports, "no limit", and the bounded table of callers. CallerOfPeer's parsing.
#include "coordinator/rate_limiter.h"

#include <gtest/gtest.h>

#include "tests/fakes/fake_clock.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeClock;

TEST(RateLimiterTest, AllowsTheBurstThenTheRate) {
  FakeClock clock;
  RateLimiter limiter(clock, RateLimit{10, 20});
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(limiter.TryAcquire("a").has_value()) << i;
  // The 21st call at the same instant waits one refill period (100 ms at 10/s).
  std::optional<milliseconds> wait = limiter.TryAcquire("a");
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(*wait, milliseconds(100));
  clock.Advance(milliseconds(50));
  wait = limiter.TryAcquire("a");
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(*wait, milliseconds(50));
  clock.Advance(milliseconds(50));
  EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_TRUE(limiter.TryAcquire("a").has_value());
  // One second refills 10 tokens, not more.
  clock.Advance(milliseconds(1000));
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(limiter.TryAcquire("a").has_value()) << i;
  EXPECT_TRUE(limiter.TryAcquire("a").has_value());
}

TEST(RateLimiterTest, RefillStopsAtTheBurst) {
  FakeClock clock;
  RateLimiter limiter(clock, RateLimit{1, 3});
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  clock.Advance(milliseconds(3'600'000));  // an hour idle
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_TRUE(limiter.TryAcquire("a").has_value());
}

TEST(RateLimiterTest, CallersHaveTheirOwnBuckets) {
  FakeClock clock;
  RateLimiter limiter(clock, RateLimit{1, 2});
  EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_TRUE(limiter.TryAcquire("a").has_value());
  EXPECT_FALSE(limiter.TryAcquire("b").has_value());
  EXPECT_FALSE(limiter.TryAcquire("b").has_value());
  EXPECT_TRUE(limiter.TryAcquire("b").has_value());
}

TEST(RateLimiterTest, ZeroRateMeansNoLimit) {
  FakeClock clock;
  RateLimiter limiter(clock, RateLimit{0, 1});
  for (int i = 0; i < 10'000; ++i) ASSERT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_EQ(limiter.caller_count(), 0u);
}

TEST(RateLimiterTest, TheTableOfCallersIsBounded) {
  FakeClock clock;
  RateLimiter limiter(clock, RateLimit{1, 2, /*max_callers=*/4});
  // Four busy callers (empty buckets), then many new ones: the table never passes 4.
  for (const char* c : {"a", "b", "c", "d"}) {
    limiter.TryAcquire(c);
    limiter.TryAcquire(c);
  }
  EXPECT_EQ(limiter.caller_count(), 4u);
  for (int i = 0; i < 100; ++i) {
    clock.Advance(milliseconds(1));
    EXPECT_FALSE(limiter.TryAcquire("new-" + std::to_string(i)).has_value());
    EXPECT_LE(limiter.caller_count(), 4u);
  }
  // Idle (full) buckets go first: after a quiet spell a busy caller's bucket is full again and
  // a forgotten caller starts with a full bucket, so forgetting costs it nothing.
  clock.Advance(milliseconds(10'000));
  EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_TRUE(limiter.TryAcquire("a").has_value());
}

TEST(RateLimiterTest, CallerOfPeerDropsThePort) {
  EXPECT_EQ(CallerOfPeer("ipv4:10.0.0.5:41234"), "ipv4:10.0.0.5");
  EXPECT_EQ(CallerOfPeer("ipv6:[::1]:5000"), "ipv6:[::1]");
  EXPECT_EQ(CallerOfPeer("ipv6:%5B::1%5D:5000"), "ipv6:%5B::1%5D:5000");
  EXPECT_EQ(CallerOfPeer("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(CallerOfPeer("ipv4:10.0.0.5"), "ipv4:10.0.0.5");
  EXPECT_EQ(CallerOfPeer(""), "");
}

}  // namespace
}  // namespace meshrun::coordinator
