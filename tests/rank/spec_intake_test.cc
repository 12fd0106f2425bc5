// The rank's own memory check (rank/spec_intake.h): a spec whose sizes come from
// model.init_from's config.json reaches the worker without them, so the rank checks itself
// before allocating anything, against the worker's --memory-bytes, with its own step counted on
// the counting device (engine/train/counted_step.h): a Llama whose d_ff cannot fit is refused
// naming the counted bytes; one that fits is accepted.
#include "rank/spec_intake.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/memory_estimate.h"
#include "engine/train/counted_step.h"
#include "proto/spec_convert.h"

namespace meshrun::rank {
namespace {

namespace fs = std::filesystem;

class SpecIntakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spec-intake-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A Llama folder (config.json only) with `d_ff`, and the RankStart of one rank of a 1-rank
  // job initialised from it, on a worker with `memory_bytes`.
  v1::RankStart StartWith(int d_ff, int64_t memory_bytes) {
    const fs::path folder = dir_ / ("llama-" + std::to_string(d_ff));
    fs::create_directories(folder);
    std::ofstream(folder / "config.json")
        << R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": )"
        << d_ff << R"(, "vocab_size": 256, "max_position_embeddings": 4096})";
    JobSpec spec;
    spec.name = "t";
    spec.model.init_from = folder.string();
    spec.model.seq_len = 64;
    spec.data.train = "/dev/null";
    v1::RankStart start;
    v1::RankAssignment* a = start.mutable_assignment();
    a->set_job_id("job-1");
    a->set_attempt(1);
    a->set_rank(0);
    a->set_world_size(1);
    a->set_local_world_size(1);
    *a->mutable_spec() = JobSpecToProto(spec);
    // Left to config.json, as a user who names only init_from leaves them.
    v1::ModelSpec* m = a->mutable_spec()->mutable_model();
    m->clear_arch();
    m->clear_n_layer();
    m->clear_n_head();
    m->clear_n_kv_head();
    m->clear_d_model();
    m->clear_d_ff();
    m->clear_vocab_size();
    m->clear_tie_embeddings();
    start.set_memory_bytes(memory_bytes);
    return start;
  }

  fs::path dir_;
};

TEST_F(SpecIntakeTest, ARankThatCannotFitIsRefusedWithItsCountedBytes) {
  const StatusOr<JobSpec> fits = SpecOfRankStart(StartWith(128, int64_t{64} << 20));
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(fits->model.d_ff, 128);

  // d_ff 200,000: 2 layers × 3 × 64 × 200,000 floats of parameters, as many of gradients and
  // twice as many of AdamW's moments: ~0.6 GB, over a 64 MiB worker.
  const v1::RankStart start = StartWith(200'000, int64_t{64} << 20);
  const StatusOr<JobSpec> refused = SpecOfRankStart(start);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("--memory-bytes"), std::string::npos);
  EXPECT_NE(refused.status().message().find("(the engine's own step, counted)"), std::string::npos)
      << refused.status().message();
}

// Sizes in the spec: the worker let it through on its lower bound (parameters, gradients, moments
// and one micro-batch's activations), but the step's own count (with the head's and the
// attention's buffers, the gathered and communication buffers) does not fit, so the rank stops
// before allocating.
TEST_F(SpecIntakeTest, TheRankRefusesWhatTheWorkersLowerBoundLetThrough) {
  v1::RankStart start = StartWith(128, 1);
  JobSpec spec = *JobSpecFromProto(start.assignment().spec());
  spec.model.init_from.clear();
  spec.model.arch = "llama";
  spec.model.n_layer = 2;
  spec.model.n_head = 4;
  spec.model.n_kv_head = 2;
  spec.model.d_model = 64;
  spec.model.d_ff = 128;
  spec.model.vocab_size = 256;
  spec.model.tie_embeddings = false;
  spec.model.seq_len = 256;
  spec.train.micro_batch_size = 8;
  spec.train.global_batch_size = 8;
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
  *start.mutable_assignment()->mutable_spec() = JobSpecToProto(spec);
  const double bound = EstimateRankMemory(spec, *MeshOf(spec)).total();
  const StatusOr<CountedRank> counted = CountRank(spec, 0);
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  double exact = 0;
  for (int k = 0; k < kNumMemoryKinds; ++k) exact += counted->memory.peak[k];
  ASSERT_LT(bound, exact) << "the case must sit between the two";

  start.set_memory_bytes(static_cast<int64_t>((bound + exact) / 2));
  const StatusOr<JobSpec> refused = SpecOfRankStart(start);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("(the engine's own step, counted)"), std::string::npos);
  start.set_memory_bytes(static_cast<int64_t>(exact) + 1);
  EXPECT_TRUE(SpecOfRankStart(start).ok());
}

}  // namespace
}  // namespace meshrun::rank
