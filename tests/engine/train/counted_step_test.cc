// CountRank (engine/train/counted_step.h): the engine's own step on the counting device. Here:
// a 70B Llama rank counts in well under a second without allocating its memory, and its figures
// follow the spec as the engine does (sharding divides, activation checkpointing drops
// activations). That the counts equal what the real step allocates, byte for byte, is asserted
// beside the measurements: pipeline_memory_test (every pp mesh) and optimizer_mesh_test (the
// equivalence meshes, both optimizers).
#include "engine/train/counted_step.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/train/memory_model.h"
#include "engine/train/model_shape.h"

namespace meshrun {
namespace {

int64_t MaxRssBytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Llama 3 70B (the planner's preset, engine/train/model_shape.h), 64 sequences of 8,192 per
// dp_shard rank, bf16 on cuda.
JobSpec Llama70B(int tp, int dp_shard, int pp, const std::string& ac) {
  JobSpec spec;
  spec.name = "llama3-70b";
  spec.model = Llama3_70B();
  spec.train.global_batch_size = 64 * dp_shard;
  spec.train.micro_batch_size = 1;
  spec.train.precision = "bf16";
  spec.train.activation_checkpointing = ac;
  spec.data.train = "/dev/null";
  spec.resources.device = "cuda";
  spec.parallelism.tp_size = tp;
  spec.parallelism.dp_shard_size = dp_shard;
  spec.parallelism.pp_size = pp;
  return spec;
}

TEST(CountedStepTest, ASeventyBillionRankCountsFastWithoutItsMemory) {
  const JobSpec spec = Llama70B(8, 128, 1, "full");
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
  const int64_t rss_before = MaxRssBytes();
  const auto t0 = std::chrono::steady_clock::now();
  const StatusOr<CountedRank> counted = CountRank(spec, 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  // 70.6e9 parameters over tp 8 × dp_shard 128: ~69 M floats of shard, and gathered layers of
  // ~860 M / 8 parameters in bf16; activations of 8,192 tokens.
  const int64_t params = counted->memory.peak[static_cast<int>(MemoryKind::kParameters)];
  EXPECT_GT(params, int64_t{200} << 20);
  EXPECT_GT(counted->Total(), int64_t{4} << 30);
  EXPECT_LT(MaxRssBytes() - rss_before, int64_t{512} << 20) << "the count allocated for real";
  EXPECT_LT(seconds, 2.0);
  EXPECT_GT(counted->comm_bytes.at(MeshAxis::kTp), 0);
  const MemoryPrediction model = PredictRankMemory(spec);
  for (int k = 0; k < kNumMemoryKinds - 1; ++k) {
    EXPECT_EQ(counted->memory.peak[k], model.bytes[k])
        << MemoryKindName(static_cast<MemoryKind>(k));
  }
  std::printf("70B rank (tp 8 x dp_shard 128, full AC): counted in %.3f s, %.2f GiB\n", seconds,
              static_cast<double>(counted->Total()) / (1 << 30));
}

TEST(CountedStepTest, TheCountsFollowTheSpecAsTheEngineDoes) {
  const StatusOr<CountedRank> none = CountRank(Llama70B(8, 16, 1, "none"), 0);
  const StatusOr<CountedRank> full = CountRank(Llama70B(8, 16, 1, "full"), 0);
  const StatusOr<CountedRank> wider = CountRank(Llama70B(8, 32, 1, "full"), 0);
  const StatusOr<CountedRank> staged = CountRank(Llama70B(8, 16, 4, "full"), 0);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_TRUE(wider.ok()) << wider.status().ToString();
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  const int act = static_cast<int>(MemoryKind::kActivations);
  const int opt = static_cast<int>(MemoryKind::kOptimizer);
  EXPECT_GT(none->memory.peak[act], 4 * full->memory.peak[act]);
  EXPECT_EQ(none->memory.peak[opt], full->memory.peak[opt]);
  // Twice the shards: half the optimizer state (up to FSDP's padding).
  EXPECT_NEAR(static_cast<double>(wider->memory.peak[opt]),
              static_cast<double>(full->memory.peak[opt]) / 2,
              1e-3 * static_cast<double>(full->memory.peak[opt]));
  // A quarter of the layers on the first of 4 stages (its embedding besides).
  EXPECT_LT(staged->memory.peak[opt], full->memory.peak[opt] / 3);
  EXPECT_GT(staged->comm_bytes.at(MeshAxis::kPp), 0);
}

// A step counts 2 micro-batches (2·pp_size with pp) unless asked for all: the peaks are the same
// as with every one of 32 (or 64), on meshes with FSDP, HSDP, tp, cp and every pp schedule.
TEST(CountedStepTest, AFewMicroBatchesPeakAsHighAsAllOfThem) {
  struct Case {
    std::string arch;
    int P, R, S, C, T;
    std::string schedule;
    std::string ac;
  };
  const std::vector<Case> cases = {
      {"gpt2", 1, 1, 2, 1, 2, "1f1b", "none"},
      {"llama", 1, 2, 2, 1, 1, "1f1b", "full"},
      {"llama", 1, 1, 2, 2, 1, "1f1b", "selective"},
      {"gpt2", 2, 1, 2, 1, 2, "1f1b", "none"},
      {"llama", 4, 1, 1, 2, 1, "1f1b", "full"},
      {"gpt2", 2, 2, 1, 1, 1, "interleaved_1f1b", "none"},
      {"llama", 4, 1, 1, 1, 1, "zero_bubble", "none"},
      {"gpt2", 2, 1, 2, 1, 2, "zero_bubble", "full"},
  };
  for (const Case& c : cases) {
    JobSpec spec;
    spec.model.arch = c.arch;
    spec.model.n_layer = 8;
    spec.model.n_head = 4;
    spec.model.d_model = 32;
    spec.model.seq_len = 16;
    spec.model.vocab_size = 256;
    if (c.arch == "llama") {
      spec.model.n_kv_head = 2;
      spec.model.d_ff = 64;
      spec.model.tie_embeddings = false;
    }
    spec.parallelism.pp_size = c.P;
    spec.parallelism.dp_replicate_size = c.R;
    spec.parallelism.dp_shard_size = c.S;
    spec.parallelism.cp_size = c.C;
    spec.parallelism.tp_size = c.T;
    spec.parallelism.pp_schedule = c.schedule;
    if (c.schedule == "interleaved_1f1b") spec.parallelism.pp_virtual_stages = 2;
    spec.train.activation_checkpointing = c.ac;
    spec.train.micro_batch_size = 1;
    spec.train.global_batch_size = (c.P > 1 ? 64 : 32) * c.R * c.S;
    spec.data.train = "/dev/null";
    ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
    const ParallelDims dims = *MeshOf(spec);
    for (int rank : {0, dims.world_size() - 1}) {
      SCOPED_TRACE(c.arch + " pp" + std::to_string(c.P) + " " + c.schedule + " ac " + c.ac +
                   " rank " + std::to_string(rank));
      const StatusOr<CountedRank> few = CountRank(spec, rank);
      const StatusOr<CountedRank> all = CountRank(spec, rank, {.every_micro_batch = true});
      ASSERT_TRUE(few.ok()) << few.status().ToString();
      ASSERT_TRUE(all.ok()) << all.status().ToString();
      for (int k = 0; k < kNumMemoryKinds; ++k) {
        EXPECT_EQ(few->memory.peak[k], all->memory.peak[k])
            << MemoryKindName(static_cast<MemoryKind>(k));
      }
    }
  }
}

TEST(CountedStepTest, ARankOutsideTheMeshIsRefused) {
  const StatusOr<CountedRank> counted = CountRank(Llama70B(8, 2, 1, "full"), 16);
  EXPECT_EQ(counted.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun
