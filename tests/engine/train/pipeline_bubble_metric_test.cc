// The pipeline's bubble in a rank's step metrics (decision 0060): under pp every rank reports
// its measured bubble (a part of its step) and, beside it, its schedule's theory
// (PipelineBubbleTheory over the step's micro-batches and the rank's chunks; zero-bubble's at
// the rank's operation times of the step, decision 0068); without pp, neither.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/fake_backend.h"
#include "engine/comm/store.h"
#include "engine/train/pipeline.h"
#include "engine/train/trainer.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

struct BubbleSeen {
  std::vector<double> measured, theory;
  // Per step, the seconds of one operation of each kind (pipeline_op_seconds ÷ pipeline_ops).
  std::vector<std::vector<double>> op_seconds;
};

class RecordBubbles : public TrainObserver {
 public:
  explicit RecordBubbles(BubbleSeen* out) : out_(out) {}
  void OnStep(const StepMetrics& m) override {
    out_->measured.push_back(m.pipeline_bubble_ratio);
    out_->theory.push_back(m.pipeline_bubble_theory);
    std::vector<double> each(4, 0.0);
    for (int k = 0; k < 4; ++k) {
      if (m.pipeline_ops[k] > 0) each[k] = m.pipeline_op_seconds[k] / m.pipeline_ops[k];
    }
    out_->op_seconds.push_back(each);
  }

 private:
  BubbleSeen* out_;
};

class PipelineBubbleMetricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_bubble_metric_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::ofstream out(dir_ / "train.txt");
    for (int line = 0; line < 200; ++line) out << "line " << line << " of words to read\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  JobSpec Spec(int pp, const std::string& schedule, int virtual_stages) const {
    JobSpec spec;
    spec.name = "bubble-metric-test";
    spec.model.arch = "llama";
    spec.model.n_layer = 4;
    spec.model.n_head = 4;
    spec.model.n_kv_head = 2;
    spec.model.d_model = 32;
    spec.model.d_ff = 64;
    spec.model.seq_len = 16;
    spec.model.vocab_size = 256;
    spec.model.tie_embeddings = false;
    spec.parallelism.pp_size = pp;
    spec.parallelism.pp_schedule = schedule;
    spec.parallelism.pp_virtual_stages = virtual_stages;
    spec.parallelism.comm_timeout_seconds = 60;
    spec.train.steps = 2;
    spec.train.global_batch_size = 8;
    spec.train.micro_batch_size = 2;  // 4 micro-batches
    spec.data.train = (dir_ / "train.txt").string();
    spec.data.format = "text";
    spec.resources.threads = 1;
    return spec;
  }

  // Every rank of the spec's mesh as a thread over the fake backend.
  static std::vector<BubbleSeen> Run(const JobSpec& spec) {
    const ParallelDims dims = MeshOf(spec).value();
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
    const int world = dims.world_size();
    auto backend = std::make_shared<FakeBackend>();
    std::shared_ptr<Store> store = std::make_shared<InMemoryStore>();
    std::vector<BubbleSeen> seen(world);
    std::vector<Status> status(world, OkStatus());
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        status[rank] = [&]() -> Status {
          RankContext ctx;
          ctx.rank = rank;
          if (world > 1) {
            MeshCommsOptions options;
            options.timeout = std::chrono::seconds(60);
            MESHRUN_ASSIGN_OR_RETURN(ctx.comms,
                                     MeshComms::Create(dims, rank, store, *backend,
                                                       std::make_shared<CommStats>(), options));
            ctx.store = store;
          }
          TrainOptions options;
          options.peak_flops = 1e12;
          MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                                   Trainer::Create(spec, options, ctx));
          RecordBubbles observer(&seen[rank]);
          return trainer->Run(&observer).status();
        }();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_TRUE(status[rank].ok()) << "rank " << rank << ": " << status[rank].ToString();
    }
    return seen;
  }

  fs::path dir_;
};

// ZB-H1's bubble (P − 1)(t_F + t_B − t_W) over a stage's work M (t_F + t_B + t_W) plus it.
TEST(PipelineBubbleTheoryTest, ZeroBubblesTheoryFollowsTheSplitOfTheBackward) {
  // Equal times (F + B = 2t, W = t), given or not: (P − 1)/(3M + P − 1).
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kZeroBubble, 2, 8, 1), 1.0 / 25);
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kZeroBubble, 2, 8, 1, 2e-3, 1e-3), 1.0 / 25);
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kZeroBubble, 4, 8, 1, 0, 0), 3.0 / 27);
  // B twice W (F = W): (F + B − W) = 2W of a stage's 4W per micro-batch: 2/(32 + 2) at P 2.
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kZeroBubble, 2, 8, 1, 3, 1), 2.0 / 34);
  // A weight pass as long as forward and backward together leaves no bubble.
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kZeroBubble, 2, 8, 1, 1, 1), 0.0);
  // 1F1B and interleaved do not depend on the times.
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::k1F1B, 2, 8, 1, 3, 1), 1.0 / 9);
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kInterleaved1F1B, 2, 8, 2, 3, 1), 1.0 / 17);
}

TEST_F(PipelineBubbleMetricTest, ZeroBubbleReportsItsTheoryAtEachStagesOperationTimes) {
  const std::vector<BubbleSeen> ranks = Run(Spec(2, "zero_bubble", 1));
  ASSERT_EQ(ranks.size(), 2u);
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    SCOPED_TRACE("stage " + std::to_string(rank));
    const BubbleSeen& r = ranks[rank];
    ASSERT_EQ(r.theory.size(), 2u);
    for (size_t k = 0; k < r.theory.size(); ++k) {
      const std::vector<double>& t = r.op_seconds[k];
      // Stage 0 runs forwards and backwards; the last stage its fused backward; both weights.
      const double forward_backward = rank == 0 ? t[0] + t[1] : t[3];
      ASSERT_GT(forward_backward, 0.0);
      ASSERT_GT(t[2], 0.0);
      EXPECT_DOUBLE_EQ(r.theory[k], PipelineBubbleTheory(PpSchedule::kZeroBubble, 2, 4, 1,
                                                         forward_backward, t[2]))
          << "step " << k + 1;
      // Not the equal-times figure (a measured B + F is not exactly twice W).
      EXPECT_NE(r.theory[k], PipelineBubbleTheory(PpSchedule::kZeroBubble, 2, 4, 1));
    }
  }
}

TEST_F(PipelineBubbleMetricTest, EveryStageReportsItsScheduleTheoryBesideTheMeasurement) {
  for (const auto& [schedule, v] :
       std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"interleaved_1f1b", 2}}) {
    SCOPED_TRACE(schedule);
    const std::vector<BubbleSeen> ranks = Run(Spec(2, schedule, v));
    ASSERT_EQ(ranks.size(), 2u);
    // (P − 1)/(M + P − 1) = 1/5 under 1F1B, (P − 1)/(v·M + P − 1) = 1/9 interleaved.
    const double want = v == 1 ? 1.0 / 5 : 1.0 / 9;
    EXPECT_DOUBLE_EQ(PipelineBubbleTheory(*ParsePpSchedule(schedule), 2, 4, v), want);
    for (const BubbleSeen& r : ranks) {
      ASSERT_EQ(r.theory.size(), 2u);
      for (size_t k = 0; k < r.theory.size(); ++k) {
        EXPECT_DOUBLE_EQ(r.theory[k], want) << "step " << k + 1;
        EXPECT_GE(r.measured[k], 0.0);
        EXPECT_LE(r.measured[k], 1.0);
      }
    }
  }
}

TEST_F(PipelineBubbleMetricTest, WithoutAPipelineNeither) {
  const std::vector<BubbleSeen> ranks = Run(Spec(1, "1f1b", 1));
  ASSERT_EQ(ranks.size(), 1u);
  ASSERT_EQ(ranks[0].theory.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(ranks[0].theory[k], 0.0);
    EXPECT_EQ(ranks[0].measured[k], 0.0);
  }
}

}  // namespace
}  // namespace meshrun
