// Elastic jobs in JobManager (decision 0056) over the fakes: a lost worker shrinks the mesh only
// after resources.elastic.wait_seconds; a drain stops the attempt with StopOrder(REMESH), and its
// ranks' exit 130 after the checkpoint re-places the job without the worker, using no restart;
// each mesh is listed in Job.meshes with its cause.
#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

class ElasticJobManagerTest : public JobManagerTest {
 protected:
  // dp_shard s × tp t, elastic [lo, hi] ranks.
  std::string SubmitElastic(int s, int t, int lo, int hi, int wait_seconds, int max_restarts) {
    v1::SubmitJobRequest req = testing::SubmitRequest(1, s, 1, t, max_restarts);
    req.mutable_spec()->mutable_checkpoint()->set_dir("/ck");
    v1::ResourcesSpec* r = req.mutable_spec()->mutable_resources();
    r->set_elastic_min_ranks(lo);
    r->set_elastic_max_ranks(hi);
    r->set_elastic_wait_seconds(wait_seconds);
    auto id = jobs_->Submit(req);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : "";
  }
};

TEST_F(ElasticJobManagerTest, ALostWorkerShrinksTheMeshAfterTheWait) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = SubmitElastic(2, 2, 2, 4, /*wait_seconds=*/10, /*max_restarts=*/1);
  const auto on_a = StartAll("a");
  ASSERT_EQ(on_a.size(), 2u);
  ASSERT_EQ(StartAll("b").size(), 2u);
  workers_.Remove("b");
  jobs_->OnWorkerLost("b");
  for (const auto& a : on_a) Exited("a", id, 1, a.rank(), 143, /*stopped=*/true);
  jobs_->Tick();
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING) << job.message();
  EXPECT_EQ(job.world_size(), 4) << "shrunk before wait_seconds";
  clock_.Advance(std::chrono::seconds(11));
  jobs_->Tick();
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_EQ(job.world_size(), 2);
  EXPECT_EQ(job.spec().parallelism().tp_size(), 2);
  EXPECT_EQ(job.spec().parallelism().dp_shard_size(), 1);
  const auto again = workers_.TakeAssignments("a");
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].world_size(), 2);
  EXPECT_EQ(again[0].mesh().tp_size(), 2);
  EXPECT_EQ(again[0].spec().parallelism().dp_shard_size(), 1);
  ASSERT_EQ(job.meshes_size(), 2);
  EXPECT_EQ(job.meshes(0).cause(), "submitted");
  EXPECT_EQ(job.meshes(0).world_size(), 4);
  EXPECT_EQ(job.meshes(1).cause(), "lost worker");
  EXPECT_EQ(job.meshes(1).attempt(), 2);
}

TEST_F(ElasticJobManagerTest, ADrainCheckpointsAndReMeshesWithoutARestart) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = SubmitElastic(2, 2, 2, 4, 60, /*max_restarts=*/0);
  const auto on_a = StartAll("a");
  const auto on_b = StartAll("b");
  workers_.SetDrained("b", true);
  EXPECT_EQ(jobs_->OnWorkerDrained("b", true), std::vector<std::string>{id});
  for (const std::string w : {"a", "b"}) {
    const auto stops = workers_.TakeStops(w);
    ASSERT_EQ(stops.size(), 1u) << w;
    EXPECT_EQ(stops[0].reason(), v1::STOP_REASON_REMESH);
  }
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);  // until the ranks have checkpointed
  for (const auto& a : on_a) Exited("a", id, 1, a.rank(), 130, /*stopped=*/true);
  for (const auto& a : on_b) Exited("b", id, 1, a.rank(), 130, /*stopped=*/true);
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.world_size(), 2);
  EXPECT_EQ(workers_.TakeAssignments("a").size(), 2u);
  EXPECT_TRUE(workers_.TakeAssignments("b").empty()) << "a drained worker got ranks";
  ASSERT_EQ(job.meshes_size(), 2);
  EXPECT_EQ(job.meshes(1).cause(), "drained");
  // The re-mesh used no restart: attempt 2 of a job that never failed.
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(ElasticJobManagerTest, AFixedWorldJobKeepsItsMeshAndWaits) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = Submit(1, 2, 1, 2, /*max_restarts=*/1);
  const auto on_a = StartAll("a");
  ASSERT_EQ(StartAll("b").size(), 2u);
  workers_.Remove("b");
  jobs_->OnWorkerLost("b");
  for (const auto& a : on_a) Exited("a", id, 1, a.rank(), 143, /*stopped=*/true);
  clock_.Advance(std::chrono::seconds(120));
  jobs_->Tick();
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.world_size(), 4);
  EXPECT_EQ(job.meshes_size(), 0);
}

}  // namespace
}  // namespace meshrun::coordinator
