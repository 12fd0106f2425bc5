// The planner's enumeration, its fit decisions, its link model and its order, on specs whose
// answers can be worked out by hand.
#include "engine/train/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"
#include "engine/model/gpt2.h"
#include "engine/train/memory_model.h"
#include "engine/train/model_shape.h"

namespace meshrun {
namespace {

JobSpec Tiny() {
  JobSpec s;  // the defaults: 2 layers, 4 heads, d_model 64, seq 64, batch 8, micro batch 2
  s.data.train = "/dev/null";
  return s;
}

ClusterShape Cluster(int nodes, int per_node, double memory_bytes = 1e12) {
  ClusterShape c;
  c.nodes = nodes;
  c.per_node = per_node;
  c.device = {"test", memory_bytes, 1e12, 100e9, 10e9, 0.5};
  return c;
}

TEST(PlannerTest, EnumeratesEveryValidConfigurationOnce) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 4));
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  std::set<std::tuple<int, int, int, int, std::string, std::string, bool>> seen;
  size_t pipelined = 0;  // pp > 1 rows: tests/engine/train/planner_pp_test.cc
  for (const PlanRow& r : *rows) {
    const ParallelismSpec& p = r.spec.parallelism;
    if (p.pp_size > 1) {
      ++pipelined;
      continue;
    }
    EXPECT_EQ(p.dp_replicate_size * p.dp_shard_size * p.cp_size * p.tp_size, 4);
    EXPECT_TRUE(ValidateJobSpec(r.spec, 4).ok()) << ValidateJobSpec(r.spec, 4).message();
    EXPECT_TRUE(
        seen.insert({p.dp_replicate_size, p.dp_shard_size, p.cp_size, p.tp_size, p.cp_comm_strategy,
                     r.spec.train.activation_checkpointing, p.fsdp_reshard_after_forward})
            .second)
        << "listed twice";
    if (p.cp_size == 1) {
      EXPECT_EQ(p.cp_comm_strategy, "allgather");
    }
    if (p.dp_shard_size * p.cp_size == 1) {
      EXPECT_TRUE(p.fsdp_reshard_after_forward);
    }
    EXPECT_EQ(r.memory.peak_bytes, PredictRankMemory(r.spec).peak_bytes);
  }
  // Count by hand: every (R, S, C, T) of 4 whose dp ranks split batch 8 into micro-batches of
  // 2 (tiny's heads and sequence allow every tp and cp of 4); those with cp > 1 come in two
  // strategies, those with FSDP in two residencies, each in three checkpointing modes.
  size_t want = 0;
  for (int t : {1, 2, 4}) {
    for (int c : {1, 2, 4}) {
      for (int s : {1, 2, 4}) {
        if (4 % (t * c * s) != 0) continue;
        const int r = 4 / (t * c * s);
        // batch 8 over R·S dp ranks in micro-batches of 2
        if (8 % (r * s * 2) != 0) continue;
        want += 3 * (c > 1 ? 2 : 1) * (s * c > 1 ? 2 : 1);
      }
    }
  }
  EXPECT_EQ(rows->size() - pipelined, want);
}

// bf16 on cuda (decision 0027): the memory model adds the shard's bf16 copy (half a shard, to
// parameters) and the bf16 staging of one gathered unit (communication); gradients, AdamW state
// and activations stay float32.
TEST(PlannerTest, MemoryModelAddsTheBf16ShardCopyAndStagingOnCuda) {
  JobSpec fp32 = Tiny();
  fp32.resources.device = "cuda";
  fp32.parallelism.dp_shard_size = 2;
  JobSpec bf16 = fp32;
  bf16.train.precision = "bf16";
  const MemoryPrediction a = PredictRankMemory(fp32), b = PredictRankMemory(bf16);
  GPT2Config cfg = GPT2ConfigOf(fp32.model);
  cfg.fsdp_size = 2;
  int64_t shard = 0, block = 0;
  const std::vector<UnitInfo> units = GPT2Units(cfg, GPT2ParamLayout(cfg));
  for (const UnitInfo& u : units) shard += u.padded / 2;
  for (size_t u = 1; u + 1 < units.size(); ++u) block = std::max(block, units[u].padded);
  EXPECT_EQ(b.of(MemoryKind::kParameters) - a.of(MemoryKind::kParameters), 2 * shard);
  // One staging buffer: the largest unit buffer (blocks and the head unit are at least a block)
  // in bf16.
  int64_t largest = units[0].padded;
  for (size_t u = 1; u < units.size(); ++u) largest = std::max({largest, units[u].padded, block});
  EXPECT_EQ(b.of(MemoryKind::kCommunication) - a.of(MemoryKind::kCommunication),
            4 * ((largest + 1) / 2));
  for (MemoryKind k : {MemoryKind::kGradients, MemoryKind::kOptimizer, MemoryKind::kActivations}) {
    EXPECT_EQ(b.of(k), a.of(k));
  }
  // On one rank nothing is gathered: bf16 changes nothing the model counts.
  JobSpec one = bf16;
  one.parallelism.dp_shard_size = 1;
  JobSpec one32 = fp32;
  one32.parallelism.dp_shard_size = 1;
  EXPECT_EQ(PredictRankMemory(one).peak_bytes, PredictRankMemory(one32).peak_bytes);
}

TEST(PlannerTest, FitsFollowsTheMemoryModelAndSaysWhyNot) {
  // Room for the sharded configurations only: below one rank's full state.
  const JobSpec spec = Tiny();
  const double full = static_cast<double>(PredictRankMemory(spec).peak_bytes);
  StatusOr<std::vector<PlanRow>> rows = Plan(spec, Cluster(1, 4, full * 0.8 / 0.9));
  ASSERT_TRUE(rows.ok());
  bool some_fit = false, some_not = false, order_ok = true, seen_misfit = false;
  for (const PlanRow& r : *rows) {
    EXPECT_EQ(r.fits, r.memory.peak_bytes <= full * 0.8 + 1) << r.reason;
    if (r.fits) {
      EXPECT_TRUE(r.reason.empty());
      some_fit = true;
      if (seen_misfit) order_ok = false;
    } else {
      EXPECT_NE(r.reason.find("GiB per rank"), std::string::npos) << r.reason;
      some_not = true;
      seen_misfit = true;
    }
  }
  EXPECT_TRUE(some_fit);
  EXPECT_TRUE(some_not);
  EXPECT_TRUE(order_ok) << "every fitting row comes before every other";
}

TEST(PlannerTest, FittingRowsAreOrderedByPredictedThroughput) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(2, 2));
  ASSERT_TRUE(rows.ok());
  for (size_t i = 1; i < rows->size(); ++i) {
    if ((*rows)[i].fits && (*rows)[i - 1].fits) {
      EXPECT_GE((*rows)[i - 1].tokens_per_second, (*rows)[i].tokens_per_second);
    }
    EXPECT_GT((*rows)[i].step_seconds, 0);
  }
}

TEST(PlannerTest, AGroupInsideANodeUsesTheFastLink) {
  // tp 2 on 1 node × 2: inside a node. The same mesh on 2 nodes × 1 sends the same tp bytes
  // across nodes: intra/inter = 10× longer.
  auto tp_seconds = [](int nodes, int per_node) {
    StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(nodes, per_node));
    EXPECT_TRUE(rows.ok());
    for (const PlanRow& r : *rows) {
      const ParallelismSpec& p = r.spec.parallelism;
      if (p.tp_size == 2 &&
          p.dp_replicate_size * p.dp_shard_size * p.cp_size == nodes * per_node / 2 &&
          p.dp_shard_size == 1 && p.cp_size == 1 &&
          r.spec.train.activation_checkpointing == "none") {
        return r.comm_seconds.at("tp");
      }
    }
    return -1.0;
  };
  const double inside = tp_seconds(1, 2), across = tp_seconds(2, 1);
  ASSERT_GT(inside, 0);
  EXPECT_NEAR(across / inside, 10.0, 1e-9);
}

TEST(PlannerTest, RecomputationCostsTimeAndSavesActivations) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 1));
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 3u);  // one mesh, three modes
  std::map<std::string, const PlanRow*> by_mode;
  for (const PlanRow& r : *rows) by_mode[r.spec.train.activation_checkpointing] = &r;
  EXPECT_LT(by_mode["full"]->memory.of(MemoryKind::kActivations),
            by_mode["none"]->memory.of(MemoryKind::kActivations));
  EXPECT_GT(by_mode["full"]->compute_seconds, by_mode["selective"]->compute_seconds);
  EXPECT_GT(by_mode["selective"]->compute_seconds, by_mode["none"]->compute_seconds);
  EXPECT_EQ(rows->front().spec.train.activation_checkpointing, "none");
}

TEST(PlannerTest, UnknownDevicesAndEmptyClustersAreErrors) {
  EXPECT_EQ(DeviceProfileNamed("tpu").status().code(), StatusCode::kNotFound);
  EXPECT_NE(DeviceProfileNamed("tpu").status().message().find("h100"), std::string::npos);
  EXPECT_TRUE(DeviceProfileNamed("h100").ok());
  EXPECT_EQ(Plan(Tiny(), Cluster(0, 4)).status().code(), StatusCode::kInvalidArgument);
}

TEST(PlannerTest, ExplainsTheBestAndWhenNothingFits) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 2));
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(ExplainBest(*rows, Cluster(1, 2)).rfind("Best: dp_replicate", 0), 0u);
  StatusOr<std::vector<PlanRow>> none = Plan(Tiny(), Cluster(1, 2, 1000));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(ExplainBest(*none, Cluster(1, 2, 1000)).rfind("No configuration fits", 0), 0u);
}

TEST(PlannerTest, CommCallsPerStepCountTheCollectivesByHand) {
  JobSpec s = Tiny();  // 2 layers, batch 8, micro batch 2
  s.parallelism.tp_size = 2;
  // 8 / (1·1·2) = 4 micro-batches, each 2 layers × 4 all-reduces + 3 of the vocab-parallel
  // embedding and loss; then the grad norm's gather.
  EXPECT_EQ(ExpectedCommCallsPerStep(s).at("tp"), 4 * (2 * 4 + 3) + 1);
  s.train.activation_checkpointing = "full";  // the two forward all-reduces again
  EXPECT_EQ(ExpectedCommCallsPerStep(s).at("tp"), 4 * (2 * 6 + 3) + 1);
  JobSpec f = Tiny();
  f.parallelism.dp_shard_size = 4;  // one micro-batch of 2 per rank
  // 4 units gathered, the 2 layers again for backward, 4 reduce-scatters, the norm's gather.
  EXPECT_EQ(ExpectedCommCallsPerStep(f).at("dp_shard"), (4 + 2) + 4 + 1);
  f.parallelism.fsdp_reshard_after_forward = false;
  EXPECT_EQ(ExpectedCommCallsPerStep(f).at("dp_shard"), 4 + 4 + 1);
  JobSpec c = Tiny();
  c.parallelism.cp_size = 2;
  EXPECT_EQ(ExpectedCommCallsPerStep(c).at("cp"), 4 * 2 * (2 + 2));
  c.parallelism.cp_comm_strategy = "ring";
  EXPECT_EQ(ExpectedCommCallsPerStep(c).at("cp"), 4 * 2 * (1 + 1 + 1));
  JobSpec r = Tiny();
  r.parallelism.dp_replicate_size = 2;
  EXPECT_EQ(ExpectedCommCallsPerStep(r).at("dp_replicate"), 1);
  EXPECT_EQ(ExpectedCommCallsPerStep(r).at("tp"), 0);
}

TEST(PlannerTest, LatencyAddsPerCallToTheLinkItCrosses) {
  JobSpec s = Tiny();
  s.parallelism.tp_size = 2;
  ClusterShape c = Cluster(1, 2);
  const PlanRow without = PredictConfiguration(s, c);
  c.device.intra_node_latency = 1e-3;
  c.device.inter_node_latency = 5e-3;  // not crossed: tp 2 fits the node
  const PlanRow with = PredictConfiguration(s, c);
  EXPECT_NEAR(with.comm_seconds.at("tp") - without.comm_seconds.at("tp"),
              ExpectedCommCallsPerStep(s).at("tp") * 1e-3, 1e-12);
  EXPECT_NEAR(with.step_seconds - without.step_seconds, ExpectedCommCallsPerStep(s).at("tp") * 1e-3,
              1e-12);
  EXPECT_EQ(with.compute_seconds, without.compute_seconds);
}

TEST(PlannerTest, CommHopsCountTheRingStepsOfEachCall) {
  JobSpec s = Tiny();
  s.parallelism.tp_size = 4;  // all-reduces: 2·3 hops each
  EXPECT_EQ(ExpectedCommHopsPerStep(s).at("tp"), ExpectedCommCallsPerStep(s).at("tp") * 6);
  JobSpec c = Tiny();
  c.parallelism.cp_size = 4;  // all-gathers and reduce-scatters: 3 hops each
  EXPECT_EQ(ExpectedCommHopsPerStep(c).at("cp"), ExpectedCommCallsPerStep(c).at("cp") * 3);
  c.parallelism.cp_comm_strategy = "ring";  // each exchange is one hop
  EXPECT_EQ(ExpectedCommHopsPerStep(c).at("cp"), ExpectedCommCallsPerStep(c).at("cp"));
  JobSpec f = Tiny();
  f.parallelism.dp_shard_size = 2;
  f.parallelism.cp_size = 2;  // FSDP over dp_shard·cp = 4: gathers 3 hops, the norm's 6
  EXPECT_EQ(ExpectedCommHopsPerStep(f).at("dp_shard"),
            (ExpectedCommCallsPerStep(f).at("dp_shard") - 1) * 3 + 6);
  JobSpec r = Tiny();
  r.parallelism.dp_replicate_size = 4;
  EXPECT_EQ(ExpectedCommHopsPerStep(r).at("dp_replicate"), 6);
  EXPECT_EQ(ExpectedCommHopsPerStep(r).at("tp"), 0);
}

TEST(PlannerTest, CalibratedLatencyIsPerHopOfTheMeasuredAllReduce) {
  // Measured: a 4-rank all-reduce (6 hops) takes 1.2 ms, so a hop 0.2 ms; a tp 2 group's
  // all-reduce (2 hops) is then 0.4 ms, a third of what the table's per-call reading gives.
  JobSpec s = Tiny();
  s.parallelism.dp_replicate_size = 2;
  s.parallelism.tp_size = 2;
  ClusterShape c = Cluster(1, 4);
  c.device.intra_node_bw = 0;
  c.device.intra_node_latency = 1.2e-3;
  c.device.latency_ranks = 4;
  const PlanRow hop = PredictConfiguration(s, c);
  EXPECT_NEAR(hop.comm_seconds.at("tp"), ExpectedCommCallsPerStep(s).at("tp") * 2 * 0.2e-3, 1e-12);
  EXPECT_NEAR(hop.comm_seconds.at("dp_replicate"), 2 * 0.2e-3, 1e-12);
  c.device.latency_ranks = 0;
  EXPECT_NEAR(PredictConfiguration(s, c).comm_seconds.at("tp"),
              ExpectedCommCallsPerStep(s).at("tp") * 1.2e-3, 1e-12);
  EXPECT_EQ(CalibratedCpuProfile(8e10, 64e9, 4, 3e9, 2e-4, 4).latency_ranks, 4);
  EXPECT_EQ(CalibratedCpuProfile(8e10, 64e9, 4, 3e9, 0, 4).latency_ranks, 0)
      << "the table's latency stays per call";
}

TEST(PlannerTest, PredictConfigurationIsThePlansRow) {
  StatusOr<std::vector<PlanRow>> rows = Plan(Tiny(), Cluster(1, 4));
  ASSERT_TRUE(rows.ok());
  for (const PlanRow& r : *rows) {
    const PlanRow one = PredictConfiguration(r.spec, Cluster(1, 4));
    EXPECT_EQ(one.step_seconds, r.step_seconds);
    EXPECT_EQ(one.memory.peak_bytes, r.memory.peak_bytes);
    EXPECT_EQ(one.fits, r.fits);
  }
}

TEST(PlannerTest, CalibratedCpuProfileSharesTheHostAmongItsRanks) {
  const DeviceProfile d = CalibratedCpuProfile(8e10, 64e9, 4, 3e9, 2e-4);
  EXPECT_EQ(d.name, "cpu");
  EXPECT_DOUBLE_EQ(d.flops, 2e10);
  EXPECT_DOUBLE_EQ(d.memory_bytes, 16e9);
  EXPECT_DOUBLE_EQ(d.intra_node_bw, 3e9);
  EXPECT_DOUBLE_EQ(d.intra_node_latency, 2e-4);
  const DeviceProfile table = *DeviceProfileNamed("cpu");
  EXPECT_DOUBLE_EQ(d.inter_node_bw, table.inter_node_bw);
  // Unmeasured figures keep the table's.
  const DeviceProfile none = CalibratedCpuProfile(0, 0, 2, 0, 0);
  EXPECT_DOUBLE_EQ(none.intra_node_bw, table.intra_node_bw);
  EXPECT_DOUBLE_EQ(none.intra_node_latency, table.intra_node_latency);
  EXPECT_EQ(none.flops, 0);
}

TEST(PlannerTest, MeshNamesListTheAxesAboveOne) {
  ParallelismSpec p;
  EXPECT_EQ(MeshName(p), "1 rank");
  p.dp_shard_size = 2;
  p.tp_size = 2;
  EXPECT_EQ(MeshName(p), "dp_shard 2 × tp 2");
  p.dp_replicate_size = 3;
  p.cp_size = 4;
  EXPECT_EQ(MeshName(p), "dp_replicate 3 × dp_shard 2 × cp 4 × tp 2");
}

TEST(PlannerTest, ChooseMeshTakesTheFastestFittingRowOfTheSpecsOwnSettings) {
  JobSpec spec = Tiny();
  spec.parallelism.auto_mesh = true;
  spec.train.activation_checkpointing = "selective";
  const ClusterShape cluster = Cluster(1, 4);
  StatusOr<MeshChoice> choice = ChooseMesh(spec, cluster);
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  EXPECT_FALSE(choice->spec.parallelism.auto_mesh);
  EXPECT_TRUE(ValidateJobSpec(choice->spec, 4).ok());
  EXPECT_EQ(choice->spec.train.activation_checkpointing, "selective");
  // By hand: the fastest row of Plan whose settings are the spec's.
  StatusOr<std::vector<PlanRow>> rows = Plan(spec, cluster);
  ASSERT_TRUE(rows.ok());
  std::vector<const PlanRow*> same;
  for (const PlanRow& r : *rows) {
    const ParallelismSpec& p = r.spec.parallelism;
    if (r.engine_runs && r.spec.train.activation_checkpointing == "selective" &&
        (p.cp_size == 1 || p.cp_comm_strategy == "allgather") &&
        (p.dp_shard_size * p.cp_size == 1 || p.fsdp_reshard_after_forward)) {
      same.push_back(&r);
    }
  }
  ASSERT_GE(same.size(), 2u);
  EXPECT_EQ(choice->best.spec.parallelism, same[0]->spec.parallelism);
  ASSERT_TRUE(choice->has_runner_up);
  EXPECT_EQ(choice->runner_up.spec.parallelism, same[1]->spec.parallelism);
  EXPECT_LE(choice->best.step_seconds, choice->runner_up.step_seconds);
  for (const PlanRow* r : same) EXPECT_GE(r->tokens_per_second, 0);
  EXPECT_EQ(choice->spec.parallelism.dp_replicate_size,
            same[0]->spec.parallelism.dp_replicate_size);
  EXPECT_EQ(choice->text.rfind("auto: chose " + MeshName(choice->spec.parallelism) + " of 4", 0),
            0u)
      << choice->text;
  EXPECT_NE(choice->text.find("runner-up " + MeshName(same[1]->spec.parallelism)),
            std::string::npos)
      << choice->text;
}

TEST(PlannerTest, ChooseMeshSkipsWhatDoesNotFitAndSaysWhenNothingDoes) {
  JobSpec spec = Tiny();
  spec.parallelism.auto_mesh = true;
  const double full = static_cast<double>(PredictRankMemory(Tiny()).peak_bytes);
  // Room for sharded meshes only: the choice fits though a faster replicated one may not.
  StatusOr<MeshChoice> sharded = ChooseMesh(spec, Cluster(1, 4, full * 0.8 / 0.9));
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  EXPECT_TRUE(sharded->best.fits);
  EXPECT_LE(static_cast<double>(sharded->best.memory.peak_bytes), full * 0.8 + 1);
  StatusOr<MeshChoice> none = ChooseMesh(spec, Cluster(1, 4, 1000));
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message().rfind("parallelism.auto: no mesh of 4 ranks fits", 0), 0u)
      << none.status().message();
  EXPECT_NE(none.status().message().find("(hint: "), std::string::npos);
  // 3 ranks: no mesh of 3 splits batch 8 or 4 heads.
  StatusOr<MeshChoice> invalid = ChooseMesh(spec, Cluster(1, 3));
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.status().message().find("no mesh of 3 ranks is valid"), std::string::npos);
  // One rank: the only mesh, no runner-up.
  StatusOr<MeshChoice> one = ChooseMesh(spec, Cluster(1, 1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(MeshName(one->spec.parallelism), "1 rank");
  EXPECT_FALSE(one->has_runner_up);
}

TEST(PlannerTest, AutoLeavesTheSizesOutAndLetsTheWorldBeChosen) {
  JobSpec s = Tiny();
  s.parallelism.auto_mesh = true;
  EXPECT_TRUE(ValidateJobSpec(s, 4).ok()) << "the world comes from --nproc under auto";
  s.parallelism.tp_size = 2;
  s.parallelism.cp_size = 2;
  const Status given = ValidateJobSpec(s, 4);
  EXPECT_EQ(given.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(given.message().rfind("parallelism.cp_size: cp_size(2), tp_size(2) given with "
                                  "parallelism.auto: true",
                                  0),
            0u)
      << given.message();
  EXPECT_NE(given.message().find("(hint: "), std::string::npos);
  StatusOr<JobSpec> parsed =
      ParseJobSpecYaml("parallelism: {auto: true, dp_shard_size: 2}\n", {"data.train=/dev/null"});
  EXPECT_FALSE(parsed.ok() && ValidateJobSpec(*parsed, 0).ok());
}

TEST(ModelShapeTest, Gpt2SpecsCountWhatTheEngineCounts) {
  for (const auto& [layers, heads, d, seq, vocab] :
       std::vector<std::tuple<int, int, int, int, int>>{
           {2, 4, 64, 64, 256}, {12, 12, 768, 1024, 50257}, {4, 8, 128, 128, 256}}) {
    ModelSpec m;
    m.n_layer = layers;
    m.n_head = heads;
    m.d_model = d;
    m.seq_len = seq;
    m.vocab_size = vocab;
    // gpt2: fused qkv with bias, proj with bias, fc and proj with biases, two LayerNorms.
    const int64_t block = 3LL * d * d + 3 * d + d * d + d + 8LL * d * d + 4 * d + d + 4 * d;
    EXPECT_EQ(BlockParameterCount(m), block);
    EXPECT_EQ(ParameterCount(m), layers * block + int64_t{vocab} * d + 2 * d);
    EXPECT_DOUBLE_EQ(FlopsPerToken(m), GPT2FlopsPerToken(GPT2ConfigOf(m), seq))
        << layers << " layers, d_model " << d;
  }
}

TEST(ModelShapeTest, Llama3PresetsArePublishedOnes) {
  // Meta's model cards: 8,030,261,248 and 70,553,706,496 parameters (untied head).
  EXPECT_EQ(ParameterCount(Llama3_8B()), 8030261248);
  EXPECT_EQ(ParameterCount(Llama3_70B()), 70553706496);
  // The presets are job-spec model sections the spec's own rules accept.
  const ModelSpec m = Llama3_8B();
  EXPECT_EQ(m.arch, "llama");
  EXPECT_EQ(m.kv_heads(), 8);
  EXPECT_EQ(m.ff(), 14336);
  EXPECT_FALSE(m.tie_embeddings);
  // GQA and SwiGLU: a block is q, o (d×d), k, v (d×kv), gate, up, down (d×d_ff), two norms.
  EXPECT_EQ(BlockParameterCount(m),
            2 * 4096LL * 4096 + 2 * 4096LL * 1024 + 3 * 4096LL * 14336 + 2 * 4096);
  ModelSpec tied = m;
  tied.tie_embeddings = true;
  EXPECT_EQ(ParameterCount(m) - ParameterCount(tied), 128256LL * 4096);
  // The untied token table is a lookup: the engine's FLOP count leaves it out.
  EXPECT_DOUBLE_EQ(FlopsPerToken(m),
                   6.0 * (8030261248 - 128256LL * 4096) + 12.0 * 32 * 4096 * 8192);
}

TEST(ModelShapeTest, Bf16ProfilesUseDenseBf16Rates) {
  EXPECT_DOUBLE_EQ(*Bf16PeakFlops("h100"), 989e12);
  EXPECT_DOUBLE_EQ(Bf16DeviceProfile("h100")->flops, 0.6 * 989e12);
  EXPECT_EQ(Bf16PeakFlops("cpu").status().code(), StatusCode::kNotFound);
}

// The figures of docs/planning.md "Toward scale" (printed; the bands only catch a broken model).
TEST(ModelShapeTest, Llama3AtScaleOnH100) {
  ClusterShape c8;
  c8.nodes = 1;
  c8.per_node = 8;
  c8.device = *Bf16DeviceProfile("h100");
  ScaleConfig fsdp;
  fsdp.dp_shard = 8;
  fsdp.local_batch = 1;
  const ScalePrediction p8 = PredictAtScale(Llama3_8B(), fsdp, c8, 989e12);
  ClusterShape c256 = c8;
  c256.nodes = 32;
  ScaleConfig two_d;
  two_d.dp_shard = 32;
  two_d.tp = 8;
  two_d.local_batch = 4;
  two_d.activation_checkpointing = "full";
  const ScalePrediction p70 = PredictAtScale(Llama3_70B(), two_d, c256, 989e12);
  for (const auto& [name, p] : {std::pair<const char*, ScalePrediction>{"8B", p8}, {"70B", p70}}) {
    std::printf(
        "%s: %.0f tokens/s per GPU, MFU %.1f%%, step %.2f s (compute %.2f, tp %.2f, dp_shard "
        "%.2f), memory %.1f GiB (state %.1f, gathered %.1f, activations %.1f)\n",
        name, p.tokens_per_second_per_device, 100 * p.mfu, p.step_seconds, p.compute_seconds,
        p.comm_seconds.at("tp"), p.comm_seconds.at("dp_shard"), p.peak_bytes / (1 << 30),
        p.state_bytes / (1 << 30), p.gathered_bytes / (1 << 30), p.activation_bytes / (1 << 30));
  }
  EXPECT_GT(p8.tokens_per_second_per_device, 3000);
  EXPECT_LT(p8.tokens_per_second_per_device, 8000);
  EXPECT_LT(p8.peak_bytes, 80.0 * (1 << 30));
  EXPECT_GT(p70.tokens_per_second_per_device, 300);
  EXPECT_LT(p70.tokens_per_second_per_device, 1000);
  EXPECT_LT(p70.peak_bytes, 80.0 * (1 << 30));
  // FSDP over 8 ranks holds an eighth of the state of one rank.
  ScaleConfig one = fsdp;
  one.dp_shard = 1;
  ClusterShape c1 = c8;
  c1.per_node = 1;
  EXPECT_NEAR(PredictAtScale(Llama3_8B(), one, c1, 989e12).state_bytes / p8.state_bytes, 8, 1e-9);
}

}  // namespace
}  // namespace meshrun
