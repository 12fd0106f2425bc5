// The worker's pre-start memory check for the Llama family: on a worker with --memory-bytes
// 200 MB, a Llama whose MLP (d_ff 200,000, or 2^31−1) cannot fit is reported as never started,
// naming d_ff and the flag, and no process runs; a small Llama starts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "proto/spec_convert.h"
#include "tests/worker/fake_coordinator.h"
#include "worker/worker_daemon.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::FakeCoordinator;
using testing::FakeServer;
using Ups = std::vector<v1::WorkerSessionRequest>;

class WorkerMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("worker-memory-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    std::ofstream(dir_ / "data" / "train.txt") << "hello";
    server_ = std::make_unique<FakeServer>(&fake_);
    ASSERT_TRUE(server_->ok());
    WorkerConfig config;
    config.name = "w1";
    config.slots = 2;
    config.work_dir = (dir_ / "work").string();
    config.meshrun_binary = MESHRUN_FAKE_RANK;  // tests/fakes/fake_rank.cc
    config.default_grace = 2s;
    config.session.backoff_initial = 50ms;
    config.cores = 1;
    config.memory_bytes = 200'000'000;  // --memory-bytes 200MB
    auto paths = PathPolicy::Create({(dir_ / "data").string()}, {});
    ASSERT_TRUE(paths.ok()) << paths.status().ToString();
    config.paths = *paths;
    daemon_ = std::make_unique<WorkerDaemon>(config, testing::StubFor(server_->address()), nullptr);
    daemon_->Start();
    ASSERT_TRUE(fake_.WaitForOpens(1));
  }
  void TearDown() override {
    daemon_.reset();
    server_.reset();
    fs::remove_all(dir_);
  }

  // One rank of a 1-rank Llama job (d_model 64, 2 layers, 4 heads, 2 kv heads) with `d_ff`;
  // returns its RankExited (waits for it).
  v1::RankExited RunLlama(const std::string& job_id, int d_ff) {
    JobSpec spec;
    spec.name = "t";
    spec.data.train = fs::weakly_canonical(dir_ / "data" / "train.txt").string();
    spec.model.arch = "llama";
    spec.model.n_kv_head = 2;
    spec.model.d_ff = d_ff;
    spec.model.tie_embeddings = false;
    v1::WorkerSessionResponse m;
    v1::RankAssignment* a = m.mutable_assign();
    a->set_job_id(job_id);
    a->set_attempt(1);
    a->set_rank(0);
    a->set_world_size(1);
    a->set_local_world_size(1);
    *a->mutable_spec() = JobSpecToProto(spec);
    a->mutable_store()->set_address("127.0.0.1:7777");
    fake_.SendDown(m);
    EXPECT_TRUE(fake_.WaitFor([&](const Ups& ups) { return ExitOf(ups, job_id) != nullptr; }));
    const Ups ups = fake_.up();
    const v1::RankExited* e = ExitOf(ups, job_id);
    return e != nullptr ? *e : v1::RankExited();
  }

  static const v1::RankExited* ExitOf(const Ups& ups, const std::string& job_id) {
    for (const auto& u : ups) {
      if (u.has_rank_exited() && u.rank_exited().job_id() == job_id) return &u.rank_exited();
    }
    return nullptr;
  }
  static bool Started(const Ups& ups, const std::string& job_id) {
    for (const auto& u : ups) {
      if (u.has_rank_started() && u.rank_started().job_id() == job_id) return true;
    }
    return false;
  }

  FakeCoordinator fake_;
  std::unique_ptr<FakeServer> server_;
  std::unique_ptr<WorkerDaemon> daemon_;
  fs::path dir_;
};

// Attack: a Llama job with d_ff 200,000 ran at 843 MB on a worker limited to 200 MB, and one
// with d_ff 2^31−1 passed the check and died of std::bad_alloc.
TEST_F(WorkerMemoryTest, LlamaWhoseMlpCannotFitIsRefusedBeforeTheRankStarts) {
  for (const int d_ff : {200000, std::numeric_limits<int>::max()}) {
    const std::string id = "job-dff-" + std::to_string(d_ff);
    const v1::RankExited e = RunLlama(id, d_ff);
    EXPECT_EQ(e.exit_code(), -1) << d_ff;
    EXPECT_EQ(e.error().rfind("model: ", 0), 0u) << e.error();
    EXPECT_NE(e.error().find("d_ff " + std::to_string(d_ff)), std::string::npos) << e.error();
    EXPECT_NE(e.error().find("--memory-bytes"), std::string::npos) << e.error();
    EXPECT_FALSE(Started(fake_.up(), id));
    EXPECT_FALSE(fs::exists(dir_ / "work" / id));
  }
}

TEST_F(WorkerMemoryTest, SmallLlamaStarts) {
  const v1::RankExited e = RunLlama("job-small", 256);
  EXPECT_EQ(e.exit_code(), 0) << e.error();
  EXPECT_TRUE(Started(fake_.up(), "job-small"));
}

}  // namespace
}  // namespace meshrun
