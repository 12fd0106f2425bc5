// The worker's pre-start memory check: on a worker with --memory-bytes 200 MB, a Llama whose
// MLP (d_ff 200,000, or 2^31−1) cannot fit is reported as never started, naming d_ff and the
// flag, and no process runs; a small Llama starts. The check is the rank's own step counted on
// the counting device (engine/train/counted_step.h), exact: a job between the quick lower bound
// and the count is refused by the worker, and one byte more than the count starts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/memory_estimate.h"
#include "engine/train/counted_step.h"
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
    StartDaemon(200'000'000);  // --memory-bytes 200MB
  }
  // (Re)starts the worker with `memory_bytes` of --memory-bytes, or (gpu_bytes > 0) as a
  // --device cuda worker with two GPUs of gpu_bytes and half of it.
  void StartDaemon(double memory_bytes, uint64_t gpu_bytes = 0) {
    daemon_.reset();
    WorkerConfig config;
    if (gpu_bytes > 0) {
      config.device = "cuda";
      config.gpus = {GpuDevice{0, "0", "Test GPU", gpu_bytes / 2},
                     GpuDevice{1, "1", "Test GPU", gpu_bytes}};
    }
    config.name = "w1";
    config.slots = 2;
    config.work_dir = (dir_ / "work").string();
    config.meshrun_binary = MESHRUN_FAKE_RANK;  // tests/fakes/fake_rank.cc
    config.default_grace = 2s;
    config.session.backoff_initial = 50ms;
    config.cores = 1;
    config.memory_bytes = memory_bytes;
    auto paths = PathPolicy::Create({(dir_ / "data").string()}, {});
    ASSERT_TRUE(paths.ok()) << paths.status().ToString();
    config.paths = *paths;
    daemon_ = std::make_unique<WorkerDaemon>(config, testing::StubFor(server_->address()), nullptr);
    daemon_->Start();
    ASSERT_TRUE(fake_.WaitForOpens(++opens_));
  }
  void TearDown() override {
    daemon_.reset();
    server_.reset();
    fs::remove_all(dir_);
  }

  // One rank of a 1-rank Llama job (d_model 64, 2 layers, 4 heads, 2 kv heads) with `d_ff`;
  // returns its RankExited (waits for it).
  v1::RankExited RunLlama(const std::string& job_id, int d_ff) { return Run(job_id, Llama(d_ff)); }
  JobSpec Llama(int d_ff) const {
    JobSpec spec;
    spec.name = "t";
    spec.data.train = fs::weakly_canonical(dir_ / "data" / "train.txt").string();
    spec.model.arch = "llama";
    spec.model.n_kv_head = 2;
    spec.model.d_ff = d_ff;
    spec.model.tie_embeddings = false;
    return spec;
  }
  v1::RankExited Run(const std::string& job_id, const JobSpec& spec) {
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
  int opens_ = 0;
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

// Between the quick lower bound (parameters, gradients, moments, one micro-batch's
// activations) and the step's own count (the head's and attention's buffers, the pools, the
// data's tokens): the worker refuses it by the count before any process starts; with one byte
// more than the count it starts.
TEST_F(WorkerMemoryTest, TheCountedStepDecidesBeforeTheRankStarts) {
  JobSpec spec = Llama(128);
  spec.model.seq_len = 256;
  spec.train.micro_batch_size = 8;
  spec.train.global_batch_size = 8;
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
  const double bound = EstimateRankMemory(spec, *MeshOf(spec)).total();
  const StatusOr<CountedRank> counted = CountRank(spec, 0);
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  const double exact = static_cast<double>(counted->Total());
  ASSERT_LT(bound, exact) << "the case must sit between the two";

  StartDaemon(std::floor((bound + exact) / 2));
  const v1::RankExited refused = Run("job-between", spec);
  EXPECT_EQ(refused.exit_code(), -1);
  EXPECT_NE(refused.error().find("(the engine's own step, counted)"), std::string::npos)
      << refused.error();
  EXPECT_FALSE(Started(fake_.up(), "job-between"));
  EXPECT_FALSE(fs::exists(dir_ / "work" / "job-between"));

  StartDaemon(exact + 1);
  const v1::RankExited ran = Run("job-fits", spec);
  EXPECT_EQ(ran.exit_code(), 0) << ran.error();
  EXPECT_TRUE(Started(fake_.up(), "job-fits"));
}

// A cuda worker (GPUs from NVML): a rank whose counted step exceeds its largest GPU is refused
// before it starts, naming the GPU; one that fits starts. (The count of a cuda job is the one
// it would run on the GPU, bf16 included: no GPU is needed to count it.)
TEST_F(WorkerMemoryTest, ACudaRankThatFitsNoGpuIsRefusedBeforeItStarts) {
  JobSpec spec = Llama(128);
  spec.resources.device = "cuda";
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
  const StatusOr<CountedRank> counted = CountRank(spec, 0);
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  const uint64_t exact = static_cast<uint64_t>(counted->Total());

  StartDaemon(0, exact - 1);
  const v1::RankExited refused = Run("job-gpu-small", spec);
  EXPECT_EQ(refused.exit_code(), -1);
  EXPECT_NE(refused.error().find("(the engine's own step, counted)"), std::string::npos)
      << refused.error();
  EXPECT_NE(refused.error().find("largest GPU (Test GPU, 1)"), std::string::npos)
      << refused.error();
  EXPECT_FALSE(Started(fake_.up(), "job-gpu-small"));
  EXPECT_FALSE(fs::exists(dir_ / "work" / "job-gpu-small"));

  StartDaemon(0, exact);
  const v1::RankExited ran = Run("job-gpu-fits", spec);
  EXPECT_EQ(ran.exit_code(), 0) << ran.error();
  EXPECT_TRUE(Started(fake_.up(), "job-gpu-fits"));
}

}  // namespace
}  // namespace meshrun
