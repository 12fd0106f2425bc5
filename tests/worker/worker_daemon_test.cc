// WorkerDaemon end to end against an in-process fake coordinator, with tests/fakes/fake_rank.cc
// standing in for `meshrun __rank`: an assignment becomes a process told its
// RankStart; its step report becomes RankMetrics, its checkpoint report CheckpointSaved, its
// output lines LogBatches, its end RankExited; stop orders, full slots, bad specs and shutdown.
#include "worker/worker_daemon.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/job_spec_yaml.h"
#include "proto/spec_convert.h"
#include "tests/worker/fake_coordinator.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::FakeCoordinator;
using testing::FakeServer;
using Ups = std::vector<v1::WorkerSessionRequest>;

class WorkerDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("worker-daemon-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    setenv("MESHRUN_STORE_DIR", "/must/not/leak", 1);
    server_ = std::make_unique<FakeServer>(&fake_);
    ASSERT_TRUE(server_->ok());
  }
  void TearDown() override {
    daemon_.reset();
    server_.reset();
    unsetenv("FAKE_RANK_MODE");
    unsetenv("MESHRUN_STORE_DIR");
    fs::remove_all(dir_);
  }

  void StartDaemon(int slots = 2) {
    WorkerConfig config;
    config.name = "w1";
    config.slots = slots;
    config.address = "127.0.0.9";
    config.work_dir = (dir_ / "work").string();
    config.meshrun_binary = MESHRUN_FAKE_RANK;  // tests/fakes/fake_rank.cc
    config.cores = 8;
    config.default_grace = 2s;
    config.session.backoff_initial = 50ms;
    // The fake rank's mode travels in the worker's environment; ranks get only an allow-list
    // of it, so the test passes it by name as an operator would (--rank-env).
    config.rank_env_pass = {"FAKE_RANK_MODE"};
    daemon_ = std::make_unique<WorkerDaemon>(config, testing::StubFor(server_->address()), nullptr);
    daemon_->Start();
    ASSERT_TRUE(fake_.WaitForOpens(1));
  }

  v1::WorkerSessionResponse Assign(int rank, int world = 2, int attempt = 1) {
    JobSpec spec;
    spec.name = "t";
    spec.parallelism.tp_size = 2;
    spec.data.train = "/tmp/data.txt";
    v1::WorkerSessionResponse m;
    v1::RankAssignment* a = m.mutable_assign();
    a->set_job_id("job-1");
    a->set_attempt(attempt);
    a->set_rank(rank);
    a->set_world_size(world);
    a->mutable_coords()->set_tp(rank);
    a->set_local_rank(rank);
    a->set_local_world_size(2);
    *a->mutable_spec() = JobSpecToProto(spec);
    a->mutable_store()->set_address("127.0.0.1:7777");
    return m;
  }

  static const v1::RankExited* ExitOf(const Ups& ups, int rank) {
    for (const auto& u : ups) {
      if (u.has_rank_exited() && u.rank_exited().rank() == rank) return &u.rank_exited();
    }
    return nullptr;
  }

  FakeCoordinator fake_;
  std::unique_ptr<FakeServer> server_;
  std::unique_ptr<WorkerDaemon> daemon_;
  fs::path dir_;
};

TEST_F(WorkerDaemonTest, AssignmentRunsARankAndReportsItsLife) {
  StartDaemon();
  fake_.SendDown(Assign(0));
  fake_.SendDown(Assign(1));
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 0) && ExitOf(ups, 1); }));
  const Ups ups = fake_.up();
  int started = 0, metrics = 0, checkpoints = 0;
  std::vector<std::string> logs;
  for (const auto& u : ups) {
    started += u.has_rank_started();
    if (u.has_rank_started()) {
      EXPECT_GT(u.rank_started().pid(), 0);
    }
    if (u.has_metrics()) {
      ++metrics;
      const v1::MetricsSample& s = u.metrics().sample();
      EXPECT_EQ(s.job_id(), "job-1");
      EXPECT_TRUE(s.has_rank());
      EXPECT_EQ(s.step(), 1);
      EXPECT_DOUBLE_EQ(s.loss(), 5.5);
    }
    if (u.has_checkpoint_saved()) {
      ++checkpoints;
      EXPECT_EQ(u.checkpoint_saved().step(), 1);
    }
    for (const auto& l : u.logs().lines())
      logs.push_back(std::to_string(l.rank()) + ":" + l.text());
  }
  EXPECT_EQ(started, 2);
  EXPECT_EQ(metrics, 2) << "each rank's step report is a RankMetrics";
  EXPECT_EQ(checkpoints, 1) << "only rank 0 reports checkpoints";
  EXPECT_EQ(ExitOf(ups, 0)->exit_code(), 0);
  EXPECT_FALSE(ExitOf(ups, 0)->stopped());
  // 8 cores shared by 2 local ranks; no MESHRUN_STORE_DIR leaks from the worker's environment.
  EXPECT_NE(std::find(logs.begin(), logs.end(), "1:env 1 2 job-1 1 127.0.0.1:7777 127.0.0.9 4 -"),
            logs.end())
      << ::testing::PrintToString(logs);
  // Each rank got the spec exactly as the coordinator sent it (decision 0048): no second copy
  // in the attempt's folder, the threads beside it in RankStart.
  const fs::path attempt = dir_ / "work" / "job-1" / "1";
  for (int r : {0, 1}) {
    std::ifstream in(attempt / ("spec-" + std::to_string(r)), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    EXPECT_EQ(bytes.str(), Assign(r).assign().spec().SerializeAsString()) << "rank " << r;
  }
  EXPECT_FALSE(fs::exists(attempt / "spec.yaml"));
  EXPECT_EQ(daemon_->active_ranks(), 0u);
}

// Decision 0048: the worker forwards the coordinator's spec byte for byte, whatever fields it
// leaves unset (the model sizes under model.init_from, defaults a gRPC client left out); its own
// facts (threads) travel beside it.
TEST_F(WorkerDaemonTest, TheRankGetsTheCoordinatorsSpecByteForByte) {
  StartDaemon();
  v1::WorkerSessionResponse m = Assign(0, /*world=*/1);
  m.mutable_assign()->set_local_world_size(1);
  v1::JobSpec* spec = m.mutable_assign()->mutable_spec();
  spec->mutable_parallelism()->set_tp_size(1);
  spec->mutable_model()->set_init_from("/models/tiny");
  spec->mutable_model()->clear_d_model();
  spec->mutable_model()->clear_n_head();
  spec->mutable_train()->clear_lr();
  spec->mutable_resources()->set_threads(0);
  spec->set_source_yaml("name: t\n");
  fake_.SendDown(m);
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 0) != nullptr; }));
  EXPECT_EQ(ExitOf(fake_.up(), 0)->exit_code(), 0) << ExitOf(fake_.up(), 0)->error();
  const fs::path attempt = dir_ / "work" / "job-1" / "1";
  std::ifstream in(attempt / "spec-0", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  EXPECT_EQ(bytes.str(), spec->SerializeAsString());
  std::ifstream start(attempt / "start-0");
  std::stringstream told;
  told << start.rdbuf();
  EXPECT_NE(told.str().find("threads=8\n"), std::string::npos) << told.str();  // --cores 8
}

TEST_F(WorkerDaemonTest, StopOrderStopsTheAttemptsRanks) {
  setenv("FAKE_RANK_MODE", "sleep", 1);
  StartDaemon();
  fake_.SendDown(Assign(0));
  fake_.SendDown(Assign(1));
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) {
    int n = 0;
    for (const auto& u : ups) n += u.has_rank_started();
    return n == 2;
  }));
  // Heartbeats list both.
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) {
    return !ups.empty() && ups.back().has_heartbeat() && ups.back().heartbeat().running_size() == 2;
  }));
  v1::WorkerSessionResponse stop;
  stop.mutable_stop()->set_job_id("job-1");
  stop.mutable_stop()->set_attempt(1);
  stop.mutable_stop()->set_reason(v1::STOP_REASON_CANCELLED);
  stop.mutable_stop()->mutable_grace_period()->set_seconds(5);
  fake_.SendDown(stop);
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 0) && ExitOf(ups, 1); }));
  const Ups ups = fake_.up();
  for (int r : {0, 1}) {
    EXPECT_TRUE(ExitOf(ups, r)->stopped());
    EXPECT_EQ(ExitOf(ups, r)->exit_code(), 143);
  }
}

TEST_F(WorkerDaemonTest, FullSlotsAndBadSpecsAreReportedNotStarted) {
  setenv("FAKE_RANK_MODE", "sleep", 1);
  StartDaemon(/*slots=*/1);
  fake_.SendDown(Assign(0));
  fake_.SendDown(Assign(1));
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 1) != nullptr; }));
  EXPECT_EQ(ExitOf(fake_.up(), 1)->exit_code(), -1);
  EXPECT_NE(ExitOf(fake_.up(), 1)->error().find("no free slot"), std::string::npos);
  // A world size that contradicts the spec's mesh (tp 2) never starts.
  v1::WorkerSessionResponse bad = Assign(2, /*world=*/3, /*attempt=*/2);
  fake_.SendDown(bad);
  // Refused while the slot is still taken: the spec is checked before a slot is looked for.
  // (Waiting matters: an assignment that arrives during Shutdown is refused as "shutting down"
  // and never reported, since the session is closing.)
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 2) != nullptr; }));
  daemon_->Shutdown(1s);
  const Ups ups = fake_.up();
  const v1::RankExited* bad_exit = ExitOf(ups, 2);
  ASSERT_NE(bad_exit, nullptr);
  EXPECT_EQ(bad_exit->exit_code(), -1);
  EXPECT_FALSE(bad_exit->error().empty());
  // Shutdown stopped rank 0 and reported it before closing the session.
  ASSERT_NE(ExitOf(ups, 0), nullptr);
  EXPECT_TRUE(ExitOf(ups, 0)->stopped());
}

TEST_F(WorkerDaemonTest, FailedRankReportsItsLastErrorLine) {
  setenv("FAKE_RANK_MODE", "fail", 1);
  StartDaemon();
  fake_.SendDown(Assign(0));
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 0) != nullptr; }));
  const Ups ups = fake_.up();
  const v1::RankExited* e = ExitOf(ups, 0);
  EXPECT_EQ(e->exit_code(), 1);
  EXPECT_EQ(e->error(), "error: rank blew up");
  EXPECT_FALSE(e->stopped());
}

// A rank's output is any bytes, but a proto3 string must be UTF-8, or the coordinator cannot
// parse the session's message (and the session ends, the line lost): the worker sends bytes
// that are not UTF-8 as \xNN and leaves the rest (controls included) for readers to escape.
TEST_F(WorkerDaemonTest, OutputThatIsNotUtf8IsSentAsValidUtf8) {
  setenv("FAKE_RANK_MODE", "bytes", 1);
  StartDaemon();
  fake_.SendDown(Assign(0));
  ASSERT_TRUE(fake_.WaitFor([](const Ups& ups) { return ExitOf(ups, 0) != nullptr; }));
  const Ups ups = fake_.up();
  std::vector<std::string> logs;
  for (const auto& u : ups) {
    for (const auto& l : u.logs().lines()) logs.push_back(l.text());
  }
  EXPECT_NE(std::find(logs.begin(), logs.end(), "raw \\x9b[2J \\xff ok \x1b[0m"), logs.end())
      << ::testing::PrintToString(logs);
  EXPECT_EQ(ExitOf(ups, 0)->error(), "error: cut \\xc3");
  EXPECT_EQ(fake_.opens().size(), 1u) << "the session never broke";
}

}  // namespace
}  // namespace meshrun
