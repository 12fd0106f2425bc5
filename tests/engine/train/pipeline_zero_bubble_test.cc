// Zero-bubble pipeline parallelism (ZB-H1, decision 0059): the schedule as data (the backward
// split into B, input gradients, and W, weight gradients), its timetable, the model's split
// backward against the whole one (the same gradients, bit for bit), the stash's bound, and
// zero_bubble meshes training one rank's losses and grad norms (threads over the fake backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/model/gpt2.h"
#include "engine/train/pipeline.h"
#include "tests/engine/train/pipeline_mesh_runner.h"

namespace meshrun {
namespace {

std::string ZeroBubbleText(int P, int p, int M) {
  return ScheduleText(ZeroBubbleSchedule(P, p, M));
}

TEST(ZeroBubbleScheduleTest, StagePDefersPWeightPasses) {
  // 1F1B's warm-up; then F B W with stage p's W trailing its B by p micro-batches.
  EXPECT_EQ(ZeroBubbleText(2, 0, 4), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
  EXPECT_EQ(ZeroBubbleText(2, 1, 4), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
  EXPECT_EQ(ZeroBubbleText(2, 0, 8),
            "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 F4 B3 W3 F5 B4 W4 F6 B5 W5 F7 B6 W6 B7 W7");
  EXPECT_EQ(ZeroBubbleText(2, 1, 8),
            "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 F4 B4 W3 F5 B5 W4 F6 B6 W5 F7 B7 W6 W7");
  EXPECT_EQ(ZeroBubbleText(4, 0, 4), "F0 F1 F2 F3 B0 W0 B1 W1 B2 W2 B3 W3");
  EXPECT_EQ(ZeroBubbleText(4, 1, 4), "F0 F1 F2 B0 F3 B1 W0 B2 W1 B3 W2 W3");
  EXPECT_EQ(ZeroBubbleText(4, 2, 4), "F0 F1 B0 F2 B1 F3 B2 W0 B3 W1 W2 W3");
  EXPECT_EQ(ZeroBubbleText(4, 3, 4), "F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3");
  EXPECT_EQ(ZeroBubbleText(4, 0, 8),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(ZeroBubbleText(4, 1, 8),
            "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  EXPECT_EQ(ZeroBubbleText(4, 2, 8),
            "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7");
  EXPECT_EQ(ZeroBubbleText(4, 3, 8),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  // The last stage's forwards run inside its B (decision 0054), as under 1F1B.
  EXPECT_EQ(ScheduleText(PipelineOps(PpSchedule::kZeroBubble, 2, 1, 4, 1)),
            "B0 B1 W0 B2 W1 B3 W2 W3");
}

TEST(ZeroBubbleScheduleTest, EachMicroBatchRunsFThenBThenWWithinOneFOneBsMemory) {
  for (int P = 1; P <= 5; ++P) {
    for (int M = P; M <= 9; ++M) {
      for (int p = 0; p < P; ++p) {
        SCOPED_TRACE("P " + std::to_string(P) + " p " + std::to_string(p) + " M " +
                     std::to_string(M));
        const std::vector<PipeOp> ops = ZeroBubbleSchedule(P, p, M);
        ASSERT_EQ(ops.size(), static_cast<size_t>(3 * M));
        std::vector<int> state(M, 0);
        int in_flight = 0, most = 0, stashed = 0, most_stashed = 0;
        for (const PipeOp& op : ops) {
          EXPECT_EQ(op.chunk, 0);
          const int want = op.kind == PipeOpKind::kForward    ? 0
                           : op.kind == PipeOpKind::kBackward ? 1
                                                              : 2;
          ASSERT_EQ(state[op.micro]++, want);
          if (op.kind == PipeOpKind::kForward) most = std::max(most, ++in_flight);
          if (op.kind == PipeOpKind::kBackward) most_stashed = std::max(most_stashed, ++stashed);
          if (op.kind == PipeOpKind::kWeight) {
            --in_flight;
            --stashed;
          }
        }
        // Between F and W: at most P micro-batches (1F1B's peak, on its stage 0); between B
        // and W: p + 1 (the stashes).
        EXPECT_LE(most, P);
        EXPECT_EQ(most_stashed, std::min(p + 1, M));
        EXPECT_EQ(MaxPendingWeightGrads(ops), most_stashed);
        // F and B in 1F1B's order.
        std::vector<PipeOp> fb;
        for (const PipeOp& op : ops) {
          if (op.kind != PipeOpKind::kWeight) fb.push_back(op);
        }
        EXPECT_EQ(ScheduleText(fb), ScheduleText(OneFOneBSchedule(P, p, M)));
      }
    }
  }
  EXPECT_EQ(MaxPendingWeightGrads(OneFOneBSchedule(4, 0, 8)), 0);
}

TEST(ZeroBubbleScheduleTest, TimetableRunsEachOperationOnceAndFillsTheCooldown) {
  for (int P = 2; P <= 5; ++P) {
    for (int M = P; M <= 3 * P; ++M) {
      SCOPED_TRACE("P " + std::to_string(P) + " M " + std::to_string(M));
      std::vector<std::vector<PipeOp>> ops(P);
      for (int p = 0; p < P; ++p) ops[p] = PipelineOps(PpSchedule::kZeroBubble, P, p, M, 1);
      StatusOr<PipeTimetable> table = BuildTimetable(ops, P, 1, M);
      ASSERT_TRUE(table.ok()) << table.status().ToString();
      std::vector<size_t> seen(P, 0);
      // The slot of each rank's B of each micro-batch: a W comes after it.
      std::vector<std::vector<int>> b_slot(P, std::vector<int>(M, -1));
      for (size_t t = 0; t < table->slots.size(); ++t) {
        for (int p = 0; p < P; ++p) {
          const int i = table->slots[t][p];
          if (i < 0) continue;
          ASSERT_EQ(i, static_cast<int>(seen[p]));  // in list order, each once
          ++seen[p];
          const PipeOp& op = ops[p][static_cast<size_t>(i)];
          if (op.kind == PipeOpKind::kBackward) b_slot[p][op.micro] = static_cast<int>(t);
          if (op.kind == PipeOpKind::kWeight) {
            ASSERT_GE(b_slot[p][op.micro], 0);
            EXPECT_LT(b_slot[p][op.micro], static_cast<int>(t));
          }
        }
      }
      for (int p = 0; p < P; ++p) EXPECT_EQ(seen[p], ops[p].size());
    }
  }
  // With F, B and W of one slot each (every stage's forwards listed as operations of their
  // own), ZB-H1 takes 3·M + P − 1 slots: each stage idles P − 1 slots, a third of 1F1B's
  // (P − 1)·(F + B + W). The same split with each W right after its B takes 3·M + 2·(P − 1).
  for (int P = 2; P <= 5; ++P) {
    for (int M = P; M <= 3 * P; ++M) {
      SCOPED_TRACE("P " + std::to_string(P) + " M " + std::to_string(M));
      std::vector<std::vector<PipeOp>> ops(P), eager(P);
      for (int p = 0; p < P; ++p) {
        ops[p] = ZeroBubbleSchedule(P, p, M);
        for (const PipeOp& op : ops[p]) {
          if (op.kind != PipeOpKind::kWeight) eager[p].push_back(op);
          if (op.kind == PipeOpKind::kBackward) eager[p].push_back({PipeOpKind::kWeight, op.micro});
        }
      }
      StatusOr<PipeTimetable> table = BuildTimetable(ops, P, 1, M);
      ASSERT_TRUE(table.ok()) << table.status().ToString();
      EXPECT_EQ(table->slots.size(), static_cast<size_t>(3 * M + P - 1));
      StatusOr<PipeTimetable> eager_table = BuildTimetable(eager, P, 1, M);
      ASSERT_TRUE(eager_table.ok()) << eager_table.status().ToString();
      EXPECT_EQ(eager_table->slots.size(), static_cast<size_t>(3 * M + 2 * (P - 1)));
    }
  }
  std::vector<std::vector<PipeOp>> zb(4), one(4);
  for (int p = 0; p < 4; ++p) {
    zb[p] = PipelineOps(PpSchedule::kZeroBubble, 4, p, 8, 1);
    one[p] = PipelineOps(PpSchedule::k1F1B, 4, p, 8, 1);
  }
  const PipeTimetable zb_table = BuildTimetable(zb, 4, 1, 8).value();
  const PipeTimetable one_table = BuildTimetable(one, 4, 1, 8).value();
  int zb_idle = 0;
  for (const std::vector<int>& slot : zb_table.slots) zb_idle += slot[0] < 0 ? 1 : 0;
  // As the trainer runs them (the last stage's forwards inside its B): stage 0 runs its 24
  // operations in 26 slots, waiting 2 (the fill before its first B), where 1F1B's 16 take 20.
  EXPECT_EQ(zb_table.slots.size(), 26u);
  EXPECT_EQ(zb_idle, 2);
  EXPECT_EQ(one_table.slots.size(), 20u);
  EXPECT_DOUBLE_EQ(PipelineBubbleTheory(PpSchedule::kZeroBubble, 4, 8, 1), 3.0 / 27);
  EXPECT_LT(PipelineBubbleTheory(PpSchedule::kZeroBubble, 4, 8, 1),
            PipelineBubbleTheory(PpSchedule::k1F1B, 4, 8, 1));
}

// llama-named families: Llama (qkv bias) and Gemma (GeGLU, (1 + w) RMSNorm, scaled embeddings,
// head_dim 12 ≠ d_model/n_head, tied).
GPT2Config SplitModelConfig(Arch arch, Recompute recompute) {
  const bool llama = arch != Arch::kGpt2;
  GPT2Config c;
  c.arch = arch;
  c.vocab_size = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = llama ? 2 : 4;
  c.d_model = 32;
  c.d_ff = 48;
  c.max_seq_len = 16;
  c.tie_embeddings = arch != Arch::kLlama;
  c.attention_bias = arch == Arch::kLlama;  // the qkv bias's gradient comes from W too
  if (arch == Arch::kGemma) c.attn_head_dim = 12;
  c.recompute = recompute;
  return c;
}

TEST(ZeroBubbleModelTest, SplitBackwardGivesTheWholeBackwardsGradientsBitForBit) {
  const int B = 2, T = 8;
  std::vector<int32_t> in(2 * B * T), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>((i * 7 + 3) % 64);
    tg[i] = static_cast<int32_t>((i * 5 + 1) % 64);
  }
  const double scale = 1.0 / (2 * B * T);
  for (Arch arch : {Arch::kGpt2, Arch::kLlama, Arch::kGemma}) {
    const bool llama = arch != Arch::kGpt2;
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE("arch " + std::to_string(static_cast<int>(arch)) + " recompute " +
                   std::to_string(static_cast<int>(r)));
      const GPT2Config cfg = SplitModelConfig(arch, r);
      GPT2<float> whole(cfg), split(cfg);
      whole.InitDeterministic(7);
      split.InitDeterministic(7);
      split.set_weight_stash_limit(2);
      // Two micro-batches: whole backwards, then two B passes and their two W passes.
      double whole_loss = 0, split_loss = 0;
      for (int m = 0; m < 2; ++m) {
        whole_loss +=
            *whole.ForwardBackward(in.data() + m * B * T, tg.data() + m * B * T, B, T, scale);
      }
      for (int m = 0; m < 2; ++m) {
        StatusOr<double> loss = split.StageBackwardInput(
            m, in.data() + m * B * T, nullptr, tg.data() + m * B * T, nullptr, B, T, scale);
        ASSERT_TRUE(loss.ok()) << loss.status().ToString();
        split_loss += *loss;
      }
      EXPECT_EQ(split_loss, whole_loss);
      EXPECT_EQ(split.pending_weight_stashes(), 2);
      // The stash is bounded: a third B before a W is refused and changes nothing.
      EXPECT_EQ(split.StageBackwardInput(2, in.data(), nullptr, tg.data(), nullptr, B, T, scale)
                    .status()
                    .code(),
                StatusCode::kFailedPrecondition);
      // Before W the blocks have no weight gradient yet; the head and embeddings have theirs.
      const ParamInfo* fc =
          split.FindParam(llama ? "layers.0.mlp.gate_up.weight" : "h.0.mlp.c_fc.weight");
      ASSERT_NE(fc, nullptr);
      EXPECT_EQ(split.grad(*fc)[0], 0.0f);
      // Each W frees its stash for the next B: W allocates nothing, frees nothing, and two more B
      // passes (below) allocate nothing.
      const int64_t before = AllocatorFor(cfg.device).Stats().allocated_bytes;
      ASSERT_TRUE(split.StageBackwardWeight(0).ok());
      ASSERT_TRUE(split.StageBackwardWeight(1).ok());
      EXPECT_EQ(split.pending_weight_stashes(), 0);
      EXPECT_EQ(AllocatorFor(cfg.device).Stats().allocated_bytes, before);
      EXPECT_EQ(split.StageBackwardWeight(1).code(), StatusCode::kFailedPrecondition);
      int64_t differ = 0;
      for (int64_t i = 0; i < whole.num_params(); ++i) {
        differ += whole.grads_data()[i] != split.grads_data()[i] ? 1 : 0;
      }
      EXPECT_EQ(differ, 0) << "of " << whole.num_params() << " gradients";
      for (int m = 0; m < 2; ++m) {
        ASSERT_TRUE(split
                        .StageBackwardInput(m, in.data() + m * B * T, nullptr,
                                            tg.data() + m * B * T, nullptr, B, T, scale)
                        .ok());
      }
      EXPECT_EQ(AllocatorFor(cfg.device).Stats().allocated_bytes, before);
      // One layer's stash (the figure the memory model counts): each linear layer's input and
      // output gradient, N·(4·C + qkv + C/T + fc + act) floats, and the norms' 4·C (2·C llama).
      const int64_t N = B * T, C = cfg.d_model;
      const int64_t qkv = (cfg.n_head + 2 * cfg.kv_heads()) * cfg.head_dim();
      const int64_t F = cfg.ff();
      const int64_t atty = cfg.n_head * cfg.head_dim();
      const int64_t per_layer =
          N * (4 * C + qkv + atty + (llama ? 2 * F : F) + F) + (llama ? 2 : 4) * C;
      EXPECT_EQ(split.WeightStashNumel(B, T), cfg.n_layer * per_layer);
      if (!llama) {
        EXPECT_EQ(per_layer, 16 * N * C + 4 * C);  // GPT-2: 16·N·d_model + 4·d_model
      }
    }
  }
}

class PipelineZeroBubbleTest : public PipelineMeshRunner {
 protected:
  static JobSpec ZeroBubble(const std::string& arch, int n_layer, const PipeMesh& m,
                            int steps = 20) {
    JobSpec spec = Spec(arch, n_layer, m);
    spec.parallelism.pp_schedule = "zero_bubble";
    spec.train.steps = steps;
    return spec;
  }
};

TEST_F(PipelineZeroBubbleTest, Gpt2TwoStagesTrainsLikeOneRank) {
  ExpectTrainsLike(Run(ZeroBubble("gpt2", 4, {.P = 2})), OneRank("gpt2", 4));
}

TEST_F(PipelineZeroBubbleTest, LlamaTwoStagesTrainsLikeOneRank) {
  ExpectTrainsLike(Run(ZeroBubble("llama", 4, {.P = 2})), OneRank("llama", 4));
}

TEST_F(PipelineZeroBubbleTest, Gpt2FourStagesOfSixLayersTrainsLikeOneRank) {
  ExpectTrainsLike(Run(ZeroBubble("gpt2", 6, {.P = 4})), OneRank("gpt2", 6));
}

TEST_F(PipelineZeroBubbleTest, LlamaFourStagesOfSixLayersTrainsLikeOneRank) {
  ExpectTrainsLike(Run(ZeroBubble("llama", 6, {.P = 4})), OneRank("llama", 6));
}

TEST_F(PipelineZeroBubbleTest, Gpt2TwoStagesTimesFsdpTimesTpTrainsLikeOneRankFor20Steps) {
  ExpectTrainsLike(Run(ZeroBubble("gpt2", 4, {.P = 2, .S = 2, .T = 2}, 20)),
                   OneRank("gpt2", 4, 20));
}

TEST_F(PipelineZeroBubbleTest, LlamaTwoStagesTimesFsdpTimesTpTrainsLikeOneRankFor20Steps) {
  ExpectTrainsLike(Run(ZeroBubble("llama", 4, {.P = 2, .S = 2, .T = 2}, 20)),
                   OneRank("llama", 4, 20));
}

TEST_F(PipelineZeroBubbleTest, Gpt2TwoStagesTimesFsdpTimesTpTrainsExactlyLikeOneFOneB) {
  // The split runs the whole backward's kernels on the same operands, adding into the
  // gradients in the same micro-batch order: 1F1B's losses and grad norms bit for bit.
  JobSpec one_f_one_b = ZeroBubble("gpt2", 4, {.P = 2, .S = 2, .T = 2});
  one_f_one_b.parallelism.pp_schedule = "1f1b";
  const std::vector<StatusOr<PipeStepRecord>> want = Run(one_f_one_b);
  const std::vector<StatusOr<PipeStepRecord>> got =
      Run(ZeroBubble("gpt2", 4, {.P = 2, .S = 2, .T = 2}));
  ASSERT_EQ(got.size(), want.size());
  for (size_t rank = 0; rank < got.size(); ++rank) {
    ASSERT_TRUE(want[rank].ok()) << want[rank].status().ToString();
    ASSERT_TRUE(got[rank].ok()) << got[rank].status().ToString();
    EXPECT_EQ(got[rank]->losses, want[rank]->losses) << "rank " << rank;
    EXPECT_EQ(got[rank]->grad_norms, want[rank]->grad_norms) << "rank " << rank;
  }
}

TEST_F(PipelineZeroBubbleTest, Gpt2TwoStagesTimesFsdpKeptGatheredTrainsLikeOneRank) {
  // Units kept gathered from forward to backward: B frees them, W reads none.
  JobSpec spec = ZeroBubble("gpt2", 4, {.P = 2, .S = 2});
  spec.parallelism.fsdp_reshard_after_forward = false;
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 4));
}

TEST_F(PipelineZeroBubbleTest, Gpt2TwoStagesTimesReplicasTimesCpTrainsLikeOneRank) {
  // dp_replicate's buckets start when a unit's last W is done; cp's ring inside B.
  JobSpec spec = ZeroBubble("gpt2", 4, {.P = 2, .R = 2, .C = 2});
  spec.parallelism.cp_comm_strategy = "ring";
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 4));
}

TEST_F(PipelineZeroBubbleTest, Gpt2FourStagesTimesRingCpTrainsLikeOneRank) {
  // pp 4 × cp 2 (ring): B runs the ring attention's backward, W only local GEMMs (8 ranks).
  JobSpec spec = ZeroBubble("gpt2", 8, {.P = 4, .C = 2});
  spec.parallelism.cp_comm_strategy = "ring";
  ExpectTrainsLike(Run(spec), OneRank("gpt2", 8));
}

TEST_F(PipelineZeroBubbleTest, LlamaFourStagesTimesRingCpTrainsLikeOneRank) {
  JobSpec spec = ZeroBubble("llama", 8, {.P = 4, .C = 2});
  spec.parallelism.cp_comm_strategy = "ring";
  ExpectTrainsLike(Run(spec), OneRank("llama", 8));
}

TEST_F(PipelineZeroBubbleTest, LlamaTiedFourStagesWithCheckpointingTrainsLikeOneRank) {
  // The tied embedding's gradients exchanged between first and last stage after the step's
  // last W; full activation checkpointing recomputes each block inside B.
  JobSpec spec = ZeroBubble("llama", 6, {.P = 4});
  spec.model.tie_embeddings = true;
  spec.parallelism.pp_layers = {1, 1, 1, 3};
  spec.train.activation_checkpointing = "full";
  JobSpec one = Spec("llama", 6, {});
  one.model.tie_embeddings = true;
  std::vector<StatusOr<PipeStepRecord>> alone = Run(one);
  ASSERT_TRUE(alone[0].ok()) << alone[0].status().ToString();
  ExpectTrainsLike(Run(spec), *alone[0]);
}

}  // namespace
}  // namespace meshrun
