// StateDb: every table round-trips across a close and re-open, batches are atomic, and a
// database of another schema version is refused.
#include "coordinator/state_db.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include "tests/coordinator/test_util.h"

namespace meshrun::coordinator {
namespace {

TEST(StateDbTest, RowsSurviveReopen) {
  testing::TempDir dir;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    WriteBatch b;
    JobRow j;
    j.job_id = "job-000001";
    j.seq = 1;
    j.name = "n";
    j.state = 2;
    j.spec = std::string("\x0a\x00\x01", 3);  // binary-safe
    j.request_id = "req";
    j.attempt = 2;
    j.restarts = 1;
    j.message = "m";
    j.submitted_ms = 123;
    j.world_size = 4;
    j.step = 9;
    j.loss = 1.5;
    j.last_checkpoint = "/c/step-00000009";
    j.seq_reserved = 4096;
    b.jobs.push_back(j);
    b.attempts.push_back({"job-000001", 2, 1, 100, 0, "r", "", "", ""});
    RankRow r;
    r.job_id = "job-000001";
    r.attempt = 2;
    r.rank = 3;
    r.worker_id = "wkr-1";
    r.worker_name = "a";
    r.coords.tp = 1;
    r.state = 2;
    r.pid = 77;
    b.ranks.push_back(r);
    WorkerRow w;
    w.worker_id = "wkr-1";
    w.name = "a";
    w.session_token = "t";
    w.slots = 8;
    w.device = "cpu";
    b.workers.push_back(w);
    b.events.push_back({"job-000001", 5, "ev5"});
    b.events.push_back({"job-000001", 6, "ev6"});
    ASSERT_TRUE((*db)->Commit(b, Durability::kDurable).ok());
  }
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  auto jobs = (*db)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].spec, std::string("\x0a\x00\x01", 3));
  EXPECT_EQ((*jobs)[0].last_checkpoint, "/c/step-00000009");
  EXPECT_EQ((*jobs)[0].loss, 1.5);
  EXPECT_EQ((*jobs)[0].seq_reserved, 4096);
  auto attempts = (*db)->LoadAttempts("job-000001");
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 1u);
  EXPECT_EQ((*attempts)[0].reason, "r");
  auto ranks = (*db)->LoadRanks("job-000001", 2);
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].pid, 77);
  EXPECT_EQ((*ranks)[0].coords.tp, 1);
  auto workers = (*db)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].slots, 8);
  auto events = (*db)->LoadEvents("job-000001", 6, 100, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].event, "ev6");
}

TEST(StateDbTest, UpsertReplaces) {
  testing::TempDir dir;
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  WriteBatch b;
  JobRow j;
  j.job_id = "job-1";
  j.seq = 1;
  j.state = 1;
  b.jobs.push_back(j);
  ASSERT_TRUE((*db)->Commit(b, Durability::kFast).ok());
  b.jobs[0].state = 4;
  ASSERT_TRUE((*db)->Commit(b, Durability::kFast).ok());
  auto jobs = (*db)->LoadJobs();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state, 4);
}

TEST(StateDbTest, AWorkerNameHasOneRow) {
  testing::TempDir dir;
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok());
  WorkerRow w1, w2;
  w1.worker_id = "wkr-1";
  w1.name = "same";
  w2.worker_id = "wkr-2";
  w2.name = "same";
  WriteBatch b;
  b.workers = {w1};
  ASSERT_TRUE((*db)->Commit(b, Durability::kFast).ok());
  b.workers = {w2};
  ASSERT_TRUE((*db)->Commit(b, Durability::kFast).ok());
  auto workers = (*db)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id, "wkr-2");
}

TEST(StateDbTest, AnOlderDatabaseGainsTheCalibrationColumn) {
  testing::TempDir dir;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok());
    WorkerRow w;
    w.worker_id = "wkr-1";
    w.name = "old";
    WriteBatch b;
    b.workers = {w};
    ASSERT_TRUE((*db)->Commit(b, Durability::kDurable).ok());
  }
  // The workers table as the first coordinators wrote it, without the column.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(raw, "ALTER TABLE workers DROP COLUMN calibration", nullptr, nullptr, nullptr),
      SQLITE_OK)
      << sqlite3_errmsg(raw);
  sqlite3_close(raw);
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status().message();
  WorkerRow w;
  w.worker_id = "wkr-2";
  w.name = "new";
  w.calibration = std::string("\x09\0\0\0\0\0\0\xf0\x3f", 9);  // bytes, zeros included
  WriteBatch b;
  b.workers = {w};
  ASSERT_TRUE((*db)->Commit(b, Durability::kFast).ok());
  auto workers = (*db)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[0].name, "new");
  EXPECT_EQ((*workers)[0].calibration, w.calibration);
  EXPECT_EQ((*workers)[1].calibration, "") << "an old row reads as not measured";
}

TEST(StateDbTest, RefusesAnotherSchemaVersion) {
  testing::TempDir dir;
  { ASSERT_TRUE(StateDb::Open(dir.path()).ok()); }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "UPDATE meta SET value='99' WHERE key='schema_version'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  auto db = StateDb::Open(dir.path());
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("schema version 99"), std::string::npos);
}

TEST(StateDbTest, UnusableFolderIsFailedPrecondition) {
  auto db = StateDb::Open("/proc/self/meshrun-cannot-create-this");
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(db.status().message().rfind("--state-dir: ", 0), 0u);
}

TEST(StateDbTest, DatabaseIsCreatedOwnerOnlyAndTightenedWhenOlder) {
  // It holds worker session tokens and job specs.
  testing::TempDir dir;
  const mode_t old_umask = ::umask(022);
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
  }
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() + "/coordinator.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A database an older coordinator left 0644 is made 0600 on open.
  ASSERT_EQ(::chmod((dir.path() + "/coordinator.db").c_str(), 0644), 0);
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status().ToString();
  }
  ::umask(old_umask);
  ASSERT_EQ(::stat((dir.path() + "/coordinator.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace meshrun::coordinator
