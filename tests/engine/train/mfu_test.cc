// One MFU definition (common/mfu.h, docs/metrics.md): the trainer's step and summary figures are
// ModelFlopsUtilization of what it reports, whatever command started the rank; and the CPU peak
// is linear in a rank's threads, so splitting a host's cores into more ranks (`train` against
// `train --nproc`, or a worker's slots) leaves the job's summed peak, and so its MFU, unchanged.
#include "common/mfu.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "engine/kernels/cpu/kernels.h"
#include "engine/model/gpt2.h"
#include "engine/train/trainer.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

TEST(MfuTest, TheFormula) {
  // 1000 tokens/s × 6e9 FLOPs/token over 4 ranks of 1e12 FLOP/s: 1.5 of 4 TFLOP/s.
  EXPECT_DOUBLE_EQ(ModelFlopsUtilization(1000, 6e9, 1e12, 4), 1.5);
  EXPECT_DOUBLE_EQ(ModelFlopsUtilization(1000, 6e9, 1e12, 1), 6.0);
  EXPECT_EQ(ModelFlopsUtilization(1000, 6e9, 0, 4), 0);  // no peak known: 0, never infinity
}

TEST(MfuTest, TheCpuPeakIsOneCoreTimesTheRanksThreads) {
  const int before = cpu::NumThreads();
  cpu::SetNumThreads(1);
  const double one = MeasureCpuGemmPeakFlops();
  cpu::SetNumThreads(2);
  const double two = MeasureCpuGemmPeakFlops();
  cpu::SetNumThreads(before);
  EXPECT_GT(one, 0);
  // One rank of 2 threads has the summed peak of 2 ranks of 1 thread.
  EXPECT_DOUBLE_EQ(two, 2 * one);
}

class MfuTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_mfu_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::ofstream out(dir_ / "train.txt");
    for (int line = 0; line < 200; ++line) out << "line " << line << ": some words here\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

class StepCollector final : public TrainObserver {
 public:
  void OnStep(const StepMetrics& m) override { steps.push_back(m); }
  std::vector<StepMetrics> steps;
};

TEST_F(MfuTrainerTest, StepAndSummaryFiguresAreTheSharedFunction) {
  JobSpec spec;
  spec.model.n_layer = 2;
  spec.model.n_head = 4;
  spec.model.d_model = 32;
  spec.model.seq_len = 32;
  spec.model.vocab_size = 256;
  spec.train.steps = 3;
  spec.train.global_batch_size = 4;
  spec.train.micro_batch_size = 2;
  spec.data.train = (dir_ / "train.txt").string();
  spec.data.format = "text";
  spec.resources.threads = 1;
  TrainOptions options;
  options.peak_flops = 3e9;  // a fixed peak per rank
  StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  StepCollector steps;
  StatusOr<RunSummary> summary = (*trainer)->Run(&steps);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  ASSERT_EQ(steps.steps.size(), 3u);
  const double flops_per_token = GPT2FlopsPerToken(GPT2ConfigOf(spec.model), spec.model.seq_len);
  for (const StepMetrics& m : steps.steps) {
    EXPECT_GT(m.mfu, 0);
    EXPECT_DOUBLE_EQ(m.mfu, ModelFlopsUtilization(m.tokens_per_second, flops_per_token, 3e9, 1));
    EXPECT_DOUBLE_EQ(m.tflops * 1e12 / 3e9, m.mfu);
  }
  EXPECT_DOUBLE_EQ(summary->mfu,
                   ModelFlopsUtilization(summary->tokens_per_second, flops_per_token, 3e9, 1));
}

}  // namespace
}  // namespace meshrun
