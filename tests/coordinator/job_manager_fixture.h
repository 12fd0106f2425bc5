// The fixture of the JobManager tests (job_manager_*_test.cc): a JobManager over fakes (clock,
// worker view, no sockets) and a real SQLite file in a temporary folder, re-openable as after a
// coordinator restart, with helpers for the messages a worker sends.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/job_manager.h"
#include "tests/coordinator/test_util.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_streams.h"
#include "tests/fakes/fake_worker_view.h"

namespace meshrun::coordinator {

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
    config.stop_resend = std::chrono::milliseconds(1000);
    // Restarts are placed at once unless a test sets a backoff (RestartsBackOffExponentially).
    config.restart_backoff = restart_backoff_;
    config.max_stops_per_worker = max_stops_per_worker_;
    config.max_page_bytes = max_page_bytes_;
    config.defer_submit_assignments = defer_submit_assignments_;
    jobs_ = std::make_unique<JobManager>(
        db_.get(), workers_, persist_store_ ? *persistent_store_ : store_, clock_, config);
    ASSERT_TRUE(jobs_->Load().ok());
  }

  std::string Submit(int r, int s, int c, int t, int max_restarts = 0) {
    auto id = jobs_->Submit(testing::SubmitRequest(r, s, c, t, max_restarts));
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
  // `n` log lines of (job, attempt, rank) with `text`, or "line 0", "line 1", … when `text` is
  // empty, their ranks cycling through `ranks` ranks from `rank`.
  static v1::LogBatch Lines(const std::string& job, int attempt, int rank, int n,
                            const std::string& text = "", int ranks = 1) {
    v1::LogBatch logs;
    for (int i = 0; i < n; ++i) {
      v1::LogLine* line = logs.add_lines();
      line->set_job_id(job);
      line->set_attempt(attempt);
      line->set_rank(rank + i % ranks);
      line->set_text(text.empty() ? "line " + std::to_string(i) : text);
    }
    return logs;
  }
  void CheckpointSaved(const std::string& worker, const std::string& job, int attempt, int step,
                       const std::string& path, bool resumed = false) {
    v1::CheckpointSaved saved;
    saved.set_resumed(resumed);
    saved.set_job_id(job);
    saved.set_attempt(attempt);
    saved.set_step(step);
    saved.set_path(path);
    jobs_->OnCheckpointSaved(worker, saved);
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
    (void)jobs_->OnRunning(worker, list);
  }

  std::chrono::milliseconds restart_backoff_{0};
  size_t max_stops_per_worker_ = 1024;
  size_t max_page_bytes_ = 1 << 20;        // ListRanks
  bool defer_submit_assignments_ = false;  // as server.cc sets it: true
  testing::TempDir dir_;
  testing::FakeClock clock_;
  testing::FakeWorkerView workers_;
  StoreManager store_{clock_, StoreLimits{}};
  bool persist_store_ = false;
  std::unique_ptr<StoreManager> persistent_store_;
  std::unique_ptr<StateDb> db_;
  std::unique_ptr<JobManager> jobs_;
};

}  // namespace meshrun::coordinator
