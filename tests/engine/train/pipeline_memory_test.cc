// The memory model of a pipeline stage (decision 0061) against what the engine allocates: every
// rank of the in-process meshes of issue 33 (ranks as threads over the fake backend, each
// counting its own tensors: pipeline_mesh_runner.h) peaks at exactly the bytes of each kind
// PredictRankMemory predicts for its stage — pp 2 × dp_shard 2 × tp 2, pp 4 × cp 2 (ring),
// pp 2 × dp_replicate 2 × cp 2 (1F1B and interleaved with 2 virtual stages) and pp 4 with 6
// layers, GPT-2 and Llama, activation checkpointing none and full (selective on some), and
// pp 2 × dp_shard 2 × tp 2, pp 4 × cp 2 and pp 4 with 6 layers under zero_bubble (its
// weight-gradient stashes counted, FSDP's split backward simulated). And under
// 1F1B a stage's activation memory does not grow with the micro-batches: the first stage holds
// one micro-batch's activations and at most P received buffers whatever their number.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/model/gpt2.h"
#include "engine/train/counted_step.h"
#include "engine/train/memory_model.h"
#include "engine/train/pipeline.h"
#include "tests/engine/train/pipeline_mesh_runner.h"

namespace meshrun {
namespace {

struct PpMemoryCase {
  std::string arch;
  int layers = 4;
  int P = 1, R = 1, S = 1, C = 1, T = 1;
  int v = 1;        // > 1: interleaved_1f1b with v virtual stages
  bool zb = false;  // zero_bubble
  std::string ac = "none";
  std::string Name() const {
    std::string n = arch + "_pp" + std::to_string(P);
    if (R > 1) n += "_dpr" + std::to_string(R);
    if (S > 1) n += "_dps" + std::to_string(S);
    if (C > 1) n += "_cp" + std::to_string(C);
    if (T > 1) n += "_tp" + std::to_string(T);
    n += "_" + std::to_string(layers) + "layers";
    if (v > 1) n += "_interleaved" + std::to_string(v);
    if (zb) n += "_zero_bubble";
    return n + "_ac_" + ac;
  }
};

void PrintTo(const PpMemoryCase& c, std::ostream* os) {
  *os << c.Name();
}

class PipelineMemoryTest : public PipelineMeshRunner,
                           public ::testing::WithParamInterface<PpMemoryCase> {
 public:
  // Two steps and an evaluation after each: every buffer a run ever allocates is there by then
  // (the pools grow in the first step, the evaluation reuses what training left).
  static JobSpec MemorySpec(const PpMemoryCase& c, int global_batch = 8) {
    JobSpec spec = Spec(c.arch, c.layers, {.P = c.P, .S = c.S, .T = c.T, .R = c.R, .C = c.C});
    spec.name = "pipeline-memory-test";
    spec.parallelism.cp_comm_strategy = "ring";
    if (c.v > 1) {
      spec.parallelism.pp_schedule = "interleaved_1f1b";
      spec.parallelism.pp_virtual_stages = c.v;
    }
    if (c.zb) spec.parallelism.pp_schedule = "zero_bubble";
    spec.train.activation_checkpointing = c.ac;
    spec.train.steps = 2;
    spec.train.global_batch_size = global_batch;
    spec.train.min_lr = TrainSpec().min_lr;
    spec.train.warmup_steps = 1;
    spec.data.eval_every = 1;
    return spec;
  }

  // Each rank's measured peaks of every kind the model predicts (not "other": token ids and
  // host tables mirrored on the device) equal its stage's prediction; the largest rank's equal
  // PredictRankMemory(spec).
  static void ExpectRanksAsPredicted(const JobSpec& spec,
                                     const std::vector<StatusOr<PipeStepRecord>>& ranks) {
    const int P = spec.parallelism.pp_size;
    const int per_stage = static_cast<int>(ranks.size()) / P;
    const std::vector<MemoryPrediction> stages = PredictStagesMemory(spec);
    ASSERT_EQ(stages.size(), static_cast<size_t>(P));
    MemoryBreakdown largest;
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      ASSERT_TRUE(ranks[rank].ok()) << ranks[rank].status().ToString();
      const int stage = static_cast<int>(rank) / per_stage;
      const MemoryPrediction& want = stages[static_cast<size_t>(stage)];
      const MemoryPrediction one = PredictRankMemory(spec, stage);
      const StatusOr<CountedRank> counted = CountRank(spec, static_cast<int>(rank));
      ASSERT_TRUE(counted.ok()) << counted.status().ToString();
      for (int k = 0; k < kNumMemoryKinds - 1; ++k) {
        const int64_t got = ranks[rank]->memory.peak[k];
        EXPECT_EQ(got, want.bytes[k])
            << "stage " << stage << ": " << MemoryKindName(static_cast<MemoryKind>(k));
        EXPECT_EQ(counted->memory.peak[k], got)
            << "counted, stage " << stage << ": " << MemoryKindName(static_cast<MemoryKind>(k));
        EXPECT_EQ(one.bytes[k], want.bytes[k]);
        largest.peak[k] = std::max(largest.peak[k], got);
      }
    }
    const MemoryPrediction all = PredictRankMemory(spec);
    for (int k = 0; k < kNumMemoryKinds - 1; ++k) {
      EXPECT_EQ(largest.peak[k], all.bytes[k]) << MemoryKindName(static_cast<MemoryKind>(k));
    }
  }
};

TEST_P(PipelineMemoryTest, EveryRankPeaksAtItsStagesPrediction) {
  const JobSpec spec = MemorySpec(GetParam());
  const std::vector<StatusOr<PipeStepRecord>> ranks = RunMeshInProcess(spec);
  ASSERT_FALSE(ranks.empty());
  ExpectRanksAsPredicted(spec, ranks);
  // The stages differ: the prediction is not one figure for every stage.
  const std::vector<MemoryPrediction> stages = PredictStagesMemory(spec);
  if (spec.parallelism.pp_size > 1) {
    EXPECT_NE(stages.front().of(MemoryKind::kParameters),
              stages.back().of(MemoryKind::kParameters));
  }
}

std::vector<PpMemoryCase> PipelineMemoryCases() {
  std::vector<PpMemoryCase> out;
  for (const std::string arch : {"gpt2", "llama"}) {
    for (const std::string ac : {"none", "full"}) {
      out.push_back({.arch = arch, .P = 2, .S = 2, .T = 2, .ac = ac});
      out.push_back({.arch = arch, .P = 4, .C = 2, .ac = ac});
      out.push_back({.arch = arch, .P = 2, .R = 2, .C = 2, .ac = ac});
      out.push_back({.arch = arch, .P = 2, .R = 2, .C = 2, .v = 2, .ac = ac});
      out.push_back({.arch = arch, .layers = 6, .P = 4, .ac = ac});
    }
    // Without pp (the model's terms for a whole model, also under an evaluation), selective
    // checkpointing, and the interleaved schedule under FSDP and tp.
    out.push_back({.arch = arch, .S = 2, .T = 2});
    out.push_back({.arch = arch, .R = 2, .C = 2});
    out.push_back({.arch = arch, .P = 2, .S = 2, .T = 2, .v = 2, .ac = "selective"});
    out.push_back({.arch = arch, .layers = 6, .P = 4, .ac = "selective"});
    // Zero-bubble: its weight-gradient stashes beside 1F1B's receive buffers (and FSDP's
    // split backward: B gathers, W reduce-scatters).
    for (const std::string ac : {"none", "full"}) {
      out.push_back({.arch = arch, .P = 2, .S = 2, .T = 2, .zb = true, .ac = ac});
      out.push_back({.arch = arch, .P = 4, .C = 2, .zb = true, .ac = ac});
      out.push_back({.arch = arch, .layers = 6, .P = 4, .zb = true, .ac = ac});
    }
    out.push_back({.arch = arch, .layers = 6, .P = 4, .zb = true, .ac = "selective"});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(IssueMeshes, PipelineMemoryTest,
                         ::testing::ValuesIn(PipelineMemoryCases()),
                         [](const ::testing::TestParamInfo<PpMemoryCase>& info) {
                           return info.param.Name();
                         });

// 1F1B keeps a stage's memory independent of the micro-batches: with 16 micro-batches every
// stage of pp 4 peaks where it peaks with 4, and the first stage holds one micro-batch's
// activations of its layers and at most P = 4 received buffers (it holds 1). A stage that kept
// each micro-batch's input or output gradient would hold 16 at 16 micro-batches.
TEST_F(PipelineMemoryTest, OneFOneBHoldsAtMostPMicroBatchesAtStageZero) {
  const PpMemoryCase c{.arch = "gpt2", .P = 4};
  const JobSpec four = MemorySpec(c, /*global_batch=*/8), sixteen = MemorySpec(c, 32);
  ASSERT_EQ(sixteen.train.global_batch_size / sixteen.train.micro_batch_size, 16);
  const std::vector<StatusOr<PipeStepRecord>> few = RunMeshInProcess(four);
  const std::vector<StatusOr<PipeStepRecord>> many = RunMeshInProcess(sixteen);
  ASSERT_EQ(few.size(), 4u);
  ASSERT_EQ(many.size(), 4u);
  const int a = static_cast<int>(MemoryKind::kActivations);
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE("stage " + std::to_string(p));
    ASSERT_TRUE(few[p].ok()) << few[p].status().ToString();
    ASSERT_TRUE(many[p].ok()) << many[p].status().ToString();
    EXPECT_EQ(many[p]->memory.peak[a], few[p]->memory.peak[a]);
    EXPECT_LE(PipelineBuffersAtPeak(sixteen, p), 4 - p + 2);
  }
  ExpectRanksAsPredicted(sixteen, many);
  // Stage 0 reads tokens, not inputs: what it receives is output gradients, at most P of them
  // at once (1 here), each one micro-batch's activation.
  const int held = PipelineBuffersAtPeak(sixteen, 0);
  EXPECT_GE(held, 1);
  EXPECT_LE(held, 4);
}

// Zero-bubble's stash term: stage p holds min(p + 1, M) stashes at once (MaxPendingWeightGrads of
// its schedule), each the model's own WeightStashNumel of the stage's layers, which the memory
// model mirrors (PipelineWeightStashNumel); 1F1B holds none.
TEST_F(PipelineMemoryTest, ZeroBubbleStashesAreTheModelsWeightStashes) {
  for (const PpMemoryCase& c : PipelineMemoryCases()) {
    if (!c.zb) continue;
    SCOPED_TRACE(c.Name());
    const JobSpec spec = MemorySpec(c);
    const int P = c.P, M = 8 / spec.train.micro_batch_size / (c.R * c.S);
    const std::vector<int> layers = PipelineLayers(spec);
    int begin = 0;
    for (int p = 0; p < P; ++p) {
      SCOPED_TRACE("stage " + std::to_string(p));
      EXPECT_EQ(PipelineWeightStashesAtPeak(spec, p), std::min(p + 1, M));
      GPT2Config cfg = GPT2ConfigOf(spec.model);
      cfg.tp_size = c.T;
      cfg.fsdp_size = c.S * c.C;
      cfg.chunks.emplace_back(begin, begin + layers[static_cast<size_t>(p)]);
      cfg.stage_first = p == 0;
      cfg.stage_last = p == P - 1;
      begin += layers[static_cast<size_t>(p)];
      const GPT2<float> model(cfg);
      EXPECT_EQ(PipelineWeightStashNumel(spec, p),
                model.WeightStashNumel(spec.train.micro_batch_size, spec.model.seq_len / c.C));
      JobSpec one_f_one_b = spec;
      one_f_one_b.parallelism.pp_schedule = "1f1b";
      EXPECT_EQ(PipelineWeightStashesAtPeak(one_f_one_b, p), 0);
    }
  }
}

}  // namespace
}  // namespace meshrun
