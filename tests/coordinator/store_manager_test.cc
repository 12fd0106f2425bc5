// StoreManager: set/get/add within one attempt's key space, waits woken by set and add, timed
// out by the clock and aborted when the attempt closes, and isolation between attempts.
#include "coordinator/store_manager.h"

#include <gtest/gtest.h>

#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;

struct Result {
  bool called = false;
  StatusOr<std::optional<std::string>> value = std::optional<std::string>();
};

StoreManager::GetCallback Capture(Result* r) {
  return [r](StatusOr<std::optional<std::string>> v) {
    r->called = true;
    r->value = std::move(v);
  };
}

class StoreManagerTest : public ::testing::Test {
 protected:
  testing::FakeClock clock_;
  StoreManager store_{clock_, StoreLimits{}};
};

TEST_F(StoreManagerTest, SetGetAdd) {
  store_.OpenAttempt("j", 1);
  ASSERT_TRUE(store_.Set("j", 1, "k", "v").ok());
  Result r;
  store_.Get("j", 1, "k", false, milliseconds(0), std::nullopt, Capture(&r));
  ASSERT_TRUE(r.called && r.value.ok());
  EXPECT_EQ(**r.value, "v");
  Result missing;
  store_.Get("j", 1, "nope", false, milliseconds(0), std::nullopt, Capture(&missing));
  ASSERT_TRUE(missing.called && missing.value.ok());
  EXPECT_FALSE(missing.value->has_value());

  EXPECT_EQ(*store_.Add("j", 1, "c", 5), 5);
  EXPECT_EQ(*store_.Add("j", 1, "c", -2), 3);
  EXPECT_EQ(*store_.Add("j", 1, "c", 0), 3);
  Result counter;
  store_.Get("j", 1, "c", false, milliseconds(0), std::nullopt, Capture(&counter));
  EXPECT_EQ(**counter.value, "3");  // decimal ASCII, as in c10d
  StatusOr<int64_t> bad = store_.Add("j", 1, "k", 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_.Add("j", 1, "big", INT64_MAX).ok());
  EXPECT_EQ(store_.Add("j", 1, "big", 1).status().code(), StatusCode::kOutOfRange);
}

TEST_F(StoreManagerTest, WaitIsWokenBySetAndAdd) {
  store_.OpenAttempt("j", 1);
  Result a, b;
  store_.Get("j", 1, "k", true, milliseconds(0), std::nullopt, Capture(&a));
  store_.Get("j", 1, "n", true, milliseconds(0), std::nullopt, Capture(&b));
  EXPECT_FALSE(a.called);
  EXPECT_EQ(store_.waiter_count(), 2u);
  ASSERT_TRUE(store_.Set("j", 1, "k", "hello").ok());
  ASSERT_TRUE(a.called && a.value.ok());
  EXPECT_EQ(**a.value, "hello");
  EXPECT_FALSE(b.called);
  ASSERT_TRUE(store_.Add("j", 1, "n", 1).ok());
  ASSERT_TRUE(b.called && b.value.ok());
  EXPECT_EQ(**b.value, "1");
  EXPECT_EQ(store_.waiter_count(), 0u);
}

TEST_F(StoreManagerTest, WaitTimesOutWithDeadlineExceeded) {
  store_.OpenAttempt("j", 1);
  Result r, by_call_deadline;
  store_.Get("j", 1, "k", true, milliseconds(500), std::nullopt, Capture(&r));
  store_.Get("j", 1, "k2", true, milliseconds(0), clock_.Monotonic() + milliseconds(200),
             Capture(&by_call_deadline));
  clock_.Advance(milliseconds(199));
  store_.ExpireWaiters();
  EXPECT_FALSE(r.called);
  EXPECT_FALSE(by_call_deadline.called);
  clock_.Advance(milliseconds(1));
  store_.ExpireWaiters();
  ASSERT_TRUE(by_call_deadline.called);
  EXPECT_EQ(by_call_deadline.value.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(r.called);
  clock_.Advance(milliseconds(300));
  store_.ExpireWaiters();
  ASSERT_TRUE(r.called);
  EXPECT_EQ(r.value.status().code(), StatusCode::kDeadlineExceeded);
}

TEST_F(StoreManagerTest, DefaultWaitIsBounded) {
  StoreLimits limits;
  limits.default_wait = milliseconds(1000);
  StoreManager store(clock_, limits);
  store.OpenAttempt("j", 1);
  Result r;
  store.Get("j", 1, "k", true, milliseconds(0), std::nullopt, Capture(&r));
  clock_.Advance(milliseconds(1000));
  store.ExpireWaiters();
  ASSERT_TRUE(r.called);
  EXPECT_EQ(r.value.status().code(), StatusCode::kDeadlineExceeded);
}

TEST_F(StoreManagerTest, AttemptsAreIsolatedAndStaleOnesAborted) {
  store_.OpenAttempt("j", 1);
  ASSERT_TRUE(store_.Set("j", 1, "k", "old").ok());
  Result waiting;
  store_.Get("j", 1, "other", true, milliseconds(0), std::nullopt, Capture(&waiting));
  store_.CloseAttempt("j", 1);
  ASSERT_TRUE(waiting.called);
  EXPECT_EQ(waiting.value.status().code(), StatusCode::kAborted);
  store_.OpenAttempt("j", 2);
  Result fresh;
  store_.Get("j", 2, "k", false, milliseconds(0), std::nullopt, Capture(&fresh));
  EXPECT_FALSE(fresh.value->has_value()) << "a new attempt starts with fresh keys";
  EXPECT_EQ(store_.Set("j", 1, "k", "x").code(), StatusCode::kAborted);
  EXPECT_EQ(store_.Add("j", 1, "c", 1).status().code(), StatusCode::kAborted);
  Result stale;
  store_.Get("j", 1, "k", true, milliseconds(0), std::nullopt, Capture(&stale));
  EXPECT_EQ(stale.value.status().code(), StatusCode::kAborted);
}

TEST_F(StoreManagerTest, Limits) {
  StoreLimits limits;
  limits.max_value_bytes = 4;
  limits.max_keys_per_attempt = 2;
  limits.max_waiters = 1;
  StoreManager store(clock_, limits);
  store.OpenAttempt("j", 1);
  EXPECT_EQ(store.Set("j", 1, "k", "12345").code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Set("j", 1, "a", "1").ok());
  ASSERT_TRUE(store.Set("j", 1, "b", "1").ok());
  ASSERT_TRUE(store.Set("j", 1, "a", "2").ok()) << "replacing a key is not a new key";
  EXPECT_EQ(store.Set("j", 1, "c", "1").code(), StatusCode::kResourceExhausted);
  Result w1, w2;
  store.Get("j", 1, "x", true, milliseconds(0), std::nullopt, Capture(&w1));
  store.Get("j", 1, "y", true, milliseconds(0), std::nullopt, Capture(&w2));
  EXPECT_FALSE(w1.called);
  ASSERT_TRUE(w2.called);
  EXPECT_EQ(w2.value.status().code(), StatusCode::kResourceExhausted);
}

TEST_F(StoreManagerTest, ShutdownEndsWaits) {
  store_.OpenAttempt("j", 1);
  Result r;
  store_.Get("j", 1, "k", true, milliseconds(0), std::nullopt, Capture(&r));
  store_.Shutdown();
  ASSERT_TRUE(r.called);
  EXPECT_EQ(r.value.status().code(), StatusCode::kUnavailable);
}

TEST_F(StoreManagerTest, AllAttemptsTogetherAreBoundedByMaxStoreBytes) {
  // Each attempt under its own limit, but together over --max-store-bytes.
  StoreLimits limits;
  limits.max_value_bytes = 1000;
  limits.max_bytes_per_attempt = 4000;
  limits.max_bytes = 5000;
  StoreManager store(clock_, limits);
  store.OpenAttempt("j1", 1);
  store.OpenAttempt("j2", 1);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(store.Set("j1", 1, "k" + std::to_string(i), std::string(999, 'x')).ok());
    ASSERT_TRUE(store.Set("j2", 1, "k" + std::to_string(i), std::string(999, 'x')).ok());
  }
  EXPECT_EQ(store.total_bytes(), 4004u);
  Status over = store.Set("j2", 1, "k2", std::string(999, 'x'));
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("of the coordinator's --max-store-bytes "), std::string::npos)
      << over.message();
  // Replacing a value by a smaller one is always allowed; closing an attempt frees its bytes.
  EXPECT_TRUE(store.Set("j2", 1, "k1", "small").ok());
  store.CloseAttempt("j1", 1);
  EXPECT_EQ(store.total_bytes(), 999u + 2 + 2 + 5);
  EXPECT_TRUE(store.Set("j2", 1, "k2", std::string(999, 'x')).ok());
  // Reopening an attempt drops what it held.
  store.OpenAttempt("j2", 1);
  EXPECT_EQ(store.total_bytes(), 0u);
}

// With a state database the keys survive a coordinator restart (a new StoreManager over the same
// database): a barrier a running attempt was in completes instead of timing out. Opening an
// attempt anew and closing it drop what was kept.
TEST(StoreManagerPersistenceTest, KeysOfARunningAttemptSurviveARestart) {
  testing::TempDir dir;
  testing::FakeClock clock;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    StoreManager store(clock, StoreLimits{}, db->get());
    store.OpenAttempt("j", 1);
    store.OpenAttempt("j", 2);
    ASSERT_TRUE(store.Set("j", 1, "checkpoint/10/written/0", "1").ok());
    ASSERT_TRUE(store
                    .Set("j", 1, "gloo/addr",
                         std::string("\0\x01"
                                     "binary",
                                     8))
                    .ok());
    ASSERT_TRUE(store.Add("j", 1, "counter", 3).ok());
    ASSERT_TRUE(store.Set("j", 2, "other", "x").ok());
    store.CloseAttempt("j", 2);
  }  // the coordinator goes away
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  StoreManager store(clock, StoreLimits{}, db->get());
  ASSERT_TRUE(store.RestoreAttempt("j", 1).ok());
  ASSERT_TRUE(store.RestoreAttempt("j", 2).ok());
  auto get = [&](int attempt, const std::string& key) {
    Result r;
    store.Get("j", attempt, key, false, milliseconds(0), std::nullopt, Capture(&r));
    EXPECT_TRUE(r.called && r.value.ok());
    return r.value.ok() && r.value->has_value() ? **r.value : std::string("<unset>");
  };
  EXPECT_EQ(get(1, "checkpoint/10/written/0"), "1");
  EXPECT_EQ(get(1, "gloo/addr"), std::string("\0\x01"
                                             "binary",
                                             8));
  EXPECT_EQ(*store.Add("j", 1, "counter", 1), 4);
  EXPECT_EQ(get(2, "other"), "<unset>");  // closed before the restart: dropped
  EXPECT_EQ(store.total_bytes(), std::string("checkpoint/10/written/0").size() + 1 +
                                     std::string("gloo/addr").size() + 8 +
                                     std::string("counter").size() + 1);
  // A new placement of the attempt starts empty, also after the next restart.
  store.OpenAttempt("j", 1);
  EXPECT_EQ(get(1, "checkpoint/10/written/0"), "<unset>");
  StoreManager again(clock, StoreLimits{}, db->get());
  ASSERT_TRUE(again.RestoreAttempt("j", 1).ok());
  EXPECT_EQ(again.total_bytes(), 0u);
}

// A retried addition (the same request id: its first reply was lost) is answered with the first
// result and adds nothing, also after a coordinator restart; other ids and id-less calls add.
TEST(StoreManagerPersistenceTest, ARetriedAdditionAddsOnce) {
  testing::TempDir dir;
  testing::FakeClock clock;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    StoreManager store(clock, StoreLimits{}, db->get());
    store.OpenAttempt("j", 1);
    EXPECT_EQ(*store.Add("j", 1, "barrier", 1, "rank0-0"), 1);
    EXPECT_EQ(*store.Add("j", 1, "barrier", 1, "rank0-0"), 1);  // the retry
    EXPECT_EQ(*store.Add("j", 1, "barrier", 1, "rank1-0"), 2);
    EXPECT_EQ(*store.Add("j", 1, "barrier", 1), 3);
    EXPECT_EQ(*store.Add("j", 1, "barrier", 1), 4);  // no id: every call adds
  }  // killed after applying rank1-0, before its reply
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  StoreManager store(clock, StoreLimits{}, db->get());
  ASSERT_TRUE(store.RestoreAttempt("j", 1).ok());
  EXPECT_EQ(*store.Add("j", 1, "barrier", 1, "rank1-0"), 2);  // the retry, after the restart
  EXPECT_EQ(*store.Add("j", 1, "barrier", 0), 4);
  EXPECT_EQ(*store.Add("j", 1, "barrier", 1, "rank1-1"), 5);
  // A new placement of the attempt forgets the ids with the keys.
  store.OpenAttempt("j", 1);
  EXPECT_EQ(*store.Add("j", 1, "barrier", 1, "rank0-0"), 1);
  StoreManager again(clock, StoreLimits{}, db->get());
  ASSERT_TRUE(again.RestoreAttempt("j", 1).ok());
  EXPECT_EQ(*again.Add("j", 1, "barrier", 1, "rank0-0"), 1);
  EXPECT_EQ(*again.Add("j", 1, "barrier", 1, "rank0-1"), 2);
}

}  // namespace
}  // namespace meshrun::coordinator
