// JobManager with fakes (clock, worker view, no sockets) and a real SQLite file: the job
// lifecycle, the FIFO queue, restarts with attempt numbers, stale attempts, cancel, lost
// workers, missed reports, persistence across a re-open, WatchJob replay, metrics and logs.
#include "coordinator/job_manager.h"

#include <gtest/gtest.h>

#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"
#include "tests/fakes/fake_worker_view.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeWatchStream;
using testing::SubmitRequest;

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest() { Open(); }

  void Open() {
    jobs_.reset();
    persistent_store_.reset();
    db_.reset();
    db_ = StateDb::Open(dir_.path()).value();
    // As server.cc builds it: a fresh store per start, writing through to the database.
    if (persist_store_) {
      persistent_store_ = std::make_unique<StoreManager>(clock_, StoreLimits{}, db_.get());
    }
    JobManagerConfig config;
    config.store_address = "coord:1234";
    config.find_checkpoint = [this](const std::string&) {
      ++find_calls_;
      return found_checkpoint_;
    };
    config.stop_resend = milliseconds(1000);
    // Restarts are placed at once unless a test sets a backoff (RestartsBackOffExponentially).
    config.restart_backoff = restart_backoff_;
    config.max_stops_per_worker = max_stops_per_worker_;
    jobs_ = std::make_unique<JobManager>(
        db_.get(), workers_, persist_store_ ? *persistent_store_ : store_, clock_, config);
    ASSERT_TRUE(jobs_->Load().ok());
  }

  std::string Submit(int r, int s, int c, int t, int max_restarts = 0) {
    auto id = jobs_->Submit(SubmitRequest(r, s, c, t, max_restarts));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : "";
  }
  v1::Job Get(const std::string& id) {
    auto job = jobs_->Get(id);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? *job : v1::Job();
  }
  void Started(const std::string& worker, const v1::RankAssignment& a) {
    v1::RankStarted m;
    m.set_job_id(a.job_id());
    m.set_attempt(a.attempt());
    m.set_rank(a.rank());
    m.set_pid(1000 + a.rank());
    jobs_->OnRankStarted(worker, m);
  }
  void Exited(const std::string& worker, const std::string& job, int attempt, int rank, int code,
              bool stopped = false, int signal = 0) {
    v1::RankExited m;
    m.set_job_id(job);
    m.set_attempt(attempt);
    m.set_rank(rank);
    m.set_exit_code(code);
    m.set_signal(signal);
    m.set_stopped(stopped);
    m.set_error(code == 0 ? "" : "boom");
    jobs_->OnRankExited(worker, m);
  }
  // Starts every assignment sent to `worker` and returns them.
  std::vector<v1::RankAssignment> StartAll(const std::string& worker) {
    auto as = workers_.TakeAssignments(worker);
    for (const auto& a : as) Started(worker, a);
    return as;
  }
  void Heartbeat(const std::string& worker, const std::vector<v1::RankAssignment>& running) {
    google::protobuf::RepeatedPtrField<v1::RunningRank> list;
    for (const auto& a : running) {
      v1::RunningRank* r = list.Add();
      r->set_job_id(a.job_id());
      r->set_attempt(a.attempt());
      r->set_rank(a.rank());
      r->set_pid(1000 + a.rank());
    }
    jobs_->OnRunning(worker, list);
  }

  milliseconds restart_backoff_{0};
  size_t max_stops_per_worker_ = 1024;
  testing::TempDir dir_;
  testing::FakeClock clock_;
  testing::FakeWorkerView workers_;
  StoreManager store_{clock_, StoreLimits{}};
  bool persist_store_ = false;
  int find_calls_ = 0;            // config.find_checkpoint calls
  std::string found_checkpoint_;  // what it answers
  std::unique_ptr<StoreManager> persistent_store_;
  std::unique_ptr<StateDb> db_;
  std::unique_ptr<JobManager> jobs_;
};

TEST_F(JobManagerTest, RunsToSuccessWithAssignmentsOnBothWorkers) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = Submit(1, 2, 1, 2);  // dp_shard 2 × tp 2
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.world_size(), 4);
  ASSERT_EQ(job.ranks_size(), 4);
  EXPECT_EQ(job.ranks(0).worker_name(), job.ranks(1).worker_name());
  EXPECT_EQ(job.ranks(2).worker_name(), job.ranks(3).worker_name());
  EXPECT_NE(job.ranks(0).worker_name(), job.ranks(2).worker_name());
  EXPECT_EQ(job.ranks(3).coords().dp_shard(), 1);
  EXPECT_EQ(job.ranks(3).coords().tp(), 1);
  EXPECT_TRUE(store_.HasAttempt(id, 1));

  const std::string w0 = job.ranks(0).worker_id(), w1 = job.ranks(2).worker_id();
  auto a0 = StartAll(w0);
  auto a1 = StartAll(w1);
  ASSERT_EQ(a0.size(), 2u);
  ASSERT_EQ(a1.size(), 2u);
  const v1::RankAssignment& r3 = a1[1];
  EXPECT_EQ(r3.rank(), 3);
  EXPECT_EQ(r3.attempt(), 1);
  EXPECT_EQ(r3.world_size(), 4);
  EXPECT_EQ(r3.local_rank(), 1);
  EXPECT_EQ(r3.local_world_size(), 2);
  EXPECT_EQ(r3.coords().dp_shard(), 1);
  EXPECT_EQ(r3.mesh().tp_size(), 2);
  EXPECT_EQ(r3.store().address(), "coord:1234");
  EXPECT_EQ(r3.store().prefix(), id + "/1/");
  EXPECT_EQ(r3.spec().parallelism().dp_shard_size(), 2);
  EXPECT_EQ(Get(id).ranks(3).state(), v1::RANK_STATE_RUNNING);
  EXPECT_EQ(Get(id).ranks(3).pid(), 1003);

  for (int r = 0; r < 4; ++r) Exited(r < 2 ? w0 : w1, id, 1, r, 0);
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(job.has_finished_at());
  EXPECT_EQ(job.ranks(2).state(), v1::RANK_STATE_SUCCEEDED);
  EXPECT_FALSE(store_.HasAttempt(id, 1)) << "the key space ends with the attempt";
  EXPECT_TRUE(jobs_->SlotsInUse().empty());
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  auto c = jobs_->Cancel(cancel);
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("SUCCEEDED"), std::string::npos);
}

TEST_F(JobManagerTest, SubmitValidatesAndDeduplicates) {
  workers_.Add("a", 8);
  auto bad = jobs_->Submit(SubmitRequest(1, 1, 1, 3));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().rfind("parallelism.tp_size: ", 0), 0u);

  v1::SubmitJobRequest big = SubmitRequest(1, 1, 1, 1);
  big.mutable_spec()->set_source_yaml(std::string(300 * 1024, 'x'));
  EXPECT_EQ(jobs_->Submit(big).status().code(), StatusCode::kResourceExhausted);

  v1::SubmitJobRequest req = SubmitRequest(1, 1, 1, 1);
  req.set_request_id("req-1");
  auto first = jobs_->Submit(req);
  auto second = jobs_->Submit(req);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(jobs_->List(v1::ListJobsRequest())->jobs_size(), 1);
}

TEST_F(JobManagerTest, TpGroupLargerThanEveryWorker) {
  // Rejected at submit while such workers are registered…
  workers_.Add("a", 4);
  auto id = jobs_->Submit(SubmitRequest(1, 1, 1, 8));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(id.status().message().rfind("parallelism.tp_size: ", 0), 0u);
  // …and FAILED with the same reason when it was queued before any worker registered.
  workers_.Remove("a");
  const std::string queued = Submit(1, 1, 1, 8);
  EXPECT_EQ(Get(queued).state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(Get(queued).message().find("waiting for a cpu worker"), std::string::npos);
  workers_.Add("a", 4);
  jobs_->Schedule();
  v1::Job job = Get(queued);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.message().find("tp group of 8"), std::string::npos) << job.message();
}

TEST_F(JobManagerTest, TooBigForEveryWorkerTogetherIsRefusedWithTheNumbers) {
  workers_.Add("a", 4);
  workers_.Add("b", 3);
  auto id = jobs_->Submit(SubmitRequest(1, 4, 1, 2));  // 8 ranks; 4 + 2 usable in tp groups of 2
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(id.status().message().rfind("parallelism: dp_replicate=1 dp_shard=4 cp=1 tp=2 "
                                        "(world size 8) needs 8 slots but the 2 registered cpu "
                                        "workers hold 7 slots (6 of them in whole tp groups of "
                                        "2) in all",
                                        0),
            0u)
      << id.status().message();
  EXPECT_NE(id.status().message().find("--wait-for-capacity"), std::string::npos);
  EXPECT_EQ(jobs_->List(v1::ListJobsRequest())->jobs_size(), 0);
}

TEST_F(JobManagerTest, TooBigForTheClusterWaitsWithoutBlockingOthers) {
  workers_.Add("a", 4);
  v1::SubmitJobRequest wait = SubmitRequest(1, 8, 1, 1);
  wait.set_wait_for_capacity(true);
  auto queued = jobs_->Submit(wait);
  ASSERT_TRUE(queued.ok()) << queued.status().ToString();
  const std::string big = *queued;
  const std::string small = Submit(1, 2, 1, 1);
  v1::Job b = Get(big);
  EXPECT_EQ(b.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(b.message().find("needs 8 slots"), std::string::npos) << b.message();
  EXPECT_EQ(Get(small).state(), v1::JOB_STATE_RUNNING);
  // More workers register: the big job can run once the slots are free.
  workers_.Add("b", 4);
  jobs_->Schedule();
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(Get(big).message().find("waiting for slots"), std::string::npos);
  Exited("a", small, 1, 0, 0);
  Exited("a", small, 1, 1, 0);
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, QueueIsFifoPerDevice) {
  workers_.Add("a", 4);
  const std::string j1 = Submit(1, 4, 1, 1);
  const std::string j2 = Submit(1, 2, 1, 1);
  const std::string j3 = Submit(1, 1, 1, 1);
  EXPECT_EQ(Get(j1).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(j2).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(j3).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(j3).message(), "queued behind job " + j2);
  // A cuda job is not held up by the cpu queue.
  workers_.Add("g", 1, "cuda");
  v1::SubmitJobRequest cuda = SubmitRequest(1, 1, 1, 1);
  cuda.mutable_spec()->mutable_resources()->set_device("cuda");
  auto j4 = jobs_->Submit(cuda);
  ASSERT_TRUE(j4.ok());
  EXPECT_EQ(Get(*j4).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(*j4).ranks(0).worker_name(), "g");
  for (int r = 0; r < 4; ++r) Exited("a", j1, 1, r, 0);
  EXPECT_EQ(Get(j2).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(j3).state(), v1::JOB_STATE_RUNNING);
}

// A cuda job on a cluster whose workers offer only cpu slots waits PENDING, saying why and how
// to give it a place; it starts once a cuda worker registers.
TEST_F(JobManagerTest, CudaJobWithoutCudaWorkersWaitsPendingWithTheReason) {
  workers_.Add("a", 4);  // cpu
  v1::SubmitJobRequest cuda = SubmitRequest(1, 1, 1, 1);
  cuda.mutable_spec()->mutable_resources()->set_device("cuda");
  auto id = jobs_->Submit(cuda);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(Get(*id).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(*id).message(),
            "waiting for a cuda worker to register: no live worker offers cuda slots (hint: "
            "start meshrun-worker --device cuda on a node that has them)");
  workers_.Add("g", 1, "cuda");
  jobs_->Schedule();
  EXPECT_EQ(Get(*id).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, RestartsWithNewAttemptNumbersThenFails) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = Submit(1, 4, 1, 1, /*max_restarts=*/2);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    v1::Job job = Get(id);
    ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);
    ASSERT_EQ(job.attempt(), attempt);
    EXPECT_EQ(job.restarts(), attempt - 1);
    auto as = StartAll("a");
    auto bs = StartAll("b");
    ASSERT_EQ(as.size() + bs.size(), 4u);
    for (const auto& a : as) EXPECT_EQ(a.attempt(), attempt);
    // Rank 0 fails: the others are stopped, the key space goes.
    Exited("a", id, attempt, 0, 3);
    EXPECT_FALSE(store_.HasAttempt(id, attempt));
    auto stops_a = workers_.TakeStops("a");
    auto stops_b = workers_.TakeStops("b");
    ASSERT_EQ(stops_a.size(), 1u);
    ASSERT_EQ(stops_b.size(), 1u);
    EXPECT_EQ(stops_b[0].reason(), v1::STOP_REASON_PEER_FAILED);
    EXPECT_EQ(stops_b[0].attempt(), attempt);
    job = Get(id);
    if (attempt < 3) {
      EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
      EXPECT_NE(job.message().find("restart " + std::to_string(attempt) + " of 2"),
                std::string::npos)
          << job.message();
      EXPECT_NE(job.message().find("exited with code 3: boom"), std::string::npos);
    }
    // The stopped ranks report back; their slots free up and the next attempt is placed.
    Exited("a", id, attempt, 1, -1, /*stopped=*/true, 15);
    Exited("b", id, attempt, 2, -1, true, 15);
    Exited("b", id, attempt, 3, -1, true, 15);
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.attempt(), 3);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_NE(job.message().find("all 2 restarts used"), std::string::npos) << job.message();
  EXPECT_EQ(job.ranks(0).state(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(job.ranks(0).exit_code(), 3);
  EXPECT_EQ(job.ranks(1).state(), v1::RANK_STATE_STOPPED);
}

TEST_F(JobManagerTest, NextAttemptWaitsForTheOldRanksToLeave) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1, 1);
  StartAll("a");
  Exited("a", id, 1, 0, 1);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_PENDING) << "rank 1 still holds its slot";
  Exited("a", id, 1, 1, -1, true, 15);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).attempt(), 2);
}

TEST_F(JobManagerTest, StaleAttemptMessagesAreDroppedAndStopped) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1, 1);
  auto old = StartAll("a");
  Exited("a", id, 1, 0, 1);
  Exited("a", id, 1, 1, -1, true);
  ASSERT_EQ(Get(id).attempt(), 2);
  EXPECT_EQ(workers_.TakeStops("a").size(), 1u);
  // A late report about attempt 1 changes nothing and orders the process stopped (again, once
  // the previous order is older than stop_resend).
  Started("a", old[0]);
  EXPECT_TRUE(workers_.TakeStops("a").empty());
  clock_.Advance(milliseconds(1001));
  Started("a", old[0]);
  auto stops = workers_.TakeStops("a");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].attempt(), 1);
  EXPECT_EQ(stops[0].reason(), v1::STOP_REASON_SUPERSEDED);
  EXPECT_EQ(Get(id).ranks(0).state(), v1::RANK_STATE_ASSIGNED);
  // A heartbeat listing an attempt-1 rank counts it as holding a slot, and stops it.
  Heartbeat("a", {old[0]});
  EXPECT_EQ(jobs_->SlotsInUse().at("a"), 3);
  EXPECT_EQ(store_.Set(id, 1, "k", "v").code(), StatusCode::kAborted);
  EXPECT_TRUE(store_.Set(id, 2, "k", "v").ok());
}

TEST_F(JobManagerTest, CancelStopsRanksAndIsFinal) {
  workers_.Add("a", 2);
  const std::string running = Submit(1, 2, 1, 1);
  const std::string pending = Submit(1, 2, 1, 1);
  StartAll("a");
  v1::CancelJobRequest req;
  req.set_job_id(running);
  req.mutable_grace_period()->set_seconds(3);
  auto job = jobs_->Cancel(req);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job->message(), "cancelled by the user");
  auto stops = workers_.TakeStops("a");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].reason(), v1::STOP_REASON_CANCELLED);
  EXPECT_EQ(stops[0].grace_period().seconds(), 3);
  EXPECT_EQ(jobs_->Cancel(req).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get(pending).state(), v1::JOB_STATE_PENDING) << "slots are held until ranks exit";
  Exited("a", running, 1, 0, -1, true, 15);
  Exited("a", running, 1, 1, -1, true, 15);
  EXPECT_EQ(Get(running).ranks(1).state(), v1::RANK_STATE_STOPPED);
  EXPECT_EQ(Get(running).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(pending).state(), v1::JOB_STATE_RUNNING);
  req.set_job_id(pending);
  req.set_reason("enough");
  EXPECT_EQ(jobs_->Cancel(req)->message(), "enough");
  req.set_job_id("job-999999");
  EXPECT_EQ(jobs_->Cancel(req).status().code(), StatusCode::kNotFound);
}

TEST_F(JobManagerTest, LostWorkerFailsTheAttemptAndItRestartsElsewhere) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = Submit(1, 2, 1, 1, 1);
  const std::string on = Get(id).ranks(0).worker_id();
  const std::string other = on == "a" ? "b" : "a";
  StartAll(on);
  workers_.Remove(on);
  jobs_->OnWorkerLost(on);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.ranks(0).worker_id(), other);
  EXPECT_EQ(job.restarts(), 1);
}

TEST_F(JobManagerTest, RankMissingFromTwoReportsIsLost) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);
  auto as = StartAll("a");
  Heartbeat("a", as);
  Heartbeat("a", {as[0]});
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "one miss is tolerated";
  Heartbeat("a", {as[0]});
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.ranks(1).state(), v1::RANK_STATE_LOST);
  EXPECT_NE(job.message().find("rank 1 is no longer running"), std::string::npos) << job.message();
}

TEST_F(JobManagerTest, FreshAssignmentsAreNotMissed) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);
  Heartbeat("a", {});
  Heartbeat("a", {});
  Heartbeat("a", {});
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, StateSurvivesAReopen) {
  workers_.Add("a", 4);
  const std::string done = Submit(1, 1, 1, 1);
  StartAll("a");
  Exited("a", done, 1, 0, 0);
  const std::string running = Submit(1, 2, 1, 1, 1);
  auto as = StartAll("a");
  const std::string pending = Submit(1, 4, 1, 1);
  const uint64_t last_seq = Get(running).last_event_sequence();

  Open();  // a coordinator restart on the same database
  EXPECT_EQ(Get(done).state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(Get(done).ranks_size(), 1);
  EXPECT_EQ(Get(done).ranks(0).state(), v1::RANK_STATE_SUCCEEDED);
  v1::Job job = Get(running);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  ASSERT_EQ(job.ranks_size(), 2);
  EXPECT_EQ(job.ranks(1).pid(), 1001);
  EXPECT_TRUE(store_.HasAttempt(running, 1)) << "a fresh key space for the running attempt";
  EXPECT_EQ(Get(pending).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(jobs_->SlotsInUse().at("a"), 2);
  // The worker reconnects and reports both ranks: the attempt continues and can succeed.
  Heartbeat("a", as);
  Heartbeat("a", as);
  Heartbeat("a", as);
  EXPECT_EQ(Get(running).state(), v1::JOB_STATE_RUNNING);
  Exited("a", running, 1, 0, 0);
  Exited("a", running, 1, 1, 0);
  EXPECT_EQ(Get(running).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(Get(running).last_event_sequence(), last_seq);
  // New ids continue after the old ones.
  EXPECT_GT(Submit(1, 1, 1, 1), pending);
}

// A checkpoint barrier that straddles a coordinator restart: rank 0 set its key before, rank 1
// sets its own after; both keys are there, so the barrier completes and the attempt goes on
// (no restart, attempt 1 succeeds).
TEST_F(JobManagerTest, StoreKeysOfARunningAttemptSurviveAReopen) {
  persist_store_ = true;
  Open();
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1, 1);
  auto as = StartAll("a");
  ASSERT_TRUE(persistent_store_->Set(id, 1, "checkpoint/4/written/0", "1").ok());
  Open();  // kill -9 and start again on the same database
  ASSERT_TRUE(persistent_store_->Set(id, 1, "checkpoint/4/written/1", "1").ok());
  for (const char* key : {"checkpoint/4/written/0", "checkpoint/4/written/1"}) {
    bool called = false;
    std::string value;
    persistent_store_->Get(id, 1, key, /*wait=*/false, milliseconds(0), std::nullopt,
                           [&](StatusOr<std::optional<std::string>> v) {
                             called = true;
                             if (v.ok() && v->has_value()) value = **v;
                           });
    EXPECT_TRUE(called);
    EXPECT_EQ(value, "1") << key;
  }
  Heartbeat("a", as);
  Heartbeat("a", as);
  Exited("a", id, 1, 0, 0);
  Exited("a", id, 1, 1, 0);
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.message();
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(JobManagerTest, RestoredRanksThatNoWorkerReportsFailTheAttempt) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1, 1);
  StartAll("a");
  Open();
  Heartbeat("a", {});  // the worker came back without its ranks (it restarted)
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  Heartbeat("a", {});
  v1::Job job = Get(id);
  EXPECT_EQ(job.attempt(), 2) << job.message();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, RestoredRanksOnAVanishedWorkerAreLost) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);
  StartAll("a");
  workers_.Remove("a");
  Open();
  jobs_->Tick();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobManagerTest, WatchReplaysResumesAndEndsWithTheJob) {
  workers_.Add("a", 1);
  const std::string id = Submit(1, 1, 1, 1);
  auto as = StartAll("a");
  v1::LogBatch logs;
  v1::LogLine* line = logs.add_lines();
  line->set_job_id(id);
  line->set_attempt(1);
  line->set_rank(0);
  line->set_text("hello");
  jobs_->OnLogs("a", logs);

  auto all = std::make_shared<FakeWatchStream>();
  v1::WatchJobRequest req;
  req.set_job_id(id);
  ASSERT_TRUE(jobs_->Watch(req, all).ok());
  auto events = all->events();
  ASSERT_GE(events.size(), 5u);  // PENDING, ASSIGNED, RUNNING, rank RUNNING, log
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].sequence(), events[i - 1].sequence());
  }
  EXPECT_EQ(events.front().sequence(), 1u);
  EXPECT_EQ(events.front().state_changed().state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(events.back().log().text(), "hello");
  EXPECT_FALSE(all->finished().has_value());

  auto no_logs = std::make_shared<FakeWatchStream>();
  req.set_skip_logs(true);
  req.set_from_sequence(events[2].sequence());
  ASSERT_TRUE(jobs_->Watch(req, no_logs).ok());
  ASSERT_EQ(no_logs->events().size(), events.size() - 3);
  EXPECT_EQ(no_logs->events()[0].sequence(), events[2].sequence());

  Exited("a", id, 1, 0, 0);
  ASSERT_TRUE(all->finished().has_value());
  EXPECT_TRUE(all->finished()->ok());
  EXPECT_EQ(all->events().back().state_changed().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(no_logs->finished().has_value());

  // After a restart the durable events replay from the database; logs were in memory only.
  Open();
  auto replay = std::make_shared<FakeWatchStream>();
  req.set_skip_logs(false);
  req.set_from_sequence(0);
  ASSERT_TRUE(jobs_->Watch(req, replay).ok());
  ASSERT_TRUE(replay->finished().has_value()) << "a finished job's watch ends after the replay";
  EXPECT_EQ(replay->events().size(), all->events().size() - 1);
  EXPECT_EQ(replay->events().back().state_changed().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobManagerTest, WatchErrors) {
  auto s = std::make_shared<FakeWatchStream>();
  v1::WatchJobRequest req;
  EXPECT_EQ(jobs_->Watch(req, s).code(), StatusCode::kInvalidArgument);
  req.set_job_id("job-404");
  EXPECT_EQ(jobs_->Watch(req, s).code(), StatusCode::kNotFound);
}

TEST_F(JobManagerTest, JobLevelMetricsFromEveryRank) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);  // global_batch 16 × seq_len 64
  StartAll("a");
  auto watch = std::make_shared<FakeWatchStream>();
  v1::WatchJobRequest req;
  req.set_job_id(id);
  req.set_from_sequence(Get(id).last_event_sequence() + 1);
  ASSERT_TRUE(jobs_->Watch(req, watch).ok());
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankMetrics m;
    v1::MetricsSample* s = m.mutable_sample();
    s->set_job_id(id);
    s->set_attempt(1);
    s->set_rank(rank);
    s->set_step(1);
    s->set_loss(5.5);
    s->set_step_seconds(rank == 0 ? 0.5 : 1.0);
    s->set_mfu(rank == 0 ? 0.2 : 0.4);
    s->set_tflops(rank == 0 ? 2.0 : 1.0);  // the job's FLOP/s as each rank's step time gives it
    jobs_->OnRankMetrics("a", m);
    if (rank == 0) {
      EXPECT_EQ(Get(id).step(), 0) << "a step counts once every rank reported it";
    }
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.step(), 1);
  EXPECT_DOUBLE_EQ(job.loss(), 5.5);
  EXPECT_DOUBLE_EQ(job.tokens_per_second(), 16 * 64 / 1.0);
  EXPECT_DOUBLE_EQ(job.mfu(), 0.3);
  auto events = watch->events();
  ASSERT_EQ(events.size(), 1u) << "rank samples only with rank_metrics";
  EXPECT_FALSE(events[0].metrics().has_rank());
  EXPECT_DOUBLE_EQ(events[0].metrics().tflops(), 1.0) << "the slowest rank's, not a sum";
  EXPECT_DOUBLE_EQ(events[0].metrics().step_seconds(), 1.0);
  auto snap = jobs_->Snapshot();
  ASSERT_EQ(snap.jobs.size(), 1u);
  // Slowest recent step time over the median of the two ranks': 1.0 / 0.75.
  EXPECT_DOUBLE_EQ(snap.jobs[0].step_time_skew, 1.0 / 0.75);
}

TEST_F(JobManagerTest, LogsTailAndFilter) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);
  v1::LogBatch logs;
  for (int i = 0; i < 10; ++i) {
    v1::LogLine* line = logs.add_lines();
    line->set_job_id(id);
    line->set_attempt(1);
    line->set_rank(i % 2);
    line->set_text("line " + std::to_string(i));
  }
  jobs_->OnLogs("a", logs);
  v1::GetJobLogsRequest req;
  req.set_job_id(id);
  req.set_rank(1);
  req.set_tail_lines(2);
  auto out = jobs_->Logs(req);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->lines_size(), 2);
  EXPECT_EQ(out->lines(0).text(), "line 7");
  EXPECT_EQ(out->lines(1).text(), "line 9");
  EXPECT_FALSE(out->truncated());
  req.set_tail_lines(-1);
  EXPECT_EQ(jobs_->Logs(req).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, LogsSurviveACoordinatorRestart) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);
  v1::LogBatch logs;
  for (int i = 0; i < 6; ++i) {
    v1::LogLine* line = logs.add_lines();
    line->set_job_id(id);
    line->set_attempt(1);
    line->set_rank(i % 2);
    line->set_text("line " + std::to_string(i));
  }
  jobs_->OnLogs("a", logs);
  Open();  // a new JobManager on the same StateDb file: nothing of the old one in memory
  v1::GetJobLogsRequest req;
  req.set_job_id(id);
  auto all = jobs_->Logs(req);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->lines_size(), 6);
  EXPECT_EQ(all->lines(0).text(), "line 0");
  EXPECT_EQ(all->lines(5).text(), "line 5");
  req.set_rank(0);
  req.set_tail_lines(2);
  auto tail = jobs_->Logs(req);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->lines_size(), 2);
  EXPECT_EQ(tail->lines(0).text(), "line 2");
  EXPECT_EQ(tail->lines(1).text(), "line 4");
}

TEST_F(JobManagerTest, OnlyTheNewestFinishedJobsKeepTheirEventsInMemory) {
  // Every job runs on worker "a" (log lines count only from the worker its rank runs on),
  // logs one line and succeeds.
  workers_.Add("a", 1);
  std::vector<std::string> ids;
  const size_t n = JobManager::kFinishedJobsWithEvents + 2;
  for (size_t i = 0; i < n; ++i) {
    ids.push_back(Submit(1, 1, 1, 1));
    StartAll("a");
    v1::LogBatch logs;
    v1::LogLine* line = logs.add_lines();
    line->set_job_id(ids.back());
    line->set_attempt(1);
    line->set_rank(0);
    line->set_text("line of " + ids.back());
    jobs_->OnLogs("a", logs);
    Exited("a", ids.back(), 1, 0, 0);
  }
  auto logs_of = [&](const std::string& id) {
    v1::GetJobLogsRequest req;
    req.set_job_id(id);
    return jobs_->Logs(req).value();
  };
  auto watch_of = [&](const std::string& id) {
    auto stream = std::make_shared<FakeWatchStream>();
    v1::WatchJobRequest req;
    req.set_job_id(id);
    EXPECT_TRUE(jobs_->Watch(req, stream).ok());
    return stream->events();
  };
  // The two oldest released their events from memory: their log lines and durable events
  // come back from the database.
  for (size_t i = 0; i < 2; ++i) {
    const v1::GetJobLogsResponse logs = logs_of(ids[i]);
    ASSERT_EQ(logs.lines_size(), 1) << ids[i];
    EXPECT_EQ(logs.lines(0).text(), "line of " + ids[i]);
    EXPECT_FALSE(logs.truncated()) << ids[i];
    const auto events = watch_of(ids[i]);
    ASSERT_FALSE(events.empty()) << ids[i];
    EXPECT_EQ(events.front().state_changed().state(), v1::JOB_STATE_PENDING);
    EXPECT_EQ(events.back().state_changed().state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(Get(ids[i]).state(), v1::JOB_STATE_SUCCEEDED);
  }
  // The newest kFinishedJobsWithEvents keep theirs.
  for (size_t i = 2; i < n; ++i) {
    const v1::GetJobLogsResponse logs = logs_of(ids[i]);
    ASSERT_EQ(logs.lines_size(), 1) << ids[i];
    EXPECT_EQ(logs.lines(0).text(), "line of " + ids[i]);
    EXPECT_FALSE(logs.truncated());
    const auto events = watch_of(ids[i]);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().state_changed().state(), v1::JOB_STATE_SUCCEEDED);
  }
}

TEST_F(JobManagerTest, CheckpointIsPassedToTheNextAttempt) {
  workers_.Add("a", 1);
  v1::SubmitJobRequest req = SubmitRequest(1, 1, 1, 1, 1);
  req.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  const std::string id = *jobs_->Submit(req);
  auto first = StartAll("a");
  EXPECT_EQ(first[0].resume_checkpoint(), "");
  v1::CheckpointSaved saved;
  saved.set_job_id(id);
  saved.set_attempt(1);
  saved.set_step(2);
  saved.set_path("/ckpt/step-00000002");
  jobs_->OnCheckpointSaved("a", saved);
  EXPECT_EQ(Get(id).last_checkpoint(), "/ckpt/step-00000002");
  Exited("a", id, 1, 0, 1);
  auto second = workers_.TakeAssignments("a");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].attempt(), 2);
  EXPECT_EQ(second[0].resume_checkpoint(), "/ckpt/step-00000002");
}

// The resume checkpoint is decided once per job from what Submit found under checkpoint.dir
// (outside the lock), then moved on by CheckpointSaved; placing an attempt reads no folder.
TEST_F(JobManagerTest, ResumeIsDecidedFromWhatSubmitFoundWithoutScansAtPlacement) {
  found_checkpoint_ = "/ckpt/step-00000005";
  workers_.Add("a", 1);
  v1::SubmitJobRequest req = SubmitRequest(1, 1, 1, 1, 1);
  req.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  const std::string id = *jobs_->Submit(req);
  EXPECT_EQ(find_calls_, 1);
  auto first = StartAll("a");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].resume_checkpoint(), "/ckpt/step-00000005");
  Exited("a", id, 1, 0, 1);
  auto second = workers_.TakeAssignments("a");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].resume_checkpoint(), "/ckpt/step-00000005");
  EXPECT_EQ(find_calls_, 1) << "placing an attempt must not scan checkpoint.dir";

  // checkpoint.resume: never asks nothing and resumes from nothing.
  v1::SubmitJobRequest never = SubmitRequest(1, 1, 1, 1, 0);
  never.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  never.mutable_spec()->mutable_checkpoint()->set_resume("never");
  ASSERT_TRUE(jobs_->Submit(never).ok());
  EXPECT_EQ(find_calls_, 1);
}

TEST_F(JobManagerTest, ListJobsNewestFirstWithPages) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Submit(1, 1, 1, 1));
  v1::ListJobsRequest req;
  req.set_page_size(2);
  auto page = jobs_->List(req);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs_size(), 2);
  EXPECT_EQ(page->jobs(0).job_id(), ids[4]);
  EXPECT_FALSE(page->jobs(0).has_spec()) << "ListJobs leaves the spec out";
  std::vector<std::string> seen;
  while (true) {
    for (const auto& j : page->jobs()) seen.push_back(j.job_id());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
    page = jobs_->List(req);
    ASSERT_TRUE(page.ok());
  }
  EXPECT_EQ(seen, std::vector<std::string>(ids.rbegin(), ids.rend()));
  req.set_page_token("garbage");
  EXPECT_EQ(jobs_->List(req).status().code(), StatusCode::kInvalidArgument);
  v1::ListJobsRequest running;
  running.add_states(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->List(running)->jobs_size(), 0);
}

// ---- Attacks of a compromised worker, and the restart policy's bounds ----

TEST_F(JobManagerTest, LogLinesCountOnlyFromTheWorkerTheRankRunsOn) {
  workers_.Add("a", 1);
  workers_.Add("b", 1);
  const std::string id = Submit(1, 1, 1, 1);
  const std::string owner = Get(id).ranks(0).worker_id();
  const std::string other = owner == "a" ? "b" : "a";
  StartAll(owner);
  auto batch = [&](int attempt, int rank, const std::string& text, int n) {
    v1::LogBatch logs;
    for (int i = 0; i < n; ++i) {
      v1::LogLine* line = logs.add_lines();
      line->set_job_id(id);
      line->set_attempt(attempt);
      line->set_rank(rank);
      line->set_text(text);
    }
    return logs;
  };
  jobs_->OnLogs(owner, batch(1, 0, "real", 1));
  // Another worker, an attempt never run, a rank the attempt does not have: all dropped, even
  // in numbers that would push the real line out of the 10,000 kept.
  jobs_->OnLogs(other, batch(1, 0, "forged", 11000));
  jobs_->OnLogs(other, batch(77, 0, "forged", 11000));
  jobs_->OnLogs(owner, batch(77, 0, "forged", 5));
  jobs_->OnLogs(owner, batch(1, 5, "forged", 5));
  v1::GetJobLogsRequest req;
  req.set_job_id(id);
  auto out = jobs_->Logs(req);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->lines_size(), 1);
  EXPECT_EQ(out->lines(0).text(), "real");
  EXPECT_FALSE(out->truncated());
  // Nor may another worker record a checkpoint for the attempt.
  v1::CheckpointSaved saved;
  saved.set_job_id(id);
  saved.set_attempt(1);
  saved.set_step(9);
  saved.set_path("/elsewhere/step-00000009");
  jobs_->OnCheckpointSaved(other, saved);
  EXPECT_EQ(Get(id).last_checkpoint(), "");
}

TEST_F(JobManagerTest, RestartsBackOffExponentially) {
  restart_backoff_ = milliseconds(1000);
  Open();
  workers_.Add("a", 1);
  const std::string id = Submit(1, 1, 1, 1, /*max_restarts=*/3);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    ASSERT_EQ(Get(id).attempt(), attempt);
    StartAll("a");
    Exited("a", id, attempt, 0, 1);
    const milliseconds wait = milliseconds(1000) * (1 << (attempt - 1));  // 1 s, 2 s, 4 s
    v1::Job job = Get(id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
    EXPECT_NE(job.message().find("after a backoff of"), std::string::npos) << job.message();
    // The slot is free, but the restart waits out its backoff.
    clock_.Advance(wait - milliseconds(1));
    jobs_->Tick();
    EXPECT_EQ(Get(id).state(), v1::JOB_STATE_PENDING);
    EXPECT_NE(Get(id).message().find("waiting out the restart backoff"), std::string::npos)
        << Get(id).message();
    EXPECT_TRUE(workers_.TakeAssignments("a").empty());
    clock_.Advance(milliseconds(1));
    jobs_->Tick();
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  }
}

TEST_F(JobManagerTest, BackingOffJobDoesNotHoldUpTheQueue) {
  restart_backoff_ = milliseconds(60000);
  Open();
  workers_.Add("a", 1);
  const std::string failing = Submit(1, 1, 1, 1, /*max_restarts=*/1);
  StartAll("a");
  const std::string next = Submit(1, 1, 1, 1);
  Exited("a", failing, 1, 0, 1);
  EXPECT_EQ(Get(failing).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(next).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, StopOrdersForMadeUpAttemptsAreBoundedPerWorker) {
  max_stops_per_worker_ = 8;
  Open();
  workers_.Add("a", 2);
  auto fake = [](int first, int n) {
    google::protobuf::RepeatedPtrField<v1::RunningRank> list;
    for (int i = 0; i < n; ++i) {
      v1::RunningRank* r = list.Add();
      r->set_job_id("job-fake-" + std::to_string(first + i));
      r->set_attempt(1);
      r->set_rank(0);
    }
    return list;
  };
  EXPECT_TRUE(jobs_->OnRunning("a", fake(0, 6)).ok());
  EXPECT_EQ(workers_.TakeStops("a").size(), 6u);
  // The same ones again add nothing; 3 more would pass 8.
  EXPECT_TRUE(jobs_->OnRunning("a", fake(0, 6)).ok());
  Status over = jobs_->OnRunning("a", fake(6, 3));
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message().rfind("--max-stops-per-worker: ", 0), 0u) << over.message();
  EXPECT_TRUE(workers_.TakeStops("a").empty());
  // Old entries expire (10 × stop_resend): room again.
  clock_.Advance(milliseconds(10001));
  jobs_->Tick();
  EXPECT_TRUE(jobs_->OnRunning("a", fake(6, 3)).ok());
}

}  // namespace
}  // namespace meshrun::coordinator
