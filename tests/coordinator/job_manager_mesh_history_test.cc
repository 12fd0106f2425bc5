// An elastic job's mesh history in JobManager (decision 0056) is bounded: a job that re-meshes
// without end (drained back and forth between two workers) keeps only its newest
// kMaxMeshEpochs meshes in Job.meshes, while the re-mesh count of the metrics counts every one.
#include <algorithm>

#include "tests/coordinator/job_manager_fixture.h"

namespace meshrun::coordinator {
namespace {

class MeshHistoryTest : public JobManagerTest {
 protected:
  // tp 2 (world 2, one worker's slots), elastic [2, 2] ranks: a drain moves it, nothing grows it.
  std::string SubmitElasticTp2() {
    v1::SubmitJobRequest req = testing::SubmitRequest(1, 1, 1, 2, /*max_restarts=*/0);
    req.mutable_spec()->mutable_checkpoint()->set_dir("/ck");
    v1::ResourcesSpec* r = req.mutable_spec()->mutable_resources();
    r->set_elastic_min_ranks(2);
    r->set_elastic_max_ranks(2);
    r->set_elastic_wait_seconds(60);
    auto id = jobs_->Submit(req);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : "";
  }

  int Remeshes(const std::string& id) const {
    const JobsSnapshot snapshot = jobs_->Snapshot();
    for (const JobsSnapshot::JobLine& line : snapshot.jobs) {
      if (line.job_id == id) return line.remeshes;
    }
    return -1;
  }
};

TEST_F(MeshHistoryTest, AReMeshStormKeepsTheNewestMeshesAndCountsEveryReMesh) {
  workers_.Add("a", 2);
  workers_.Add("b", 2);
  const std::string id = SubmitElasticTp2();
  std::string on = "a";
  std::vector<v1::RankAssignment> ranks = StartAll("a");
  if (ranks.empty()) {
    on = "b";
    ranks = StartAll("b");
  }
  ASSERT_EQ(ranks.size(), 2u);
  // Drained, checkpointed (exit 130), placed on the other worker, undrained: one re-mesh each.
  const int drains = static_cast<int>(kMaxMeshEpochs) + 3;
  for (int i = 0; i < drains; ++i) {
    const int attempt = i + 1;
    workers_.SetDrained(on, true);
    ASSERT_EQ(jobs_->OnWorkerDrained(on, true), std::vector<std::string>{id}) << "drain " << i;
    (void)workers_.TakeStops(on);
    for (const auto& a : ranks) Exited(on, id, attempt, a.rank(), 130, /*stopped=*/true);
    workers_.SetDrained(on, false);
    (void)jobs_->OnWorkerDrained(on, false);
    on = on == "a" ? "b" : "a";
    ranks = StartAll(on);
    ASSERT_EQ(ranks.size(), 2u) << "drain " << i << ": " << Get(id).message();
    ASSERT_EQ(ranks[0].attempt(), attempt + 1);
  }
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_EQ(job.attempt(), drains + 1);
  // The newest meshes, oldest first: attempts drains + 2 − kMaxMeshEpochs … drains + 1.
  ASSERT_EQ(job.meshes_size(), static_cast<int>(kMaxMeshEpochs));
  EXPECT_EQ(job.meshes(0).attempt(), drains + 2 - static_cast<int>(kMaxMeshEpochs));
  EXPECT_EQ(job.meshes(job.meshes_size() - 1).attempt(), drains + 1);
  for (const v1::JobMesh& m : job.meshes()) EXPECT_EQ(m.cause(), "drained");
  // Every re-mesh counts, the ones let go of too.
  EXPECT_EQ(Remeshes(id), drains);
}

}  // namespace
}  // namespace meshrun::coordinator
