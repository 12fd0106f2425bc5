// JobManager (tests/coordinator/job_manager_fixture.h: fakes, no sockets, a real SQLite file).
// Attempts: restarts with new attempt numbers and their backoff, stale attempts, cancel, lost
// workers, missed reports, stop orders, and the checkpoint the next attempt resumes from.
#include <gtest/gtest.h>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeWatchStream;
using testing::SubmitRequest;

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

TEST_F(JobManagerTest, CheckpointsAreRecordedNotDecided) {
  workers_.Add("a", 1);
  v1::SubmitJobRequest req = SubmitRequest(1, 1, 1, 1, 1);
  req.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  const std::string id = *jobs_->Submit(req);
  auto first = StartAll("a");
  ASSERT_EQ(first.size(), 1u);
  // Rank 0 chose where to resume (decision 0048) and says so: the coordinator records it.
  CheckpointSaved("a", id, 1, 5, "/ckpt/step-00000005", /*resumed=*/true);
  EXPECT_EQ(Get(id).last_checkpoint(), "/ckpt/step-00000005");
  CheckpointSaved("a", id, 1, 6, "/ckpt/step-00000006");
  EXPECT_EQ(Get(id).last_checkpoint(), "/ckpt/step-00000006");
  Exited("a", id, 1, 0, 1);
  auto second = workers_.TakeAssignments("a");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].attempt(), 2);
}

// Decision 0048: every assignment carries the spec exactly as the coordinator stored it, the
// same bytes for every rank and attempt (what the worker forwards to the rank unchanged).
TEST_F(JobManagerTest, AssignmentsCarryTheStoredSpecByteForByte) {
  workers_.Add("a", 2);
  v1::SubmitJobRequest req = SubmitRequest(1, 2, 1, 1, 1);
  req.mutable_spec()->mutable_model()->set_init_from("/models/tiny");
  req.mutable_spec()->mutable_model()->clear_d_model();
  req.mutable_spec()->mutable_model()->clear_n_head();
  req.mutable_spec()->mutable_model()->clear_arch();
  req.mutable_spec()->mutable_model()->clear_tie_embeddings();
  req.mutable_spec()->mutable_train()->clear_lr();
  req.mutable_spec()->set_source_yaml("name: bytes\n");
  const std::string id = *jobs_->Submit(req);
  StatusOr<std::vector<JobRow>> rows = db_->LoadJobs();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  const std::string stored = (*rows)[0].spec;
  auto first = StartAll("a");
  ASSERT_EQ(first.size(), 2u);
  for (const v1::RankAssignment& a : first) EXPECT_EQ(a.spec().SerializeAsString(), stored);
  // The model fields left out under init_from stay unset: the ranks read them from config.json
  // (arch too: a Llama folder must not meet a stored default of gpt2).
  EXPECT_FALSE(first[0].spec().model().has_d_model());
  EXPECT_FALSE(first[0].spec().model().has_n_head());
  EXPECT_FALSE(first[0].spec().model().has_arch());
  EXPECT_FALSE(first[0].spec().model().has_tie_embeddings());
  EXPECT_TRUE(first[0].spec().train().has_lr()) << "the defaults are filled in";
  Exited("a", id, 1, 0, 1);
  Exited("a", id, 1, 1, 0, /*stopped=*/true);
  auto second = workers_.TakeAssignments("a");
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(second[0].spec().SerializeAsString(), stored);
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
