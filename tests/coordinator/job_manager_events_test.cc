// JobManager (tests/coordinator/job_manager_fixture.h: fakes, no sockets, a real SQLite file).
// Events: WatchJob replay and errors, job-level metrics from the ranks' samples, log lines (tail,
// filter, which worker may send them), and which finished jobs keep their events in memory.
#include <gtest/gtest.h>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeWatchStream;
using testing::SubmitRequest;

TEST_F(JobManagerTest, WatchReplaysResumesAndEndsWithTheJob) {
  workers_.Add("a", 1);
  const std::string id = Submit(1, 1, 1, 1);
  auto as = StartAll("a");
  jobs_->OnLogs("a", Lines(id, 1, 0, 1, "hello"));

  auto all = std::make_shared<FakeWatchStream>();
  v1::WatchJobRequest req;
  req.set_job_id(id);
  ASSERT_TRUE(jobs_->Watch(req, all).ok());
  auto events = all->events();
  // PENDING, RUNNING, rank RUNNING, log (a placement sends no event per rank, decision 0049)
  ASSERT_GE(events.size(), 4u);
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
    s->set_mfu(rank == 0 ? 0.4 : 0.2);     // the job's MFU by each rank's own step time
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
  EXPECT_DOUBLE_EQ(job.mfu(), 0.2) << "the MFU of the job's tokens/s (slowest rank), not the mean";
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
  jobs_->OnLogs("a", Lines(id, 1, 0, 10, "", /*ranks=*/2));
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

TEST_F(JobManagerTest, OnlyTheNewestFinishedJobsKeepTheirEventsInMemory) {
  // Every job runs on worker "a" (log lines count only from the worker its rank runs on),
  // logs one line and succeeds.
  workers_.Add("a", 1);
  std::vector<std::string> ids;
  const size_t n = JobManager::kFinishedJobsWithEvents + 2;
  for (size_t i = 0; i < n; ++i) {
    ids.push_back(Submit(1, 1, 1, 1));
    StartAll("a");
    jobs_->OnLogs("a", Lines(ids.back(), 1, 0, 1, "line of " + ids.back()));
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

TEST_F(JobManagerTest, LogLinesCountOnlyFromTheWorkerTheRankRunsOn) {
  workers_.Add("a", 1);
  workers_.Add("b", 1);
  const std::string id = Submit(1, 1, 1, 1);
  const std::string owner = Get(id).ranks(0).worker_id();
  const std::string other = owner == "a" ? "b" : "a";
  StartAll(owner);
  auto batch = [&](int attempt, int rank, const std::string& text, int n) {
    return Lines(id, attempt, rank, n, text);
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
  CheckpointSaved(other, id, 1, 9, "/elsewhere/step-00000009");
  EXPECT_EQ(Get(id).last_checkpoint(), "");
}

}  // namespace
}  // namespace meshrun::coordinator
