// SubmitJob's placement answers before its RankAssignments are queued (decision 0058): with
// JobManagerConfig::defer_submit_assignments (the server's setting) they wait for
// FlushAssignments (the server's ticker), and a stop order never overtakes them.
#include <gtest/gtest.h>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

class DeferredAssignmentsTest : public JobManagerTest {
 protected:
  DeferredAssignmentsTest() {
    defer_submit_assignments_ = true;
    Open();
    workers_.Add("a", 4);
    workers_.Add("b", 4);
  }
};

TEST_F(DeferredAssignmentsTest, PlacedAndStoredAtOnceSentAtTheFlush) {
  const std::string id = Submit(1, 2, 1, 4);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(workers_.TakeAssignments("a").empty());
  EXPECT_TRUE(workers_.TakeAssignments("b").empty());
  jobs_->FlushAssignments();
  EXPECT_EQ(workers_.TakeAssignments("a").size(), 4u);
  EXPECT_EQ(workers_.TakeAssignments("b").size(), 4u);
  // Once only.
  jobs_->FlushAssignments();
  EXPECT_TRUE(workers_.TakeAssignments("a").empty());
}

TEST_F(DeferredAssignmentsTest, AStopSendsThemFirst) {
  const std::string id = Submit(1, 2, 1, 4);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  ASSERT_TRUE(jobs_->Cancel(cancel).ok());
  // The cancel's stop orders went out, and the assignments before them.
  using K = v1::WorkerSessionResponse;
  const std::vector<K::KindCase> sent = workers_.Kinds("a");
  const std::vector<K::KindCase> expected = {K::kAssign, K::kAssign, K::kAssign, K::kAssign,
                                             K::kStop};
  EXPECT_EQ(sent, expected);
  EXPECT_EQ(workers_.TakeAssignments("a").size(), 4u);
  EXPECT_EQ(workers_.TakeStops("a").size(), 1u);
  EXPECT_EQ(workers_.TakeAssignments("b").size(), 4u);
  jobs_->FlushAssignments();
  EXPECT_TRUE(workers_.TakeAssignments("a").empty());
}

TEST_F(DeferredAssignmentsTest, TheNextSchedulingSendsThem) {
  Submit(1, 2, 1, 4);
  jobs_->Schedule();
  EXPECT_EQ(workers_.TakeAssignments("a").size(), 4u);
  EXPECT_EQ(workers_.TakeAssignments("b").size(), 4u);
}

}  // namespace
}  // namespace meshrun::coordinator
