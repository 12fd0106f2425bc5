// Byte budgets of what one job makes the coordinator keep (docs/security.md "Limits"): log
// lines cut once their text is filled in, the memory tiers bounded by bytes, GetJobLogs answers
// bounded, what StateDb keeps per job bounded, comm entries from closed label sets only, and a
// checkpoint report accepted only inside the job's checkpoint.dir. No sockets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "coordinator/coordinator_service.h"
#include "coordinator/job_journal.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics_ingest.h"
#include "coordinator/restart_policy.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"

namespace meshrun::coordinator {
namespace {

class BudgetTest : public ::testing::Test {
 protected:
  BudgetTest() : db_(StateDb::Open(dir_.path()).value()) {}

  std::unique_ptr<JobRecord> NewJob(const EventLimits& limits) {
    JobRow row;
    row.job_id = "job-000001";
    row.seq = 1;
    return std::make_unique<JobRecord>(row, testing::SpecProto(1, 1, 1, 1),
                                       ParallelDims::Create(1, 1, 1, 1).value(), limits);
  }
  // One transaction of `lines` log lines of `text`, committed.
  void Log(JobJournal& journal, JobRecord& job, const std::string& text, int lines = 1) {
    JobTxn txn(job);
    for (int i = 0; i < lines; ++i) {
      v1::LogLine* line = journal.AddEvent(txn)->mutable_log();
      line->set_job_id(job.row.job_id);
      line->set_attempt(1);
      line->set_text(text);
    }
    ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  }
  size_t StoredEventBytes(const std::string& job_id) {
    size_t bytes = 0;
    for (const EventRow& row : db_->LoadEvents(job_id, 1, INT64_MAX, 1'000'000).value()) {
      bytes += row.event.size();
    }
    return bytes;
  }

  testing::TempDir dir_;
  testing::FakeClock clock_;
  std::unique_ptr<StateDb> db_;
};

// The cut used to run when the event was stamped, before the text was filled in: 1 MB lines
// were kept whole, in memory and in StateDb.
TEST_F(BudgetTest, LogLineIsCutAfterItsTextIsFilledIn) {
  EventLimits limits;
  JobJournal journal(db_.get(), clock_, limits);
  auto job = NewJob(limits);
  Log(journal, *job, std::string(1 << 20, 'x'));
  const std::string marker = std::string(kLogCutMarker) + "1048576 bytes]";
  auto check = [&](const v1::GetJobLogsResponse& logs) {
    ASSERT_EQ(logs.lines_size(), 1);
    const std::string& text = logs.lines(0).text();
    EXPECT_EQ(text.size(), limits.max_log_line_bytes + marker.size());
    EXPECT_EQ(text.substr(text.size() - marker.size()), marker);
  };
  check(job->events.Logs(std::nullopt, 0, 0));
  v1::GetJobLogsRequest request;
  request.set_job_id(job->row.job_id);
  job->events.ReleaseRetained();
  std::optional<v1::GetJobLogsResponse> stored = journal.StoredLogs(*job, request);
  ASSERT_TRUE(stored);
  check(*stored);
  EXPECT_EQ(job->cut_lines, 1u);
}

// A field this build does not know was kept as it came: a 1 MB one in a log line (or a
// checkpoint report) made an event of 1 MB whatever the text.
TEST_F(BudgetTest, UnknownFieldsAreNotKept) {
  EventLimits limits;
  JobJournal journal(db_.get(), clock_, limits);
  auto job = NewJob(limits);
  JobTxn txn(*job);
  v1::LogLine* line = journal.AddEvent(txn)->mutable_log();
  line->set_text("short");
  line->GetReflection()->MutableUnknownFields(line)->AddLengthDelimited(99,
                                                                        std::string(1 << 20, 'u'));
  v1::CheckpointSaved* saved = journal.AddEvent(txn)->mutable_checkpoint_saved();
  saved->set_path("/ckpt/step-00000001");
  saved->GetReflection()->MutableUnknownFields(saved)->AddLengthDelimited(
      98, std::string(1 << 20, 'v'));
  ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  EXPECT_LT(job->events.retained_bytes(), 1024u);
  EXPECT_LT(StoredEventBytes(job->row.job_id), 1024u);

  v1::MetricsSample sample;
  sample.GetReflection()->MutableUnknownFields(&sample)->AddLengthDelimited(
      97, std::string(1 << 20, 'w'));
  MetricsIngest::Clean(&sample);
  EXPECT_LT(sample.ByteSizeLong(), 64u);
}

TEST_F(BudgetTest, CutKeepsWholeUtf8Characters) {
  EventLimits limits;
  limits.max_log_line_bytes = 4;
  JobEventLog log("job", 1, limits);
  v1::JobEvent e;
  e.mutable_log()->set_text("abc\xC3\xA9xyz");  // "abcéxyz": é is 2 bytes at 3..4
  ASSERT_TRUE(log.Cut(&e));
  EXPECT_EQ(e.log().text(), std::string("abc") + kLogCutMarker + "8 bytes]");
  v1::JobEvent short_line;
  short_line.mutable_log()->set_text("abcd");
  EXPECT_FALSE(log.Cut(&short_line));
}

TEST_F(BudgetTest, MemoryTiersAreBoundedByBytes) {
  EventLimits limits;
  limits.log_bytes = 64 << 10;
  JobJournal journal(nullptr, clock_, limits);
  auto job = NewJob(limits);
  for (int i = 0; i < 100; ++i) Log(journal, *job, std::string(2000, 'a' + i % 26));
  EXPECT_LE(job->events.retained_bytes(), limits.log_bytes);
  EXPECT_GT(job->events.retained_bytes(), limits.log_bytes / 2);
  const v1::GetJobLogsResponse logs = job->events.Logs(std::nullopt, 0, 0);
  EXPECT_TRUE(logs.truncated());
  EXPECT_LT(logs.lines_size(), 40);
  EXPECT_EQ(logs.lines(logs.lines_size() - 1).text(), std::string(2000, 'a' + 99 % 26));
}

// `meshrun logs` failed for every reader once the retained lines passed gRPC's message size.
TEST_F(BudgetTest, LogsAnswerIsBoundedAndKeepsTheNewestLines) {
  EventLimits limits;
  limits.max_logs_response_bytes = 100 << 10;
  JobJournal journal(db_.get(), clock_, limits);
  auto job = NewJob(limits);
  for (int i = 0; i < 40; ++i) Log(journal, *job, std::to_string(i) + std::string(16000, '.'));
  v1::GetJobLogsResponse logs = job->events.Logs(std::nullopt, 0, 0);
  EXPECT_LE(logs.ByteSizeLong(), limits.max_logs_response_bytes);
  EXPECT_TRUE(logs.truncated());
  ASSERT_GT(logs.lines_size(), 0);
  EXPECT_EQ(logs.lines(logs.lines_size() - 1).text().substr(0, 2), "39");
  // The same bound on what StateDb answers.
  job->events.ReleaseRetained();
  v1::GetJobLogsRequest request;
  request.set_job_id(job->row.job_id);
  std::optional<v1::GetJobLogsResponse> stored = journal.StoredLogs(*job, request);
  ASSERT_TRUE(stored);
  EXPECT_LE(stored->ByteSizeLong(), limits.max_logs_response_bytes);
  EXPECT_TRUE(stored->truncated());
  EXPECT_EQ(stored->lines(stored->lines_size() - 1).text().substr(0, 2), "39");
}

// A compromised worker's checkpoint reports (and job-level samples) once grew the database
// without end: StateDb keeps stored_event_bytes of them per job; state changes always.
TEST_F(BudgetTest, StoredEventsAreBoundedPerJob) {
  EventLimits limits;
  limits.stored_event_bytes = 20 << 10;
  limits.stored_log_bytes = 10 << 10;
  JobJournal journal(db_.get(), clock_, limits);
  auto job = NewJob(limits);
  for (int i = 0; i < 200; ++i) {
    JobTxn txn(*job);
    v1::CheckpointSaved* saved = journal.AddEvent(txn)->mutable_checkpoint_saved();
    saved->set_step(i);
    saved->set_path(std::string(1000, 'p'));
    ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  }
  Log(journal, *job, std::string(1000, 'l'), 100);
  EXPECT_LE(StoredEventBytes(job->row.job_id), (30 << 10) + 2000);
  EXPECT_GT(job->unstored_events, 150u);
  EXPECT_GT(job->unstored_lines, 80u);
  JobTxn txn(*job);
  journal.AddEvent(txn)->mutable_state_changed()->set_state(v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(journal.Commit(txn, Durability::kFast).ok());
  const std::vector<v1::JobEvent> stored = journal.StoredEvents(job->row.job_id, 1, 1'000'000);
  ASSERT_FALSE(stored.empty());
  EXPECT_TRUE(stored.back().has_state_changed()) << "over the budget, state changes still kept";
}

TEST(MetricsCleanTest, OnlyClosedLabelSetsOnceEach) {
  v1::MetricsSample s;
  auto add = [&](int axis, int op) {
    v1::CommStats* c = s.add_comm();
    c->set_axis(static_cast<v1::MeshAxis>(axis));
    c->set_op(static_cast<v1::CommOp>(op));
    c->set_bytes(100);
  };
  add(v1::MESH_AXIS_TP, v1::COMM_OP_ALL_REDUCE);
  for (int op = 9; op < 5009; ++op) add(v1::MESH_AXIS_TP, op);  // out of range
  add(v1::MESH_AXIS_TP, v1::COMM_OP_UNSPECIFIED);
  add(v1::MESH_AXIS_DP, v1::COMM_OP_ALL_REDUCE);  // a flattened axis
  add(99, v1::COMM_OP_ALL_REDUCE);                // no axis
  add(v1::MESH_AXIS_TP, v1::COMM_OP_ALL_REDUCE);  // again
  add(v1::MESH_AXIS_CP, v1::COMM_OP_SEND_RECV);
  EXPECT_EQ(MetricsIngest::Clean(&s), 5004u);
  ASSERT_EQ(s.comm_size(), 2);
  EXPECT_EQ(s.comm(0).op(), v1::COMM_OP_ALL_REDUCE);
  EXPECT_EQ(s.comm(1).op(), v1::COMM_OP_SEND_RECV);
}

TEST(ReportedCheckpointTest, OnlyTheStepFolderInTheJobsOwnDir) {
  v1::JobSpec spec = testing::SpecProto(1, 1, 1, 1);
  spec.mutable_checkpoint()->set_dir("/ckpt/a/");
  EXPECT_TRUE(CheckReportedCheckpoint(spec, 5, "/ckpt/a/step-00000005").ok());
  EXPECT_TRUE(CheckReportedCheckpoint(spec, 5, "/ckpt/a//step-00000005/").ok());
  for (const char* path :
       {"/ckpt/b/step-00000005", "/ckpt/a/../b/step-00000005", "/ckpt/a/step-00000006",
        "/ckpt/a/x/step-00000005", "/ckpt/a", "ckpt/a/step-00000005", "/ckpt/ab/step-00000005"}) {
    Status s = CheckReportedCheckpoint(spec, 5, path);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << path;
    EXPECT_NE(s.message().find("checkpoint_saved.path"), std::string::npos) << s.message();
  }
  spec.mutable_checkpoint()->set_dir("");
  EXPECT_FALSE(CheckReportedCheckpoint(spec, 5, "/ckpt/a/step-00000005").ok())
      << "a job without checkpoint.dir has no checkpoints";
}

// docs/security.md "Per job and per worker" lists every budget with the value the code uses:
// each row's backticked numbers, in order, are the constants its "in code" cell names.
TEST(BudgetDocTest, LimitsTableMatchesTheCode) {
  const EventLimits limits;
  const std::map<std::string, size_t> code = {
      {"EventLimits::max_log_line_bytes", limits.max_log_line_bytes},
      {"EventLimits::logs", limits.logs},
      {"EventLimits::log_bytes", limits.log_bytes},
      {"EventLimits::durable", limits.durable},
      {"EventLimits::durable_bytes", limits.durable_bytes},
      {"EventLimits::rank_metrics", limits.rank_metrics},
      {"EventLimits::rank_metrics_bytes", limits.rank_metrics_bytes},
      {"EventLimits::stored_log_bytes", limits.stored_log_bytes},
      {"EventLimits::stored_event_bytes", limits.stored_event_bytes},
      {"EventLimits::max_logs_response_bytes", limits.max_logs_response_bytes},
      {"CoordinatorServiceImpl::kMaxCheckpointPathBytes",
       CoordinatorServiceImpl::kMaxCheckpointPathBytes},
      {"CoordinatorServiceImpl::kMaxCalibrationBytes",
       CoordinatorServiceImpl::kMaxCalibrationBytes},
      {"RankSeries::kMaxCommPairs", RankSeries::kMaxCommPairs},
      {"JobManager::kFinishedJobsWithEvents", JobManager::kFinishedJobsWithEvents},
      {"RankSeries::kMaxFinishedJobs", RankSeries::kMaxFinishedJobs},
  };
  const char* root = std::getenv("MESHRUN_SOURCE_DIR");
  const std::string path = std::string(root != nullptr ? root : ".") + "/docs/security.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot read " << path;
  std::string line;
  bool in_section = false;
  std::set<std::string> documented;
  const std::regex backticked("`([^`]+)`");
  while (std::getline(in, line)) {
    if (line.rfind("### ", 0) == 0 || line.rfind("## ", 0) == 0) {
      in_section = line == "### Per job and per worker";
      continue;
    }
    if (!in_section || line.rfind("| ", 0) != 0 || line.rfind("| what", 0) == 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    ASSERT_GE(cells.size(), 4u) << line;
    std::vector<size_t> numbers;
    for (std::sregex_iterator it(cells[1].begin(), cells[1].end(), backticked), end; it != end;
         ++it) {
      const std::string text = (*it)[1];
      if (std::all_of(text.begin(), text.end(), ::isdigit)) numbers.push_back(std::stoull(text));
    }
    std::vector<std::string> names;
    for (std::sregex_iterator it(cells[2].begin(), cells[2].end(), backticked), end; it != end;
         ++it) {
      names.push_back((*it)[1]);
    }
    ASSERT_EQ(numbers.size(), names.size()) << "one backticked number per constant: " << line;
    for (size_t i = 0; i < names.size(); ++i) {
      const auto it = code.find(names[i]);
      ASSERT_NE(it, code.end()) << names[i] << " is in docs/security.md but not in this test";
      EXPECT_EQ(numbers[i], it->second) << names[i] << " in docs/security.md";
      documented.insert(names[i]);
    }
  }
  for (const auto& [name, value] : code) {
    EXPECT_TRUE(documented.count(name)) << name << " (" << value << ") has no row";
  }
}

}  // namespace
}  // namespace meshrun::coordinator
