// The worker's pre-start estimate (common/memory_estimate.h, pure, in double) against the
// engine's memory model (engine/train/memory_model.h) it restates for a worker that does not
// link the engine: the parameter count equals the layout's, and for GPT-2 and the Llama family
// (d_ff, grouped-query heads, an untied head, q/k/v biases, activation checkpointing, tp) the
// estimate is the model's figure without FSDP, and a lower bound within a factor of 2 with it.
#include <gtest/gtest.h>

#include <limits>

#include "common/memory_estimate.h"
#include "engine/model/gpt2.h"
#include "engine/train/memory_model.h"

namespace meshrun {
namespace {

JobSpec LlamaSpec(int d_ff, int kv_heads, bool tied) {
  JobSpec spec;
  spec.model.arch = "llama";
  spec.model.n_layer = 3;
  spec.model.n_head = 8;
  spec.model.n_kv_head = kv_heads;
  spec.model.d_model = 128;
  spec.model.d_ff = d_ff;
  spec.model.vocab_size = 1000;
  spec.model.seq_len = 64;
  spec.model.tie_embeddings = tied;
  return spec;
}

struct EstimateCase {
  const char* what;
  JobSpec spec;
};

std::vector<EstimateCase> EstimateCases() {
  std::vector<EstimateCase> cases;
  cases.push_back({"gpt2 default", JobSpec()});
  JobSpec gpt2;
  gpt2.model.n_layer = 4;
  gpt2.model.n_head = 8;
  gpt2.model.d_model = 256;
  gpt2.model.seq_len = 128;
  gpt2.model.vocab_size = 5000;
  cases.push_back({"gpt2 256", gpt2});
  JobSpec untied = gpt2;
  untied.model.tie_embeddings = false;
  cases.push_back({"gpt2 untied", untied});
  cases.push_back({"llama gqa untied", LlamaSpec(344, 2, false)});
  cases.push_back({"llama mha tied", LlamaSpec(512, 8, true)});
  cases.push_back({"llama d_ff 200000", LlamaSpec(200000, 4, false)});
  JobSpec bias = LlamaSpec(344, 2, false);
  bias.model.attention_bias = true;
  cases.push_back({"llama q/k/v bias", bias});
  JobSpec selective = LlamaSpec(344, 2, false), full = selective;
  selective.train.activation_checkpointing = "selective";
  full.train.activation_checkpointing = "full";
  cases.push_back({"llama selective", selective});
  cases.push_back({"llama full recompute", full});
  JobSpec tp = LlamaSpec(344, 2, false);
  tp.parallelism.tp_size = 2;
  cases.push_back({"llama tp 2", tp});
  // Gemma: heads of 32 wide, so q/k/v/o are 8·32 = 256 wide over a d_model of 128.
  JobSpec gemma = LlamaSpec(344, 2, true);
  gemma.model.arch = "gemma";
  gemma.model.head_dim = 32;
  cases.push_back({"gemma head_dim 32", gemma});
  JobSpec gemma_tp = gemma;
  gemma_tp.parallelism.tp_size = 2;
  cases.push_back({"gemma head_dim 32 tp 2", gemma_tp});
  JobSpec fsdp = LlamaSpec(344, 2, false);
  fsdp.parallelism.dp_shard_size = 2;
  cases.push_back({"llama dp_shard 2", fsdp});
  JobSpec fsdp_cp = fsdp;
  fsdp_cp.parallelism.cp_size = 2;
  cases.push_back({"llama dp_shard 2 cp 2", fsdp_cp});
  return cases;
}

ParallelDims SpecMesh(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  return ParallelDims::Create(p.dp_replicate_size, p.dp_shard_size, p.cp_size, p.tp_size).value();
}

TEST(MemoryEstimateModelTest, ParameterCountIsTheLayouts) {
  for (EstimateCase c : EstimateCases()) {
    c.spec.data.train = "train.bin";  // ValidateJobSpec asks for one
    const Status valid = ValidateJobSpec(c.spec, SpecMesh(c.spec).world_size());
    ASSERT_TRUE(valid.ok()) << c.what << ": " << valid.message();
    const std::vector<ParamInfo> layout = GPT2ParamLayout(GPT2ConfigOf(c.spec.model));
    double numel = 0;
    for (const ParamInfo& p : layout) numel += static_cast<double>(p.numel);
    EXPECT_EQ(EstimateRankMemory(c.spec, ParallelDims::Create(1, 1, 1, 1).value()).parameters,
              numel)
        << c.what;
  }
}

TEST(MemoryEstimateModelTest, EstimateFollowsTheEnginesMemoryModel) {
  for (const EstimateCase& c : EstimateCases()) {
    const double estimate = EstimateRankMemory(c.spec, SpecMesh(c.spec)).total();
    const double model = static_cast<double>(PredictRankMemory(c.spec).peak_bytes);
    if (c.spec.parallelism.dp_shard_size * c.spec.parallelism.cp_size == 1) {
      // Without FSDP the model holds exactly these buffers (tp keeps the norms whole, which
      // the estimate divides: a few parts in a thousand).
      EXPECT_NEAR(estimate, model, 0.01 * model) << c.what;
    } else {
      // FSDP adds the gathered units and the reduce-scatter's buffers.
      EXPECT_LE(estimate, model) << c.what;
      EXPECT_GE(estimate, 0.5 * model) << c.what;
    }
  }
}

// The case of the issue: a Llama with d_ff 200,000 (GPT-2's formula saw none of its MLP) and
// one with d_ff 2^31−1 (which must be refused, not wrap to a small figure).
TEST(MemoryEstimateModelTest, AWideLlamaMlpIsCounted) {
  const ParallelDims one = ParallelDims::Create(1, 1, 1, 1).value();
  JobSpec wide = LlamaSpec(200000, 4, false);
  wide.model.d_model = 64;
  wide.model.n_head = 4;
  wide.model.n_layer = 2;
  EXPECT_GT(EstimateRankMemory(wide, one).total(), 1e9);
  Status s = CheckRankMemory(wide, one, 1, 200e6, "--memory-bytes");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("d_ff 200000"), std::string::npos) << s.message();
  wide.model.d_ff = std::numeric_limits<int>::max();
  EXPECT_GT(EstimateRankMemory(wide, one).total(), 1e12);
  EXPECT_FALSE(CheckRankMemory(wide, one, 1, 64.0 * (1 << 30), "--memory-bytes").ok());
  s = CheckJobFitsHost(wide, one, 1, 64.0 * (1 << 30));
  EXPECT_EQ(s.message().rfind("model.d_ff: ", 0), 0u) << s.message();
}

}  // namespace
}  // namespace meshrun
