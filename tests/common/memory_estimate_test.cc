// EstimateRankMemory and CheckRankMemory: sizes that cannot fit are refused before a rank
// starts, with the sizes and the flag named; real small models fit; no size overflows.
#include "common/memory_estimate.h"

#include <gtest/gtest.h>

#include <limits>

namespace meshrun {
namespace {

ParallelDims Mesh(int r, int s, int c, int t) {
  return ParallelDims::Create(r, s, c, t).value();
}

TEST(MemoryEstimateTest, GptTwoSmallParameterCount) {
  JobSpec spec;
  spec.model.n_layer = 12;
  spec.model.n_head = 12;
  spec.model.d_model = 768;
  spec.model.seq_len = 1024;
  spec.model.vocab_size = 50257;
  const RankMemoryEstimate e = EstimateRankMemory(spec, Mesh(1, 1, 1, 1));
  // GPT-2 small: 124,439,808 parameters with the position embedding.
  EXPECT_NEAR(e.parameters, 124.44e6, 0.01e6);
  EXPECT_NEAR(e.state_bytes, e.parameters * 16, 1);
  // Sharding divides the state over tp·dp_shard·cp.
  EXPECT_NEAR(EstimateRankMemory(spec, Mesh(1, 2, 1, 2)).state_bytes, e.state_bytes / 4, 1);
}

TEST(MemoryEstimateTest, TheDefaultSpecFits) {
  EXPECT_TRUE(CheckRankMemory(JobSpec(), Mesh(1, 1, 1, 1), 8, 1e9, "--memory-bytes").ok());
}

TEST(MemoryEstimateTest, HugeSizesAreRefusedWithoutOverflow) {
  JobSpec spec;
  spec.model.n_layer = std::numeric_limits<int>::max();
  spec.model.vocab_size = std::numeric_limits<int>::max();
  spec.model.seq_len = std::numeric_limits<int>::max();
  spec.model.d_model = 1 << 30;
  const RankMemoryEstimate e = EstimateRankMemory(spec, Mesh(1, 1, 1, 1));
  EXPECT_GT(e.total(), 1e29);
  Status s = CheckRankMemory(spec, Mesh(1, 1, 1, 1), 1, 64.0 * (1 << 30), "--memory-bytes");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().rfind("model: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("n_layer 2147483647"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("of the worker's --memory-bytes (hint: "), std::string::npos)
      << s.message();
  // 0 available: no check.
  EXPECT_TRUE(CheckRankMemory(spec, Mesh(1, 1, 1, 1), 1, 0, "--memory-bytes").ok());
}

TEST(MemoryEstimateTest, RanksOnOneHostShareItsMemory) {
  JobSpec spec;
  spec.model.n_layer = 12;
  spec.model.n_head = 12;
  spec.model.d_model = 768;
  spec.model.seq_len = 1024;
  spec.model.vocab_size = 50257;
  const double one = EstimateRankMemory(spec, Mesh(1, 1, 1, 1)).total();
  EXPECT_TRUE(CheckRankMemory(spec, Mesh(1, 1, 1, 1), 1, one * 1.5, "--memory-bytes").ok());
  EXPECT_FALSE(CheckRankMemory(spec, Mesh(1, 1, 1, 1), 2, one * 1.5, "--memory-bytes").ok());
}

// CheckJobFitsHost (validate, train, submit): INVALID_ARGUMENT naming the field behind the
// largest term, the ranks of this host counted.
TEST(MemoryEstimateTest, CheckJobFitsHostNamesTheFieldThatDrivesTheEstimate) {
  JobSpec wide;
  wide.model.d_model = 65536;
  wide.model.n_layer = 48;
  Status s = CheckJobFitsHost(wide, Mesh(1, 1, 1, 1), 1, 64.0 * (1 << 30));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("model.d_model: n_layer 48, d_model 65536", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("(hint: "), std::string::npos);
  JobSpec vocab;
  vocab.model.vocab_size = 1 << 30;
  s = CheckJobFitsHost(vocab, Mesh(1, 1, 1, 1), 1, 64.0 * (1 << 30));
  EXPECT_EQ(s.message().rfind("model.vocab_size: ", 0), 0u) << s.message();
  JobSpec micro;
  micro.model.seq_len = 1 << 20;  // 2^26 tokens of activations (no T×T attention scores)
  micro.train.micro_batch_size = 64;
  micro.train.global_batch_size = 64;
  s = CheckJobFitsHost(micro, Mesh(1, 1, 1, 1), 1, 64.0 * (1 << 30));
  EXPECT_EQ(s.message().rfind("train.micro_batch_size: ", 0), 0u) << s.message();
  // The default spec fits; 0 bytes: no check; more ranks on the host need more.
  EXPECT_TRUE(CheckJobFitsHost(JobSpec(), Mesh(1, 1, 1, 1), 8, 1e9).ok());
  EXPECT_TRUE(CheckJobFitsHost(wide, Mesh(1, 1, 1, 1), 1, 0).ok());
  const double one = EstimateRankMemory(JobSpec(), Mesh(1, 1, 1, 1)).total();
  EXPECT_TRUE(CheckJobFitsHost(JobSpec(), Mesh(1, 1, 1, 1), 1, one * 1.5).ok());
  EXPECT_FALSE(CheckJobFitsHost(JobSpec(), Mesh(1, 1, 1, 1), 2, one * 1.5).ok());
  // A fuller model's figure (the engine's memory model) replaces the lower bound.
  const Status exact = CheckJobFitsHost(JobSpec(), Mesh(1, 1, 1, 1), 1, one * 1.5, one * 2);
  EXPECT_FALSE(exact.ok());
  EXPECT_NE(exact.message().find("(the engine's own step, counted, over"), std::string::npos)
      << exact.message();
}

}  // namespace
}  // namespace meshrun
