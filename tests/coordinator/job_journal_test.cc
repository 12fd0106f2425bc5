// JobJournal over a real SQLite file, without JobManager: event sequences and their
// reservation, commits that persist before they publish, what only the database answers after
// the memory tier is gone, and the record <-> row conversions.
#include "coordinator/job_journal.h"

#include <gtest/gtest.h>

#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"

namespace meshrun::coordinator {
namespace {

class JobJournalTest : public ::testing::Test {
 protected:
  JobJournalTest() : db_(StateDb::Open(dir_.path()).value()) {}

  std::unique_ptr<JobRecord> NewJob(EventLimits limits = {}) {
    JobRow row;
    row.job_id = "job-000001";
    row.seq = 1;
    return std::make_unique<JobRecord>(row, testing::SpecProto(1, 1, 1, 1),
                                       ParallelDims::Create(1, 1, 1, 1).value(), limits);
  }
  void AddLog(JobJournal& journal, JobTxn& txn, int rank, const std::string& text) {
    v1::LogLine* line = journal.AddEvent(txn)->mutable_log();
    line->set_job_id(txn.job.row.job_id);
    line->set_attempt(1);
    line->set_rank(rank);
    line->set_text(text);
  }

  testing::TempDir dir_;
  testing::FakeClock clock_;
  std::unique_ptr<StateDb> db_;
};

TEST_F(JobJournalTest, SequencesPastTheReservationRewriteTheRow) {
  // Events are stamped at Commit (under the log's mutex, decision 0049).
  JobJournal journal(db_.get(), clock_, EventLimits{});
  auto job = NewJob();
  JobTxn txn(*job);
  journal.AddEvent(txn);
  ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  EXPECT_EQ(job->events.last_sequence(), 1u);
  EXPECT_EQ(job->row.seq_reserved, 1 + JobJournal::kSequenceBlock);
  EXPECT_FALSE(txn.job_dirty);
  v1::JobEvent next;
  EXPECT_FALSE(JobJournal::StampReserving(job->events, &next, clock_.Now()))
      << "inside the reservation";
  EXPECT_EQ(next.sequence(), 2u);
}

TEST_F(JobJournalTest, CommitPersistsDurableEventsThenPublishesAndFinishes) {
  JobJournal journal(db_.get(), clock_, EventLimits{});
  auto job = NewJob();
  auto watch = std::make_shared<testing::FakeWatchStream>();
  job->events.AddWatcher(watch, WatchFilter{});
  JobTxn txn(*job);
  AddLog(journal, txn, 0, "hello");
  journal.AddEvent(txn)->mutable_state_changed()->set_state(v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  EXPECT_EQ(watch->events().size(), 2u);
  EXPECT_TRUE(watch->finished()) << "the stream of a finished job ends with it";
  auto jobs = db_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  // Durable events come back for WatchJob without the log lines.
  std::vector<v1::JobEvent> stored = journal.StoredEvents(job->row.job_id, 1, 100);
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_TRUE(stored[0].has_state_changed());
  EXPECT_TRUE(journal.StoredEvents(job->row.job_id, 5, 5).empty());
}

TEST_F(JobJournalTest, StoredLogsFilterTailAndTruncation) {
  EventLimits limits;
  limits.logs = 3;
  JobJournal journal(db_.get(), clock_, limits);
  auto job = NewJob(limits);
  JobTxn txn(*job);
  for (int i = 0; i < 4; ++i) AddLog(journal, txn, i % 2, "line " + std::to_string(i));
  ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  EXPECT_EQ(job->persisted_logs, 3u) << "at most EventLimits::logs per job";
  v1::GetJobLogsRequest all;
  all.set_job_id(job->row.job_id);
  std::optional<v1::GetJobLogsResponse> logs = journal.StoredLogs(*job, all);
  ASSERT_TRUE(logs);
  ASSERT_EQ(logs->lines_size(), 3);
  EXPECT_EQ(logs->lines(2).text(), "line 2");
  EXPECT_TRUE(logs->truncated());
  v1::GetJobLogsRequest rank1 = all;
  rank1.set_rank(1);
  rank1.set_tail_lines(1);
  logs = journal.StoredLogs(*job, rank1);
  ASSERT_TRUE(logs);
  ASSERT_EQ(logs->lines_size(), 1);
  EXPECT_EQ(logs->lines(0).text(), "line 1");
  v1::GetJobLogsRequest other = all;
  other.set_attempt(2);
  EXPECT_FALSE(journal.StoredLogs(*job, other)) << "nothing stored for attempt 2";
}

TEST_F(JobJournalTest, WithoutADatabaseCommitsOnlyPublish) {
  JobJournal journal(nullptr, clock_, EventLimits{});
  auto job = NewJob();
  JobTxn txn(*job);
  AddLog(journal, txn, 0, "x");
  ASSERT_TRUE(journal.Commit(txn, Durability::kDurable).ok());
  EXPECT_TRUE(journal.StoredEvents(job->row.job_id, 1, 10).empty());
  EXPECT_FALSE(journal.StoredLogs(*job, v1::GetJobLogsRequest{}));
  journal.WriteJobRow(job->row);  // no database: nothing to do
  EXPECT_TRUE(journal.LoadRanks(job->row.job_id, 1)->empty());
}

TEST_F(JobJournalTest, RanksRoundTripThroughTheirRows) {
  JobJournal journal(db_.get(), clock_, EventLimits{});
  auto job = NewJob();
  AttemptRecord attempt;
  attempt.number = 2;
  attempt.state = AttemptState::kFailed;
  attempt.reason = "boom";
  RankRecord r;
  r.rank = 1;
  r.coords = {0, 1, 0, 1};
  r.worker_id = "id-a";
  r.worker_name = "a";
  r.local_rank = 1;
  r.local_world_size = 2;
  r.state = v1::RANK_STATE_FAILED;
  r.pid = 42;
  r.exit_code = 3;
  r.error = "bad";
  JobTxn txn(*job);
  txn.job_dirty = true;
  txn.batch.attempts.push_back(ToAttemptRow(*job, attempt));
  txn.batch.ranks.push_back(ToRankRow(*job, attempt, r));
  ASSERT_TRUE(journal.Commit(txn, Durability::kDurable).ok());
  auto ranks = journal.LoadRanks(job->row.job_id, 2);
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 1u);
  const RankRecord& back = (*ranks)[0];
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.coords, r.coords);
  EXPECT_EQ(back.worker_name, "a");
  EXPECT_EQ(back.state, v1::RANK_STATE_FAILED);
  EXPECT_EQ(back.exit_code, 3);
  EXPECT_EQ(back.error, "bad");
  v1::RankInfo info;
  FillRankInfo(back, *ParallelDims::Create(1, 1, 1, 2), &info);
  EXPECT_EQ(info.coords().tp(), 1);
  EXPECT_EQ(info.pid(), 42);
  auto attempts = db_->LoadAttempts(job->row.job_id);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 1u);
  EXPECT_EQ((*attempts)[0].state, static_cast<int>(AttemptState::kFailed));
  EXPECT_EQ((*attempts)[0].reason, "boom");
}

}  // namespace
}  // namespace meshrun::coordinator
