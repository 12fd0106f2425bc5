// The planner's pipeline rows (docs/planning.md "Pipeline parallelism"): every pp size and
// schedule is listed, the memory of a stage holds the micro-batches its schedule keeps in flight,
// the step adds the schedule's bubble and the stages' sends over the link between stages, and
// `auto` chooses only what this build's engine runs. Worked out by hand on a 4-layer GPT-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "common/job_spec.h"
#include "engine/train/memory_model.h"
#include "engine/train/model_shape.h"
#include "engine/train/pipeline.h"
#include "engine/train/pipeline_cost.h"
#include "engine/train/planner.h"

namespace meshrun {
namespace {

// 4 layers, d_model 64, 4 heads, seq 64, vocab 256; 8 sequences a step in micro-batches of 1.
JobSpec FourLayers() {
  JobSpec s;
  s.model.n_layer = 4;
  s.train.global_batch_size = 8;
  s.train.micro_batch_size = 1;
  s.data.train = "/dev/null";
  return s;
}

ClusterShape PpCluster(int nodes, int per_node) {
  ClusterShape c;
  c.nodes = nodes;
  c.per_node = per_node;
  c.device = {"test", 1e12, 1e12, 100e9, 10e9, 0.5};  // no latency: bytes over links only
  return c;
}

const PlanRow* FindRow(const std::vector<PlanRow>& rows, int pp, int dp_replicate,
                       PpSchedule schedule, int v = 1, const char* ac = "none") {
  for (const PlanRow& r : rows) {
    const ParallelismSpec& p = r.spec.parallelism;
    if (p.pp_size == pp && p.dp_replicate_size == dp_replicate && p.dp_shard_size == 1 &&
        p.cp_size == 1 && p.tp_size == 1 && PpScheduleOf(p) == schedule &&
        p.pp_virtual_stages == v && r.spec.train.activation_checkpointing == ac) {
      return &r;
    }
  }
  return nullptr;
}

TEST(PlannerPipelineTest, ListsEveryPipelineSizeAndScheduleOnce) {
  StatusOr<std::vector<PlanRow>> rows = Plan(FourLayers(), PpCluster(2, 2));
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  std::set<std::tuple<int, int, int, int, int, std::string, int, std::string, bool, std::string>>
      seen;
  std::set<std::pair<int, std::string>> schedules;
  for (const PlanRow& r : *rows) {
    const ParallelismSpec& p = r.spec.parallelism;
    EXPECT_EQ(p.pp_size * p.dp_replicate_size * p.dp_shard_size * p.cp_size * p.tp_size, 4);
    EXPECT_TRUE(seen.insert({p.pp_size, p.dp_replicate_size, p.dp_shard_size, p.cp_size, p.tp_size,
                             p.pp_schedule, p.pp_virtual_stages, p.cp_comm_strategy,
                             p.fsdp_reshard_after_forward, r.spec.train.activation_checkpointing})
                    .second)
        << "listed twice: " << MeshName(p);
    schedules.insert({p.pp_size, p.pp_schedule + "/" + std::to_string(p.pp_virtual_stages)});
    // The engine runs exactly what ValidateJobSpec accepts; the rest is a pipeline on paper.
    EXPECT_EQ(r.engine_runs, ValidateJobSpec(r.spec, 4).ok()) << MeshName(p);
    if (p.pp_size == 1) {
      EXPECT_TRUE(r.engine_runs);
    }
  }
  // pp 2: 1f1b, zero_bubble, interleaved with 2 chunks per stage (2·2 ≤ 4 layers; 4 would not);
  // pp 4: 1f1b and zero_bubble (4·2 > 4 layers).
  EXPECT_EQ(schedules, (std::set<std::pair<int, std::string>>{{1, "1f1b/1"},
                                                              {2, "1f1b/1"},
                                                              {2, "zero_bubble/1"},
                                                              {2, "interleaved_1f1b/2"},
                                                              {4, "1f1b/1"},
                                                              {4, "zero_bubble/1"}}));
}

TEST(PlannerPipelineTest, EachStageIsPredictedAsTheEngineRunsIt) {
  StatusOr<std::vector<PlanRow>> rows = Plan(FourLayers(), PpCluster(1, 4));
  ASSERT_TRUE(rows.ok());
  // A row's memory is the memory model's for the stage with the largest peak (decision 0061).
  for (const PlanRow& r : *rows) {
    if (r.spec.parallelism.pp_size == 1) continue;
    SCOPED_TRACE(MeshName(r.spec.parallelism));
    const std::vector<MemoryPrediction> stages = PredictStagesMemory(r.spec);
    ASSERT_EQ(stages.size(), static_cast<size_t>(r.spec.parallelism.pp_size));
    ASSERT_GE(r.peak_stage, 0);
    for (int k = 0; k < kNumMemoryKinds; ++k) {
      EXPECT_EQ(r.memory.bytes[k], stages[static_cast<size_t>(r.peak_stage)].bytes[k]);
    }
    for (const MemoryPrediction& m : stages) EXPECT_LE(m.peak_bytes, r.memory.peak_bytes);
  }
  // pp 4: a layer per stage. The middle stages hold that layer's parameters only (no embedding,
  // no head); the first adds the token and position tables, the last (tied) their copy and the
  // final norm.
  const PlanRow* four = FindRow(*rows, 4, 1, PpSchedule::k1F1B);
  ASSERT_NE(four, nullptr);
  const int64_t layer = 4 * BlockParameterCount(FourLayers().model);
  const std::vector<MemoryPrediction> s = PredictStagesMemory(four->spec);
  EXPECT_EQ(s[1].of(MemoryKind::kParameters), layer);
  EXPECT_EQ(s[2].of(MemoryKind::kParameters), layer);
  const int64_t tables = 4 * (256 + 64) * 64;  // wte and wpe
  EXPECT_EQ(s[0].of(MemoryKind::kParameters), layer + tables);
  EXPECT_EQ(s[3].of(MemoryKind::kParameters), layer + tables + 4 * 2 * 64);
  // Beside one micro-batch's activations, a stage holds what it received for the micro-batches
  // in flight (1 sequence × 64 tokens × d_model 64 floats = 16 KiB each): under 1F1B, P − p + 2
  // on a middle stage p (its P − p in flight, the next one's input, an output gradient). Without
  // activation checkpointing it also keeps the forwards of its P − p micro-batches in flight
  // (decision 0066), each its layer's activations and its input, per token: ln1, res2, ln2,
  // res3 and the input (5·64), two means and two rstds, q, k, v, att, atty (5·64), the lse of 4
  // heads, fc and its GELU (2·256).
  const int64_t input = 1 * 64 * 64 * 4;
  const int64_t kept = 64 * (5 * 64 + 4 + 5 * 64 + 4 + 2 * 256) * 4;
  EXPECT_EQ(PipelineBuffersAtPeak(four->spec, 1), 5);
  EXPECT_EQ(PipelineBuffersAtPeak(four->spec, 2), 4);
  const int M = four->spec.train.global_batch_size / four->spec.train.micro_batch_size;
  for (int p : {0, 1, 2, 3}) {
    EXPECT_EQ(MaxKeptForwards(PipelineOps(PpSchedule::k1F1B, 4, p, M, 1), 1),
              std::vector<int>{p < 3 ? std::min(4 - p, M) : 0});  // the last keeps none
  }
  EXPECT_EQ(s[1].of(MemoryKind::kActivations) - s[2].of(MemoryKind::kActivations), input + kept);
  // With activation checkpointing a stage keeps only its inputs (decision 0054).
  JobSpec full = four->spec;
  full.train.activation_checkpointing = "full";
  const std::vector<MemoryPrediction> sf = PredictStagesMemory(full);
  EXPECT_EQ(sf[1].of(MemoryKind::kActivations) - sf[2].of(MemoryKind::kActivations), input);
  // Stage 0 reads tokens: it holds output gradients only, one at a time.
  EXPECT_EQ(PipelineBuffersAtPeak(four->spec, 0), 1);
  // ZB-H1 keeps 1F1B's receive buffers and adds stage p's min(p + 1, M) weight-gradient
  // stashes (M = 4 here), each 16·n·d + 4·d floats a GPT-2 layer (n = 64 tokens, d = 64).
  const PlanRow* f = FindRow(*rows, 2, 2, PpSchedule::k1F1B);
  const PlanRow* zb = FindRow(*rows, 2, 2, PpSchedule::kZeroBubble);
  ASSERT_TRUE(f && zb);
  const std::vector<MemoryPrediction> fs = PredictStagesMemory(f->spec);
  const std::vector<MemoryPrediction> zs = PredictStagesMemory(zb->spec);
  const std::vector<int> zb_layers = PipelineLayers(zb->spec);
  for (int p = 0; p < 2; ++p) {
    SCOPED_TRACE("stage " + std::to_string(p));
    EXPECT_EQ(PipelineBuffersAtPeak(zb->spec, p), PipelineBuffersAtPeak(f->spec, p));
    EXPECT_EQ(PipelineWeightStashesAtPeak(zb->spec, p), p + 1);
    EXPECT_EQ(PipelineWeightStashesAtPeak(f->spec, p), 0);
    EXPECT_EQ(zs[p].of(MemoryKind::kActivations) - fs[p].of(MemoryKind::kActivations),
              int64_t{p + 1} * zb_layers[p] * (16 * 64 * 64 + 4 * 64) * 4);
    EXPECT_EQ(zs[p].of(MemoryKind::kParameters), fs[p].of(MemoryKind::kParameters));
  }
  EXPECT_GT(zb->memory.peak_bytes, f->memory.peak_bytes);
  // Interleaved (2 chunks of a layer per stage, 4 micro-batches) holds more: 4 received buffers
  // on each stage against 1F1B's 1.
  const PlanRow* in = FindRow(*rows, 2, 2, PpSchedule::kInterleaved1F1B, 2);
  ASSERT_NE(in, nullptr);
  EXPECT_EQ(PipelineBuffersAtPeak(f->spec, 0), 1);
  EXPECT_EQ(PipelineBuffersAtPeak(in->spec, 0), 4);
  EXPECT_EQ(PipelineBuffersAtPeak(in->spec, 1), 4);
}

TEST(PlannerPipelineTest, TheStepAddsTheSchedulesBubble) {
  StatusOr<std::vector<PlanRow>> rows = Plan(FourLayers(), PpCluster(1, 4));
  ASSERT_TRUE(rows.ok());
  // pp 2 × dp_replicate 2, m = 4 micro-batches, no checkpointing, so every stage keeps its
  // forwards' activations (decision 0066). The slowest stage is stage 1 (2 layers and the head
  // against 2 layers): F = B = W = t/3.
  const PlanRow* f = FindRow(*rows, 2, 2, PpSchedule::k1F1B);
  const PlanRow* zb = FindRow(*rows, 2, 2, PpSchedule::kZeroBubble);
  const PlanRow* in = FindRow(*rows, 2, 2, PpSchedule::kInterleaved1F1B, 2);
  ASSERT_TRUE(f && zb && in);
  const double t = f->compute_seconds / 4;
  EXPECT_NEAR(f->bubble_seconds, 1 * t, 1e-12 * t);
  EXPECT_NEAR(f->pipeline_bubble_ratio, 1.0 / (4 + 1), 1e-12);  // (P−1)/(m+P−1)
  EXPECT_NEAR(zb->bubble_seconds, t / 3, 1e-12 * t);            // (P−1)(F+B−W)
  EXPECT_NEAR(zb->pipeline_bubble_ratio, (1.0 / 3) / (1.0 / 3 + 4), 1e-12);
  EXPECT_NEAR(in->pipeline_bubble_ratio, 1.0 / (2 * 4 + 1), 1e-12);  // (P−1)/(vm+P−1)
  // Stage 1's compute: its share of the stages' cost, 2 layers of 4 and the head (a layer 6
  // FLOPs per block parameter plus 12·d·seq, the head 6·V·d), × P of the flat mesh's step
  // (which spreads all FLOPs over all 4 ranks).
  const double layer = 6.0 * static_cast<double>(BlockParameterCount(FourLayers().model)) +
                       12.0 * 64 * 64,
               head = 6.0 * 256 * 64;
  const PlanRow* flat4 = FindRow(*rows, 1, 4, PpSchedule::k1F1B);
  ASSERT_NE(flat4, nullptr);
  EXPECT_NEAR(f->compute_seconds,
              flat4->compute_seconds * 2 * ((2 * layer + head) / (4 * layer + head)),
              1e-9 * f->compute_seconds);
  EXPECT_NEAR(f->step_seconds,
              f->compute_seconds + f->bubble_seconds + f->comm_seconds.at("pp") +
                  f->comm_seconds.at("dp_replicate") + f->comm_seconds.at("tp") +
                  f->comm_seconds.at("cp") + f->comm_seconds.at("dp_shard"),
              1e-12);
  EXPECT_LT(zb->step_seconds, f->step_seconds);
  // Without a pipeline there is no bubble.
  const PlanRow* flat = FindRow(*rows, 1, 4, PpSchedule::k1F1B);
  ASSERT_NE(flat, nullptr);
  EXPECT_EQ(flat->bubble_seconds, 0);
  EXPECT_EQ(flat->comm_seconds.count("pp"), 0u);
}

TEST(PlannerPipelineTest, StagesSendOverTheLinkBetweenThem) {
  // B·T·d·4 bytes each way per micro-batch: 1·64·64·4 = 16 KiB; a stage sends 2·m = 8 of them.
  const double bytes = 8 * 16384.0;
  auto pp_seconds = [](int nodes, int per_node) {
    StatusOr<std::vector<PlanRow>> rows = Plan(FourLayers(), PpCluster(nodes, per_node));
    EXPECT_TRUE(rows.ok());
    const PlanRow* r = FindRow(*rows, 2, 2, PpSchedule::k1F1B);
    return r == nullptr ? -1.0 : r->comm_seconds.at("pp");
  };
  // The whole pipeline inside one node: NVLink-like 100 GB/s; across two nodes the stages sit
  // on different nodes: 10 GB/s.
  EXPECT_DOUBLE_EQ(pp_seconds(1, 4), bytes / 100e9);
  EXPECT_DOUBLE_EQ(pp_seconds(2, 2), bytes / 10e9);
  // dp_replicate's all-reduce stays inside a stage's node there (2 ranks per stage, 2 per node).
  StatusOr<std::vector<PlanRow>> rows = Plan(FourLayers(), PpCluster(2, 2));
  ASSERT_TRUE(rows.ok());
  const PlanRow* r = FindRow(*rows, 2, 2, PpSchedule::k1F1B);
  ASSERT_NE(r, nullptr);
  JobSpec stage = r->spec;  // the stage's model: 2 layers, no pipeline
  stage.model.n_layer = 2;
  stage.parallelism.pp_size = 1;
  stage.parallelism.pp_schedule = "1f1b";
  EXPECT_DOUBLE_EQ(r->comm_seconds.at("dp_replicate"),
                   PredictConfiguration(stage, PpCluster(1, 2)).comm_seconds.at("dp_replicate"));
}

TEST(PlannerPipelineTest, AutoChoosesOnlyWhatThisBuildRuns) {
  JobSpec spec = FourLayers();
  spec.parallelism.auto_mesh = true;
  StatusOr<MeshChoice> choice = ChooseMesh(spec, PpCluster(2, 2));
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  EXPECT_TRUE(ValidateJobSpec(choice->spec, 4).ok());
  EXPECT_TRUE(choice->best.engine_runs);
  if (choice->has_runner_up) {
    EXPECT_TRUE(choice->runner_up.engine_runs);
  }
}

TEST(PlannerPipelineTest, MeshNamesStartWithThePipeline) {
  ParallelismSpec p;
  p.pp_size = 4;
  p.tp_size = 2;
  p.pp_schedule = "interleaved_1f1b";
  p.pp_virtual_stages = 2;
  EXPECT_EQ(MeshName(p), "pp 4 × tp 2 (interleaved_1f1b, 2 virtual stages)");
  p.pp_schedule = "zero_bubble";
  p.pp_virtual_stages = 1;
  EXPECT_EQ(MeshName(p), "pp 4 × tp 2 (zero_bubble)");
}

}  // namespace
}  // namespace meshrun
