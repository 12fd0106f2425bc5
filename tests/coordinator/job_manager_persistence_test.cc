// JobManager (tests/coordinator/job_manager_fixture.h: fakes, no sockets, a real SQLite file).
// Persistence: jobs, running attempts, their store keys and log lines across a re-open of the same
// database.
#include <gtest/gtest.h>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeWatchStream;
using testing::SubmitRequest;

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

TEST_F(JobManagerTest, LogsSurviveACoordinatorRestart) {
  workers_.Add("a", 2);
  const std::string id = Submit(1, 2, 1, 1);
  jobs_->OnLogs("a", Lines(id, 1, 0, 6, "", /*ranks=*/2));
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

}  // namespace
}  // namespace meshrun::coordinator
