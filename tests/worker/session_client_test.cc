// SessionClient against an in-process fake coordinator: registration, open, heartbeats with the
// running ranks, reports in order, assignments and stops down, reconnects with backoff after the
// coordinator goes away (reopening with the same token, or registering again when it forgot the
// worker), and a registration refused for good.
#include "worker/session_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "tests/worker/fake_coordinator.h"

namespace meshrun {
namespace {

using namespace std::chrono_literals;
using testing::FakeCoordinator;
using testing::FakeServer;
using Ups = std::vector<v1::WorkerSessionRequest>;

class FakeHandler : public SessionHandler {
 public:
  void OnAssign(const v1::RankAssignment& a) override {
    std::lock_guard<std::mutex> lock(mu);
    assigns.push_back(a);
  }
  void OnStop(const v1::StopOrder& s) override {
    std::lock_guard<std::mutex> lock(mu);
    stops.push_back(s);
  }
  std::vector<v1::RunningRank> RunningRanks() override {
    std::lock_guard<std::mutex> lock(mu);
    return running;
  }
  int FreeSlots() override { return 3; }
  void OnConnected(bool c) override { connected_changes += c ? 1 : 0; }
  void OnFatal(const Status& s) override {
    std::lock_guard<std::mutex> lock(mu);
    fatal = s;
  }

  std::mutex mu;
  std::vector<v1::RankAssignment> assigns;
  std::vector<v1::StopOrder> stops;
  std::vector<v1::RunningRank> running;
  Status fatal;
  std::atomic<int> connected_changes{0};
};

SessionOptions Options() {
  SessionOptions o;
  o.registration.set_name("w1");
  o.registration.set_slots(4);
  o.registration.set_device("cpu");
  o.registration.set_address("127.0.0.1");
  o.backoff_initial = 50ms;
  o.backoff_max = 200ms;
  return o;
}

v1::RunningRank Running(const std::string& job, int attempt, int rank, int pid) {
  v1::RunningRank r;
  r.set_job_id(job);
  r.set_attempt(attempt);
  r.set_rank(rank);
  r.set_pid(pid);
  return r;
}

v1::WorkerSessionRequest Exited(int rank) {
  v1::WorkerSessionRequest m;
  m.mutable_rank_exited()->set_job_id("j");
  m.mutable_rank_exited()->set_attempt(1);
  m.mutable_rank_exited()->set_rank(rank);
  return m;
}

int CountExits(const Ups& ups) {
  int n = 0;
  for (const auto& u : ups) n += u.has_rank_exited();
  return n;
}

TEST(SessionClient, RegistersOpensAndHeartbeats) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  ASSERT_TRUE(server.ok());
  FakeHandler handler;
  handler.running = {Running("j", 1, 0, 1234)};
  SessionClient session(testing::StubFor(server.address()), Options(), &handler);
  session.Start();
  ASSERT_TRUE(fake.WaitForOpens(1));
  ASSERT_EQ(fake.registrations().size(), 1u);
  EXPECT_EQ(fake.registrations()[0].name(), "w1");
  EXPECT_EQ(fake.registrations()[0].slots(), 4);
  EXPECT_EQ(fake.opens()[0].running_size(), 1);
  ASSERT_TRUE(fake.WaitFor([](const Ups& ups) {
    int beats = 0;
    for (const auto& u : ups) beats += u.has_heartbeat();
    return beats >= 3;
  }));
  for (const auto& u : fake.up()) {
    if (!u.has_heartbeat()) continue;
    EXPECT_EQ(u.heartbeat().free_slots(), 3);
    ASSERT_EQ(u.heartbeat().running_size(), 1);
    EXPECT_EQ(u.heartbeat().running(0).pid(), 1234);
  }
  EXPECT_TRUE(session.connected());
  EXPECT_EQ(session.worker_id(), "w1");
  session.Stop();
  EXPECT_FALSE(session.connected());
}

TEST(SessionClient, ReportsGoUpInOrderAndOrdersComeDown) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  FakeHandler handler;
  SessionClient session(testing::StubFor(server.address()), Options(), &handler);
  for (int r = 0; r < 5; ++r) session.Send(Exited(r));  // queued before any session
  session.Start();
  ASSERT_TRUE(fake.WaitFor([](const Ups& ups) { return CountExits(ups) == 5; }));
  int next = 0;
  for (const auto& u : fake.up()) {
    if (u.has_rank_exited()) {
      EXPECT_EQ(u.rank_exited().rank(), next++);
    }
  }
  v1::WorkerSessionResponse assign;
  assign.mutable_assign()->set_job_id("j");
  assign.mutable_assign()->set_rank(2);
  fake.SendDown(assign);
  v1::WorkerSessionResponse stop;
  stop.mutable_stop()->set_job_id("j");
  stop.mutable_stop()->set_reason(v1::STOP_REASON_CANCELLED);
  fake.SendDown(stop);
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(handler.mu);
      if (handler.stops.size() == 1) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard<std::mutex> lock(handler.mu);
  ASSERT_EQ(handler.assigns.size(), 1u);
  EXPECT_EQ(handler.assigns[0].rank(), 2);
  ASSERT_EQ(handler.stops.size(), 1u);
  EXPECT_EQ(handler.stops[0].reason(), v1::STOP_REASON_CANCELLED);
  EXPECT_TRUE(session.Flush(1s));
}

TEST(SessionClient, ReopensWithTheSameTokenAfterTheCoordinatorComesBack) {
  FakeCoordinator fake;
  auto server = std::make_unique<FakeServer>(&fake);
  const int port = server->port();
  FakeHandler handler;
  SessionClient session(testing::StubFor(server->address()), Options(), &handler);
  session.Start();
  ASSERT_TRUE(fake.WaitForOpens(1));
  server->Shutdown();
  for (int i = 0; i < 200 && session.connected(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(session.connected());
  // Reports made while the coordinator is away are kept.
  session.Send(Exited(7));
  {
    std::lock_guard<std::mutex> lock(handler.mu);
    handler.running = {Running("j", 1, 0, 99)};
  }
  std::this_thread::sleep_for(300ms);  // a few failed reconnects
  server = std::make_unique<FakeServer>(&fake, port);
  ASSERT_TRUE(server->ok());
  ASSERT_TRUE(fake.WaitForOpens(2, 15s));
  EXPECT_EQ(fake.registrations().size(), 1u) << "the lease still held: no new registration";
  EXPECT_EQ(fake.opens()[1].worker_id(), fake.opens()[0].worker_id());
  ASSERT_EQ(fake.opens()[1].running_size(), 1);
  EXPECT_EQ(fake.opens()[1].running(0).pid(), 99);
  ASSERT_TRUE(fake.WaitFor([](const Ups& ups) { return CountExits(ups) == 1; }));
  EXPECT_EQ(session.sessions_opened(), 2);
}

TEST(SessionClient, RegistersAgainWhenTheCoordinatorForgotTheWorker) {
  auto fake = std::make_unique<FakeCoordinator>();
  auto server = std::make_unique<FakeServer>(fake.get());
  const int port = server->port();
  FakeHandler handler;
  handler.running = {Running("j", 3, 1, 4321)};
  SessionClient session(testing::StubFor(server->address()), Options(), &handler);
  session.Start();
  ASSERT_TRUE(fake->WaitForOpens(1));
  server->Shutdown();
  // A coordinator that lost its in-memory registrations (a restart): the old id is NOT_FOUND.
  auto fresh = std::make_unique<FakeCoordinator>();
  server = std::make_unique<FakeServer>(fresh.get(), port);
  ASSERT_TRUE(server->ok());
  ASSERT_TRUE(fresh->WaitForOpens(1, 15s));
  ASSERT_EQ(fresh->registrations().size(), 1u);
  ASSERT_EQ(fresh->opens()[0].running_size(), 1);
  EXPECT_EQ(fresh->opens()[0].running(0).attempt(), 3);
  EXPECT_EQ(session.registrations(), 2);
  session.Stop();
  server.reset();
}

TEST(SessionClient, DropsMetricsButKeepsExitsWhenTheQueueIsFull) {
  FakeCoordinator fake;
  FakeHandler handler;
  SessionOptions o = Options();
  o.max_queued = 10;
  // Nothing listens yet: everything queues.
  auto port = 0;
  {
    FakeServer probe(&fake);
    port = probe.port();
  }
  SessionClient session(testing::StubFor("127.0.0.1:" + std::to_string(port)), o, &handler);
  for (int i = 0; i < 50; ++i) {
    v1::WorkerSessionRequest m;
    m.mutable_metrics()->mutable_sample()->set_step(i);
    session.Send(m);
  }
  for (int r = 0; r < 3; ++r) session.Send(Exited(r));
  FakeServer server(&fake, port);
  ASSERT_TRUE(server.ok());
  session.Start();
  ASSERT_TRUE(fake.WaitFor([](const Ups& ups) { return CountExits(ups) == 3; }));
  int metrics = 0;
  for (const auto& u : fake.up()) metrics += u.has_metrics();
  EXPECT_EQ(metrics, 10);
}

TEST(SessionClient, DropsLogLinesBeyondTheByteBudget) {
  FakeCoordinator fake;
  FakeHandler handler;
  SessionOptions o = Options();
  o.max_queued_bytes = 64 << 10;  // room for fewer than 8 batches of 10 KiB
  auto port = 0;
  {
    FakeServer probe(&fake);
    port = probe.port();
  }
  SessionClient session(testing::StubFor("127.0.0.1:" + std::to_string(port)), o, &handler);
  for (int i = 0; i < 100; ++i) {
    v1::WorkerSessionRequest m;
    m.mutable_logs()->add_lines()->set_text(std::string(10 << 10, 'x'));
    session.Send(m);
  }
  for (int r = 0; r < 2; ++r) session.Send(Exited(r));
  FakeServer server(&fake, port);
  ASSERT_TRUE(server.ok());
  session.Start();
  ASSERT_TRUE(fake.WaitFor([](const Ups& ups) { return CountExits(ups) == 2; }));
  int logs = 0;
  for (const auto& u : fake.up()) logs += u.has_logs();
  EXPECT_GT(logs, 0);
  EXPECT_LE(logs, 6) << "the queue held more than its byte budget";
}

TEST(SessionClient, RefusedRegistrationIsFatal) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  FakeHandler handler;
  SessionOptions o = Options();
  o.registration.set_slots(0);
  SessionClient session(testing::StubFor(server.address()), o, &handler);
  session.Start();
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lock(handler.mu);
      if (!handler.fatal.ok()) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard<std::mutex> lock(handler.mu);
  EXPECT_EQ(handler.fatal.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun
