// SessionClient's metrics batches (decision 0063): to a coordinator whose SessionAccepted says
// metrics_batches, the rank samples queued one after another go up as one RankMetrics (every
// sample once, in order, at most max_metrics_batch per message, a rank exit never held back
// or reordered); to one that does not, one sample per message as before. A heartbeat due soon
// rides on a batch (decision 0070) where the coordinator says it reads it there.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "tests/worker/fake_coordinator.h"
#include "worker/session_client.h"

namespace meshrun {
namespace {

using namespace std::chrono_literals;
using testing::FakeCoordinator;
using testing::FakeServer;
using BatchUps = std::vector<v1::WorkerSessionRequest>;

class BatchTestHandler : public SessionHandler {
 public:
  void OnAssign(const v1::RankAssignment&) override {}
  void OnStop(const v1::StopOrder&) override {}
  std::vector<v1::RunningRank> RunningRanks() override { return {}; }
  int FreeSlots() override { return 8; }
};

SessionOptions BatchTestOptions() {
  SessionOptions o;
  o.registration.set_name("w1");
  o.registration.set_slots(8);
  o.registration.set_device("cpu");
  o.registration.set_address("127.0.0.1");
  o.backoff_initial = 50ms;
  o.backoff_max = 200ms;
  return o;
}

v1::WorkerSessionRequest SampleOf(int rank, int step) {
  v1::WorkerSessionRequest m;
  v1::MetricsSample* s = m.mutable_metrics()->mutable_sample();
  s->set_job_id("j");
  s->set_attempt(1);
  s->set_rank(rank);
  s->set_step(step);
  return m;
}

// Every sample that went up, in order, and how many metrics messages carried them.
struct SentSamples {
  std::vector<std::pair<int, int>> rank_step;
  int messages = 0;
  int largest = 0;
};
SentSamples SamplesOf(const BatchUps& ups) {
  SentSamples out;
  for (const auto& u : ups) {
    if (!u.has_metrics()) continue;
    ++out.messages;
    int n = 0;
    if (u.metrics().has_sample()) {
      out.rank_step.push_back({u.metrics().sample().rank(), u.metrics().sample().step()});
      ++n;
    }
    for (const auto& s : u.metrics().samples()) {
      out.rank_step.push_back({s.rank(), s.step()});
      ++n;
    }
    out.largest = std::max(out.largest, n);
  }
  return out;
}

// Queues `steps` × 8 samples and a rank exit after them before the session opens, so that
// they are all queued when the writer starts.
void QueueBeforeOpen(FakeCoordinator& fake, SessionOptions o, int steps, BatchUps* ups) {
  BatchTestHandler handler;
  int port = 0;
  {
    FakeServer probe(&fake);
    port = probe.port();
  }
  SessionClient session(testing::StubFor("127.0.0.1:" + std::to_string(port)), o, &handler);
  for (int step = 1; step <= steps; ++step) {
    for (int r = 0; r < 8; ++r) session.Send(SampleOf(r, step));
  }
  v1::WorkerSessionRequest exited;
  exited.mutable_rank_exited()->set_job_id("j");
  exited.mutable_rank_exited()->set_attempt(1);
  exited.mutable_rank_exited()->set_rank(3);
  session.Send(exited);
  session.Send(SampleOf(0, steps + 1));
  FakeServer server(&fake, port);
  ASSERT_TRUE(server.ok());
  session.Start();
  ASSERT_TRUE(fake.WaitFor([&](const BatchUps& u) {
    return static_cast<int>(SamplesOf(u).rank_step.size()) == steps * 8 + 1;
  }));
  session.Stop();
  *ups = fake.up();
}

std::vector<std::pair<int, int>> Expected(int steps) {
  std::vector<std::pair<int, int>> out;
  for (int step = 1; step <= steps; ++step) {
    for (int r = 0; r < 8; ++r) out.push_back({r, step});
  }
  out.push_back({0, steps + 1});
  return out;
}

TEST(SessionBatch, SamplesGoUpInBatchesToACoordinatorThatTakesThem) {
  FakeCoordinator fake;
  fake.metrics_batches = true;
  SessionOptions o = BatchTestOptions();
  o.max_metrics_batch = 16;
  BatchUps ups;
  QueueBeforeOpen(fake, o, 5, &ups);
  const SentSamples sent = SamplesOf(ups);
  EXPECT_EQ(sent.rank_step, Expected(5));  // each once, in order
  // 40 samples before the exit: 16 + 16 + 8, then the one after it alone.
  EXPECT_EQ(sent.messages, 4);
  EXPECT_EQ(sent.largest, 16);
  // The exit went between the batches, not after the sample queued behind it.
  int exit_at = -1, last_metrics = -1;
  for (size_t i = 0; i < ups.size(); ++i) {
    if (ups[i].has_rank_exited()) exit_at = static_cast<int>(i);
    if (ups[i].has_metrics()) last_metrics = static_cast<int>(i);
  }
  EXPECT_GE(exit_at, 0);
  EXPECT_LT(exit_at, last_metrics);
}

TEST(SessionBatch, OneSamplePerMessageToACoordinatorThatDoesNotSayItTakesBatches) {
  FakeCoordinator fake;  // metrics_batches false: a coordinator from before decision 0063
  BatchUps ups;
  QueueBeforeOpen(fake, BatchTestOptions(), 3, &ups);
  const SentSamples sent = SamplesOf(ups);
  EXPECT_EQ(sent.rank_step, Expected(3));
  EXPECT_EQ(sent.messages, 3 * 8 + 1);
  for (const auto& u : ups) {
    if (u.has_metrics()) {
      EXPECT_TRUE(u.metrics().samples().empty());
    }
  }
}

TEST(SessionBatch, ASampleSentAloneWaitsOnlyTheLingerBeforeGoingUp) {
  FakeCoordinator fake;
  fake.metrics_batches = true;
  FakeServer server(&fake);
  ASSERT_TRUE(server.ok());
  BatchTestHandler handler;
  SessionClient session(testing::StubFor(server.address()), BatchTestOptions(), &handler);
  session.Start();
  ASSERT_TRUE(fake.WaitForOpens(1));
  session.Send(SampleOf(2, 7));
  // The default linger is milliseconds: it arrives well before the next heartbeat is due.
  ASSERT_TRUE(
      fake.WaitFor([](const BatchUps& u) { return SamplesOf(u).rank_step.size() == 1; }, 5s));
  EXPECT_EQ(SamplesOf(fake.up()).rank_step, (std::vector<std::pair<int, int>>{{2, 7}}));
  session.Stop();
}

// Heartbeats up: on their own, and inside batches of samples (RankMetrics.heartbeat).
std::pair<int, int> HeartbeatsOf(const BatchUps& ups) {
  int alone = 0, carried = 0;
  for (const auto& u : ups) {
    if (u.has_heartbeat()) ++alone;
    if (u.has_metrics() && u.metrics().has_heartbeat()) ++carried;
  }
  return {alone, carried};
}

// A worker's 8 samples a step, one step per heartbeat interval, for `steps` steps.
void StepEveryInterval(FakeCoordinator& fake, int steps, int* carried_by_client, BatchUps* ups) {
  fake.metrics_batches = true;
  fake.heartbeat = 200ms;
  FakeServer server(&fake);
  ASSERT_TRUE(server.ok());
  BatchTestHandler handler;
  SessionClient session(testing::StubFor(server.address()), BatchTestOptions(), &handler);
  session.Start();
  ASSERT_TRUE(fake.WaitForOpens(1));
  for (int step = 1; step <= steps; ++step) {
    for (int r = 0; r < 8; ++r) session.Send(SampleOf(r, step));
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(session.Flush(5s));
  *carried_by_client = session.heartbeats_carried();
  session.Stop();
  *ups = fake.up();
}

// Decision 0070: with a step about every heartbeat interval, the heartbeat rides on the step's
// batch (one session message a step where there were two) and the worker stays alive to the
// coordinator: no interval passes without a heartbeat of either kind.
TEST(SessionBatch, AHeartbeatDueSoonRidesOnTheStepsBatch) {
  FakeCoordinator fake;
  fake.heartbeat_with_metrics = true;
  int carried_by_client = 0;
  BatchUps ups;
  StepEveryInterval(fake, 10, &carried_by_client, &ups);
  const auto [alone, carried] = HeartbeatsOf(ups);
  EXPECT_EQ(carried, carried_by_client);
  EXPECT_GE(carried, 5) << alone << " heartbeats on their own";
  EXPECT_LT(alone, carried) << "most heartbeats should ride on a batch";
  // About one heartbeat an interval over the ~2 s, of either kind.
  EXPECT_GE(alone + carried, 8);
  EXPECT_EQ(SamplesOf(ups).rank_step.size(), 80u);
}

TEST(SessionBatch, HeartbeatsGoAloneToACoordinatorThatDoesNotReadThemInBatches) {
  FakeCoordinator fake;  // heartbeat_with_metrics false: a coordinator from before decision 0070
  int carried_by_client = 0;
  BatchUps ups;
  StepEveryInterval(fake, 5, &carried_by_client, &ups);
  const auto [alone, carried] = HeartbeatsOf(ups);
  EXPECT_EQ(carried, 0);
  EXPECT_EQ(carried_by_client, 0);
  EXPECT_GE(alone, 4);
}

}  // namespace
}  // namespace meshrun
