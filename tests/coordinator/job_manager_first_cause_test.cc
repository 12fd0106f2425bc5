// JobManager (tests/coordinator/job_manager_fixture.h): a failed attempt names its first cause.
// When a worker dies (kill -9) or a rank is killed, the peers on other workers notice first
// ("Connection reset by peer") and their error exit may reach the coordinator before the lost
// worker's lease runs out or the killed rank's exit is reported; once the real cause is known it
// leads the attempt's reason and the job's message.
#include <gtest/gtest.h>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

class JobManagerFirstCauseTest : public JobManagerTest {
 protected:
  // A two-rank job over workers a and b (one slot each); returns its id and sets the rank each
  // worker runs.
  std::string StartOnTwoWorkers(int max_restarts = 0) {
    workers_.Add("a", 1);
    workers_.Add("b", 1);
    const std::string id = Submit(1, 2, 1, 1, max_restarts);
    const v1::Job job = Get(id);
    rank_on_a_ = job.ranks(0).worker_id() == "a" ? 0 : 1;
    rank_on_b_ = 1 - rank_on_a_;
    StartAll("a");
    StartAll("b");
    return id;
  }
  // The rank on worker a exits 1 with the error its peer's death gave it.
  void EchoOnA(const std::string& id, int attempt = 1) {
    v1::RankExited m;
    m.set_job_id(id);
    m.set_attempt(attempt);
    m.set_rank(rank_on_a_);
    m.set_exit_code(1);
    m.set_error("Gloo: Connection reset by peer");
    jobs_->OnRankExited("a", m);
  }
  std::string Echo() const {
    return "rank " + std::to_string(rank_on_a_) + " on worker a exited with code 1";
  }

  int rank_on_a_ = 0, rank_on_b_ = 1;
};

TEST_F(JobManagerFirstCauseTest, LostWorkerLeadsThePeersConnectionError) {
  const std::string id = StartOnTwoWorkers();
  EchoOnA(id);
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(job.message().rfind(Echo(), 0), 0u) << job.message();
  // b was killed: it never reports its rank's exit, and its lease runs out.
  workers_.Remove("b");
  jobs_->OnWorkerLost("b");
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.message().rfind("worker b was lost", 0), 0u) << job.message();
  EXPECT_NE(job.message().find("before that was known, " + Echo() + ": Gloo: Connection reset"),
            std::string::npos)
      << job.message();
  EXPECT_EQ(job.ranks(rank_on_b_).state(), v1::RANK_STATE_LOST);
  EXPECT_EQ(job.ranks(rank_on_a_).state(), v1::RANK_STATE_FAILED);
}

TEST_F(JobManagerFirstCauseTest, KilledRankLeadsThePeersConnectionError) {
  const std::string id = StartOnTwoWorkers();
  EchoOnA(id);
  // The killed rank's exit (SIGKILL, not from a stop order) arrives after its peer's.
  Exited("b", id, 1, rank_on_b_, -1, /*stopped=*/false, /*signal=*/9);
  const v1::Job job = Get(id);
  EXPECT_EQ(job.message().rfind(
                "rank " + std::to_string(rank_on_b_) + " on worker b was killed by signal 9", 0),
            0u)
      << job.message();
  EXPECT_NE(job.message().find("before that was known, " + Echo()), std::string::npos)
      << job.message();
}

TEST_F(JobManagerFirstCauseTest, RanksStoppedAfterTheFailureChangeNothing) {
  const std::string id = StartOnTwoWorkers();
  EchoOnA(id);
  const std::string message = Get(id).message();
  // The peer stopped by the failure's stop order (SIGTERM, then SIGKILL after the grace).
  Exited("b", id, 1, rank_on_b_, -1, /*stopped=*/true, /*signal=*/9);
  EXPECT_EQ(Get(id).message(), message);
  // Its worker lost later: it had reported its rank's exit, so that was not the cause.
  workers_.Remove("b");
  jobs_->OnWorkerLost("b");
  EXPECT_EQ(Get(id).message(), message);
}

TEST_F(JobManagerFirstCauseTest, ARankKilledFirstStaysTheCause) {
  const std::string id = StartOnTwoWorkers();
  Exited("b", id, 1, rank_on_b_, -1, /*stopped=*/false, /*signal=*/11);
  EchoOnA(id);
  const v1::Job job = Get(id);
  EXPECT_EQ(job.message().rfind(
                "rank " + std::to_string(rank_on_b_) + " on worker b was killed by signal 11", 0),
            0u)
      << job.message();
  EXPECT_EQ(job.message().find("before that was known"), std::string::npos) << job.message();
}

TEST_F(JobManagerFirstCauseTest, InvalidInputIsACauseOfItsOwn) {
  const std::string id = StartOnTwoWorkers();
  Exited("a", id, 1, rank_on_a_, 2);  // the rank rejected its input
  const std::string message = Get(id).message();
  workers_.Remove("b");
  jobs_->OnWorkerLost("b");
  EXPECT_EQ(Get(id).message(), message);
}

TEST_F(JobManagerFirstCauseTest, PendingRestartNamesTheLostWorker) {
  const std::string id = StartOnTwoWorkers(/*max_restarts=*/1);
  EchoOnA(id);
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_PENDING);
  workers_.Remove("b");
  jobs_->OnWorkerLost("b");
  const v1::Job job = Get(id);
  // Two ranks do not fit worker a alone: the restart waits, with the first cause in its reason.
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.message().rfind("attempt 1 failed: worker b was lost", 0), 0u) << job.message();
  EXPECT_NE(job.message().find("restart 1 of 1 queued"), std::string::npos) << job.message();
}

}  // namespace
}  // namespace meshrun::coordinator
