// The rank's own memory check (rank/spec_intake.h): a spec whose sizes come from
// model.init_from's config.json reaches the worker without them, so the rank checks itself
// before allocating anything, against the worker's --memory-bytes, with its own step counted on
// the counting device (engine/train/counted_step.h): a Llama whose d_ff cannot fit is refused
// naming the counted bytes; one that fits is accepted. Sizes the spec carried were the worker's
// to check, and the rank does not count them again.
#include "rank/spec_intake.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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

// Sizes in the spec (ModelSizesSent): the worker counted the rank's step before starting it
// (worker_memory_test), so the rank does not count it again, however little --memory-bytes it
// is told; with the same sizes left to init_from it does.
TEST_F(SpecIntakeTest, TheRankCountsOnlyWhatTheWorkerCouldNot) {
  v1::RankStart left_out = StartWith(200'000, int64_t{64} << 20);
  ASSERT_EQ(SpecOfRankStart(left_out).status().code(), StatusCode::kResourceExhausted);

  v1::RankStart sent = left_out;
  const StatusOr<JobSpec> filled = SpecOfRankStart(StartWith(200'000, 0));
  ASSERT_TRUE(filled.ok()) << filled.status().ToString();
  *sent.mutable_assignment()->mutable_spec() = JobSpecToProto(*filled);
  ASSERT_TRUE(ModelSizesSent(sent.assignment().spec()));
  const StatusOr<JobSpec> accepted = SpecOfRankStart(sent);
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_EQ(accepted->model.d_ff, 200'000);
}

}  // namespace
}  // namespace meshrun::rank
