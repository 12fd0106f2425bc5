// WorkerManager with a fake clock and fake streams: registration rules, session attachment,
// the outbox, lease expiry, and restoring registrations from the database.
#include "coordinator/worker_manager.h"

#include <gtest/gtest.h>

#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeSessionStream;

v1::RegisterWorkerRequest Reg(const std::string& name, int slots = 4,
                              const std::string& address = "10.0.0.1") {
  v1::RegisterWorkerRequest r;
  r.set_name(name);
  r.set_slots(slots);
  r.set_device("cpu");
  r.set_address(address);
  return r;
}

v1::OpenSession Open(const v1::RegisterWorkerResponse& reg) {
  v1::OpenSession o;
  o.set_worker_id(reg.worker_id());
  o.set_session_token(reg.session_token());
  return o;
}

v1::WorkerSessionResponse StopMsg(const std::string& job) {
  v1::WorkerSessionResponse m;
  m.mutable_stop()->set_job_id(job);
  return m;
}

class WorkerManagerTest : public ::testing::Test {
 protected:
  WorkerManagerTest() {
    config_.lease_ttl = milliseconds(10'000);
    manager_ = std::make_unique<WorkerManager>(nullptr, clock_, config_);
  }
  testing::FakeClock clock_;
  WorkerManagerConfig config_;
  std::unique_ptr<WorkerManager> manager_;
};

TEST_F(WorkerManagerTest, RegistrationIsValidated) {
  struct Case {
    v1::RegisterWorkerRequest req;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({Reg(""), "name: "});
  cases.push_back({Reg("bad name"), "name: "});
  cases.push_back({Reg("a", 0), "slots: "});
  auto dev = Reg("a");
  dev.set_device("tpu");
  cases.push_back({dev, "device: "});
  auto addr = Reg("a");
  addr.set_address(std::string("x\n", 2));
  cases.push_back({addr, "address: "});
  for (const Case& c : cases) {
    auto r = manager_->Register(c.req);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind(c.field, 0), 0u) << r.status().message();
  }
}

TEST_F(WorkerManagerTest, RegisterGrantsLeaseAndToken) {
  auto r = manager_->Register(Reg("a"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->response.worker_id(), "wkr-1");
  EXPECT_EQ(r->response.session_token().size(), 32u);
  EXPECT_EQ(r->response.lease_ttl().seconds(), 10);
  EXPECT_GT(r->response.heartbeat_interval().seconds() * 1000 +
                r->response.heartbeat_interval().nanos() / 1'000'000,
            0);
  EXPECT_FALSE(r->replaced_live);
  ASSERT_EQ(manager_->LiveWorkers().size(), 1u);
  EXPECT_EQ(manager_->LiveWorkers()[0].slots, 4);
}

TEST_F(WorkerManagerTest, NameOfALiveWorkerFromAnotherAddressIsTaken) {
  ASSERT_TRUE(manager_->Register(Reg("a", 4, "10.0.0.1")).ok());
  auto clash = manager_->Register(Reg("a", 4, "10.0.0.2"));
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), StatusCode::kAlreadyExists);
}

TEST_F(WorkerManagerTest, SameAddressReplacesTheRegistrationOnceItsSessionClosed) {
  auto first = manager_->Register(Reg("a"));
  auto stream = std::make_shared<FakeSessionStream>();
  ASSERT_TRUE(manager_->OpenSession(Open(first->response), stream).ok());
  // A live session keeps the name, even from the same address (two workers on one host).
  auto twin = manager_->Register(Reg("a", 8));
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(twin.status().message().rfind("--name: worker 'a' is already registered from ", 0), 0u)
      << twin.status().message();
  EXPECT_FALSE(stream->finished().has_value());
  // The worker restarted: its old session is gone, the new process takes over.
  manager_->CloseSession(stream.get());
  auto again = manager_->Register(Reg("a", 8));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->replaced_live);
  EXPECT_EQ(again->response.worker_id(), first->response.worker_id()) << "ids are stable per name";
  EXPECT_NE(again->response.session_token(), first->response.session_token());
  EXPECT_EQ(manager_->LiveWorkers()[0].slots, 8);
  // The old token is no longer valid.
  auto old = manager_->OpenSession(Open(first->response), std::make_shared<FakeSessionStream>());
  EXPECT_EQ(old.status().code(), StatusCode::kUnauthenticated);
}

TEST_F(WorkerManagerTest, OpenSessionChecksIdAndToken) {
  auto r = manager_->Register(Reg("a"));
  v1::OpenSession open = Open(r->response);
  open.set_worker_id("wkr-99");
  EXPECT_EQ(manager_->OpenSession(open, std::make_shared<FakeSessionStream>()).status().code(),
            StatusCode::kNotFound);
  open = Open(r->response);
  open.set_session_token("nope");
  EXPECT_EQ(manager_->OpenSession(open, std::make_shared<FakeSessionStream>()).status().code(),
            StatusCode::kUnauthenticated);
  open.clear_worker_id();
  EXPECT_EQ(manager_->OpenSession(open, std::make_shared<FakeSessionStream>()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(WorkerManagerTest, OutboxWaitsForASessionAndAcceptedComesFirst) {
  auto r = manager_->Register(Reg("a"));
  manager_->Send("wkr-1", StopMsg("j1"));
  manager_->Send("wkr-1", StopMsg("j2"));
  auto stream = std::make_shared<FakeSessionStream>();
  auto id = manager_->OpenSession(Open(r->response), stream);
  ASSERT_TRUE(id.ok());
  auto sent = stream->sent();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[0].has_accepted());
  EXPECT_EQ(sent[0].accepted().lease_ttl().seconds(), 10);
  EXPECT_EQ(sent[1].stop().job_id(), "j1");
  EXPECT_EQ(sent[2].stop().job_id(), "j2");
  manager_->Send("wkr-1", StopMsg("j3"));
  EXPECT_EQ(stream->sent().size(), 4u) << "with a session, messages go straight down";
  // A broken stream: messages wait again.
  manager_->CloseSession(stream.get());
  manager_->Send("wkr-1", StopMsg("j4"));
  auto stream2 = std::make_shared<FakeSessionStream>();
  ASSERT_TRUE(manager_->OpenSession(Open(r->response), stream2).ok());
  ASSERT_EQ(stream2->sent().size(), 2u);
  EXPECT_EQ(stream2->sent()[1].stop().job_id(), "j4");
}

TEST_F(WorkerManagerTest, NewerSessionReplacesOlder) {
  auto r = manager_->Register(Reg("a"));
  auto s1 = std::make_shared<FakeSessionStream>();
  auto s2 = std::make_shared<FakeSessionStream>();
  ASSERT_TRUE(manager_->OpenSession(Open(r->response), s1).ok());
  ASSERT_TRUE(manager_->OpenSession(Open(r->response), s2).ok());
  ASSERT_TRUE(s1->finished().has_value());
  EXPECT_EQ(s1->finished()->code(), StatusCode::kAborted);
  EXPECT_EQ(manager_->Touch(s1.get()).status().code(), StatusCode::kAborted);
  EXPECT_TRUE(manager_->Touch(s2.get()).ok());
}

TEST_F(WorkerManagerTest, SilentWorkerIsLostAfterItsLease) {
  auto r = manager_->Register(Reg("a"));
  auto stream = std::make_shared<FakeSessionStream>();
  ASSERT_TRUE(manager_->OpenSession(Open(r->response), stream).ok());
  clock_.Advance(milliseconds(9'000));
  EXPECT_TRUE(manager_->ExpireLeases().empty());
  ASSERT_TRUE(manager_->Touch(stream.get()).ok());  // any up message renews
  clock_.Advance(milliseconds(9'999));
  EXPECT_TRUE(manager_->ExpireLeases().empty());
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(manager_->ExpireLeases(), std::vector<std::string>{"wkr-1"});
  ASSERT_TRUE(stream->finished().has_value());
  EXPECT_EQ(stream->finished()->code(), StatusCode::kNotFound);
  EXPECT_TRUE(manager_->LiveWorkers().empty());
  ASSERT_EQ(manager_->List().size(), 1u);
  EXPECT_EQ(manager_->List()[0].info.state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(manager_->OpenSession(Open(r->response), std::make_shared<FakeSessionStream>())
                .status()
                .code(),
            StatusCode::kNotFound);
  // A lost name may register again, from anywhere.
  auto back = manager_->Register(Reg("a", 4, "10.0.0.9"));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->replaced_live);
  EXPECT_EQ(manager_->LiveWorkers().size(), 1u);
}

// The tick's look at the workers holding ranks runs when the roster changed (decision 0072):
// a registration, a return and a LOST change RosterGeneration; a message, a drain and the
// lookups do not. NotLive names unknown and LOST ids; DrainedWorkers the drained live ones.
TEST_F(WorkerManagerTest, TheRosterGenerationMovesOnlyWhenLivenessChanges) {
  const uint64_t g0 = manager_->RosterGeneration();
  auto r = manager_->Register(Reg("a"));
  ASSERT_TRUE(r.ok());
  const uint64_t g1 = manager_->RosterGeneration();
  EXPECT_NE(g1, g0);
  auto stream = std::make_shared<FakeSessionStream>();
  ASSERT_TRUE(manager_->OpenSession(Open(r->response), stream).ok());
  ASSERT_TRUE(manager_->Touch(stream.get()).ok());
  EXPECT_TRUE(manager_->DrainedWorkers().empty());
  ASSERT_TRUE(manager_->SetDrained("a", true).ok());
  EXPECT_EQ(manager_->DrainedWorkers(), std::vector<std::string>{"wkr-1"});
  ASSERT_TRUE(manager_->SetDrained("a", false).ok());
  EXPECT_TRUE(manager_->DrainedWorkers().empty());
  EXPECT_EQ(manager_->NotLive({"wkr-1", "wkr-9"}), std::vector<std::string>{"wkr-9"});
  EXPECT_TRUE(manager_->ExpireLeases().empty());
  EXPECT_EQ(manager_->RosterGeneration(), g1);

  clock_.Advance(milliseconds(10'000));
  EXPECT_EQ(manager_->ExpireLeases(), std::vector<std::string>{"wkr-1"});
  const uint64_t g2 = manager_->RosterGeneration();
  EXPECT_NE(g2, g1);
  EXPECT_EQ(manager_->NotLive({"wkr-1"}), std::vector<std::string>{"wkr-1"});
  ASSERT_TRUE(manager_->Register(Reg("a")).ok());  // back
  EXPECT_NE(manager_->RosterGeneration(), g2);
  EXPECT_TRUE(manager_->NotLive({"wkr-1"}).empty());
}

TEST_F(WorkerManagerTest, RegistrationsSurviveARestart) {
  testing::TempDir dir;
  v1::RegisterWorkerResponse reg;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok());
    WorkerManager m(db->get(), clock_, config_);
    ASSERT_TRUE(m.Load().ok());
    reg = m.Register(Reg("a"))->response;
    ASSERT_TRUE(m.Register(Reg("b")).ok());
  }
  auto db = StateDb::Open(dir.path());
  WorkerManager m(db->get(), clock_, config_);
  ASSERT_TRUE(m.Load().ok());
  EXPECT_EQ(m.LiveWorkers().size(), 2u);
  auto stream = std::make_shared<FakeSessionStream>();
  ASSERT_TRUE(m.OpenSession(Open(reg), stream).ok()) << "the same token reopens after a restart";
  EXPECT_EQ(m.Register(Reg("c"))->response.worker_id(), "wkr-3") << "ids are not reused";
  // b never comes back (nor does c send anything): LOST one lease (plus the restart grace that
  // covers the workers' reconnect backoff) later, not before.
  clock_.Advance(config_.lease_ttl + config_.restart_grace - milliseconds(1));
  ASSERT_TRUE(m.Touch(stream.get()).ok());
  EXPECT_EQ(m.ExpireLeases(), (std::vector<std::string>{"wkr-3"}));
  clock_.Advance(milliseconds(1));
  ASSERT_TRUE(m.Touch(stream.get()).ok());
  auto lost = m.ExpireLeases();
  EXPECT_EQ(lost, (std::vector<std::string>{"wkr-2"}));
}

TEST_F(WorkerManagerTest, CalibrationSurvivesARestart) {
  // A worker whose session reopens after a coordinator restart does not register again, so its
  // measured figures come from the database (plan --coordinator and auto submissions use them).
  testing::TempDir dir;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok());
    WorkerManager m(db->get(), clock_, config_);
    ASSERT_TRUE(m.Load().ok());
    v1::RegisterWorkerRequest a = Reg("a");
    a.mutable_calibration()->set_gemm_flops(3.5e10);
    a.mutable_calibration()->set_loopback_bus_bandwidth(2.5e9);
    a.mutable_calibration()->set_loopback_latency_seconds(1.5e-4);
    a.mutable_calibration()->set_loopback_ranks(4);
    ASSERT_TRUE(m.Register(a).ok());
    ASSERT_TRUE(m.Register(Reg("b")).ok());  // measured nothing
  }
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  WorkerManager m(db->get(), clock_, config_);
  ASSERT_TRUE(m.Load().ok());
  const std::vector<WorkerSnapshot> list = m.List();
  ASSERT_EQ(list.size(), 2u);
  const v1::HostCalibration& a = list[0].info.calibration();
  EXPECT_EQ(list[0].info.name(), "a");
  EXPECT_DOUBLE_EQ(a.gemm_flops(), 3.5e10);
  EXPECT_DOUBLE_EQ(a.loopback_bus_bandwidth(), 2.5e9);
  EXPECT_DOUBLE_EQ(a.loopback_latency_seconds(), 1.5e-4);
  EXPECT_EQ(a.loopback_ranks(), 4);
  EXPECT_EQ(list[1].info.calibration().gemm_flops(), 0) << "none measured, none restored";
}

}  // namespace
}  // namespace meshrun::coordinator
