// Elastic jobs (issue #36, decision 0056) on a real local cluster: a coordinator and two 2-slot
// workers run a 4-rank job (dp_shard 2 × tp 2, elastic 2–4 ranks, bench/chaos/elastic_trial.h).
// A worker killed for good: the job continues on the other worker on a re-planned mesh (tp 2)
// and SUCCEEDS with the undisturbed final loss (1e-5 relative). A worker added: the job that
// started on 2 ranks grows to 4 from a checkpoint it asked for, losing no step. A drain: the
// job checkpoints now and moves to the other worker; its step never goes back. Each trial is
// bounded (60 s); bench/chaos runs many (--faults worker-gone,worker-added,drain).
#include <gtest/gtest.h>

#include <cstdlib>

#include "bench/chaos/elastic_trial.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using chaos::ElasticCluster;
using chaos::ElasticFault;
using chaos::ElasticResult;

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(testing::BinDir() / bin)) GTEST_SKIP() << bin << " is not built";
    }
    options_.bin_dir = testing::BinDir();
    if (!fs::exists(options_.corpus)) GTEST_SKIP() << options_.corpus << " is missing";
    char pattern[] = "/tmp/meshrun_elastic_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    options_.dir = pattern;
  }
  void TearDown() override {
    if (HasFailure()) {
      std::cerr << "logs kept in " << options_.dir << std::endl;
    } else if (!options_.dir.empty()) {
      fs::remove_all(options_.dir);
    }
  }

  void RunOne(ElasticFault fault) {
    const char* seed_env = std::getenv("MESHRUN_CHAOS_SEED");
    const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 36;
    ElasticCluster cluster(options_);
    const double reference = cluster.ReferenceLoss();
    ASSERT_FALSE(std::isnan(reference)) << "the undisturbed run failed";
    std::string why;
    ASSERT_TRUE(cluster.Start(&why)) << why;
    const ElasticResult t = cluster.RunTrial(fault, seed, reference);
    std::printf(
        "trial %-12s seed %3llu: %s  fault at step %2d, world %d -> %d, resumed from %lld, "
        "steps lost %lld, loss %.6f (undisturbed %.6f), fault to first step %.1f s, trial %.1f s, "
        "moments too late %d\n",
        chaos::ElasticFaultName(fault), static_cast<unsigned long long>(t.seed),
        t.ok ? "ok  " : "FAIL", t.fault_at_step, t.world_before, t.world_after,
        static_cast<long long>(t.resumed_from), static_cast<long long>(t.steps_lost), t.final_loss,
        reference, t.recovery_seconds, t.trial_seconds, t.missed);
    EXPECT_TRUE(t.ok) << chaos::ElasticFaultName(fault) << " seed " << t.seed << ": " << t.why
                      << "\n---- status\n"
                      << t.status << "\n---- coordinator log (tail)\n"
                      << t.logs;
  }

  ElasticCluster::Options options_;
};

TEST_F(ElasticTest, AWorkerKilledForGoodShrinksTheMeshWithTheUndisturbedLoss) {
  RunOne(ElasticFault::kWorkerGone);
}

TEST_F(ElasticTest, AWorkerAddedGrowsTheMeshLosingNoStep) {
  RunOne(ElasticFault::kWorkerAdded);
}

TEST_F(ElasticTest, ADrainMovesTheJobAndItsStepNeverGoesBack) {
  RunOne(ElasticFault::kDrain);
}

}  // namespace
}  // namespace meshrun
