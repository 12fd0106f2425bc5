// JobManager (tests/coordinator/job_manager_fixture.h: fakes, no sockets, a real SQLite file).
// Submit, the FIFO queue per device and placement onto the workers, listing.
#include <gtest/gtest.h>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

using std::chrono::milliseconds;
using testing::FakeWatchStream;
using testing::SubmitRequest;

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

}  // namespace
}  // namespace meshrun::coordinator
