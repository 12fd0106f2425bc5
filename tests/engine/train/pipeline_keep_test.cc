// Pipeline chunks that keep their forwards' activations (decision 0066): a kept forward's
// backward gives what running the forward again gives, bit for bit (the whole backward and
// zero-bubble's split one, first and middle chunks, document masks and sliding windows), its
// sets are reused, and what it cannot do is refused.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/gpt2.h"
#include "engine/train/pipeline.h"
#include "tests/engine/train/pipeline_mesh_runner.h"

namespace meshrun {
namespace {

// Stage 0 of a 2-stage pipeline of 4 layers, interleaved: chunk 0 (layers 0–1, the embedding)
// and chunk 1 (layer 2, from the previous stage's output); layer 3 would be the last stage's.
// Llama with a sliding window, Gemma ((1 + w) RMSNorm, GeGLU, scaled embedding, head_dim 12).
GPT2Config StageZero(Arch arch, Recompute recompute) {
  GPT2Config c;
  c.arch = arch;
  c.vocab_size = 64;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::kGpt2 ? 4 : 2;
  c.d_model = 32;
  c.d_ff = 48;
  c.max_seq_len = 16;
  c.tie_embeddings = arch != Arch::kLlama;
  if (arch == Arch::kLlama) c.sliding_window = 5;
  if (arch == Arch::kGemma) c.attn_head_dim = 12;
  c.recompute = recompute;
  c.chunks = {{0, 2}, {2, 3}};
  c.stage_first = true;
  c.stage_last = false;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets, docs;
  std::vector<float> input, output_grad;  // chunk 1's input; the gradient of either's output
};

Batch MakeBatch(int m, int64_t N, int64_t C) {
  Batch b;
  for (int64_t i = 0; i < N; ++i) {
    b.tokens.push_back(static_cast<int32_t>((i * 7 + 3 * m + 1) % 64));
    b.targets.push_back(static_cast<int32_t>((i * 5 + m) % 64));
    // Micro-batch 1 has two documents per sequence (starting at positions 0 and 3).
    b.docs.push_back(m == 1 && i % 8 >= 3 ? 3 : 0);
  }
  for (int64_t i = 0; i < N * C; ++i) {
    b.input.push_back(static_cast<float>(((i * 37 + m * 11) % 101) - 50) / 50.0f);
    b.output_grad.push_back(static_cast<float>(((i * 53 + m * 7) % 97) - 48) / 480.0f);
  }
  return b;
}

bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * static_cast<size_t>(n)) == 0;
}

TEST(PipelineKeepTest, AKeptForwardsBackwardIsTheRecomputedOneBitForBit) {
  const int B = 2, T = 8, M = 3;
  const int64_t N = B * T;
  const double scale = 1.0 / (M * N);
  for (Arch arch : {Arch::kGpt2, Arch::kLlama, Arch::kGemma}) {
    for (bool split : {false, true}) {
      SCOPED_TRACE("arch " + std::to_string(static_cast<int>(arch)) + (split ? " split" : ""));
      const GPT2Config cfg = StageZero(arch, Recompute::kNone);
      const int64_t C = cfg.d_model;
      std::vector<Batch> batch;
      for (int m = 0; m < M; ++m) batch.push_back(MakeBatch(m, N, C));
      GPT2<float> again(cfg), kept(cfg);
      again.InitDeterministic(3);
      kept.InitDeterministic(3);
      again.set_weight_stash_limit(2 * M);
      kept.set_weight_stash_limit(2 * M);
      // Both models on chunk k of micro-batch m (its document masks for the next call).
      auto on = [&](int k, int m) {
        const Batch& b = batch[static_cast<size_t>(m)];
        for (GPT2<float>* model : {&again, &kept}) {
          model->SetActiveChunk(k);
          model->SetDocumentStarts(b.docs);
        }
        return std::make_tuple(&b, k == 0 ? nullptr : b.input.data(), k * M + m);
      };
      int64_t allocated_after_first = 0;
      for (int round = 0; round < 2; ++round) {
        // Both chunks' forwards of every micro-batch, then their backwards in reverse (as an
        // interleaved warm-up and cool-down would), W right after each B when split.
        for (int m = 0; m < M; ++m) {
          for (int k = 0; k < 2; ++k) {
            const auto [b, input, key] = on(k, m);
            ASSERT_TRUE(again.StageForward(b->tokens.data(), input, B, T).ok());
            ASSERT_TRUE(kept.StageForward(b->tokens.data(), input, B, T, nullptr, key).ok());
            EXPECT_TRUE(SameBits(again.stage_output(), kept.stage_output(), N * C))
                << "forward " << key;
          }
        }
        EXPECT_EQ(kept.kept_forwards(), 2 * M);
        for (int m = M - 1; m >= 0; --m) {
          for (int k = 1; k >= 0; --k) {
            const auto [bp, input, key] = on(k, m);
            const Batch& b = *bp;
            if (split) {
              ASSERT_TRUE(again
                              .StageBackwardInput(key, b.tokens.data(), input, b.targets.data(),
                                                  b.output_grad.data(), B, T, scale)
                              .ok());
              StatusOr<double> loss =
                  kept.StageBackwardInput(key, b.tokens.data(), input, b.targets.data(),
                                          b.output_grad.data(), B, T, scale, nullptr, key);
              ASSERT_TRUE(loss.ok()) << loss.status().ToString();
              ASSERT_TRUE(again.StageBackwardWeight(key).ok());
              ASSERT_TRUE(kept.StageBackwardWeight(key).ok());
            } else {
              ASSERT_TRUE(again
                              .StageForwardBackward(b.tokens.data(), input, b.targets.data(),
                                                    b.output_grad.data(), B, T, scale)
                              .ok());
              StatusOr<double> loss =
                  kept.StageForwardBackward(b.tokens.data(), input, b.targets.data(),
                                            b.output_grad.data(), B, T, scale, nullptr, key);
              ASSERT_TRUE(loss.ok()) << loss.status().ToString();
            }
            if (k == 1) {
              EXPECT_TRUE(SameBits(again.stage_input_grad(), kept.stage_input_grad(), N * C))
                  << "input gradient " << key;
            }
          }
        }
        EXPECT_EQ(kept.kept_forwards(), 0);
        int64_t differ = 0;
        for (int64_t i = 0; i < again.num_params(); ++i) {
          differ += again.grads_data()[i] != kept.grads_data()[i] ? 1 : 0;
        }
        EXPECT_EQ(differ, 0) << "of " << again.num_params() << " gradients, round " << round;
        // The second round reuses the sets the first one's backwards freed.
        const int64_t now = AllocatorFor(cfg.device).Stats().allocated_bytes;
        if (round == 0) allocated_after_first = now;
        if (round == 1) {
          EXPECT_EQ(now, allocated_after_first);
        }
      }
    }
  }
}

TEST(PipelineKeepTest, WhatAKeptForwardCannotDoIsRefused) {
  const int B = 2, T = 8;
  const GPT2Config cfg = StageZero(Arch::kGpt2, Recompute::kNone);
  const Batch b = MakeBatch(0, B * T, cfg.d_model);
  GPT2<float> model(cfg);
  model.InitDeterministic(3);
  ASSERT_TRUE(model.StageForward(b.tokens.data(), nullptr, B, T, nullptr, 0).ok());
  // The same key twice before its backward.
  EXPECT_EQ(model.StageForward(b.tokens.data(), nullptr, B, T, nullptr, 0).code(),
            StatusCode::kFailedPrecondition);
  // The backward of a forward that was not kept, or of another chunk's.
  EXPECT_EQ(model
                .StageForwardBackward(b.tokens.data(), nullptr, b.targets.data(),
                                      b.output_grad.data(), B, T, 1.0, nullptr, 5)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  model.SetActiveChunk(1);
  EXPECT_EQ(model
                .StageForwardBackward(b.tokens.data(), b.input.data(), b.targets.data(),
                                      b.output_grad.data(), B, T, 1.0, nullptr, 0)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  // A larger batch while a set of the smaller one is kept.
  const Batch big = MakeBatch(0, 2 * B * T, cfg.d_model);
  EXPECT_EQ(model.StageForward(big.tokens.data(), big.input.data(), 2 * B, T).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(model.kept_forwards(), 1);
  // Under activation checkpointing the backward recomputes: nothing is kept.
  GPT2<float> checkpointed(StageZero(Arch::kGpt2, Recompute::kFull));
  EXPECT_EQ(checkpointed.StageForward(b.tokens.data(), nullptr, B, T, nullptr, 0).code(),
            StatusCode::kFailedPrecondition);
  // The pipeline's last chunk has no forward of its own.
  GPT2Config last = cfg;
  last.chunks = {{3, 4}};
  last.stage_first = false;
  last.stage_last = true;
  GPT2<float> tail(last);
  EXPECT_EQ(tail.StageForward(b.tokens.data(), b.input.data(), B, T, nullptr, 0).code(),
            StatusCode::kFailedPrecondition);
}

// The counts the memory model charges: each chunk's most forwards between F and B on a rank.
TEST(PipelineKeepTest, EachChunkKeepsItsForwardsInFlight) {
  // 1F1B, P = 4, M = 8: stage p keeps P − p; the last keeps none (its chunk has no forward).
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(MaxKeptForwards(PipelineOps(PpSchedule::k1F1B, 4, p, 8, 1), 1),
              std::vector<int>{p < 3 ? 4 - p : 0});
  }
  // All chunks together: the inputs kept at once.
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(MaxKeptForwardsAtOnce(PipelineOps(PpSchedule::k1F1B, 4, p, 8, 1)), p < 3 ? 4 - p : 0);
  }
  const std::vector<PipeOp> interleaved = PipelineOps(PpSchedule::kInterleaved1F1B, 2, 0, 4, 2);
  EXPECT_GE(MaxKeptForwardsAtOnce(interleaved), 4);
  EXPECT_LE(MaxKeptForwardsAtOnce(interleaved), 4 + 2);
  // Fewer micro-batches than stages in flight: all of them.
  EXPECT_EQ(MaxKeptForwards(OneFOneBSchedule(4, 0, 2), 1), std::vector<int>{2});
  // Zero-bubble keeps 1F1B's (its F and B are in 1F1B's order).
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(MaxKeptForwards(PipelineOps(PpSchedule::kZeroBubble, 4, p, 8, 1), 1),
              MaxKeptForwards(PipelineOps(PpSchedule::k1F1B, 4, p, 8, 1), 1));
  }
  // Interleaved, P = 2, v = 2, M = 4: stage 0's warm-up runs chunk 0 on micro-batches 0, 1,
  // chunk 1 on 0, 1, and its steady phase chunk 0 on 2 and 3 before chunk 1's backwards free
  // any: 4 for chunk 0, 2 for chunk 1; stage 1's last chunk none.
  EXPECT_EQ(MaxKeptForwards(PipelineOps(PpSchedule::kInterleaved1F1B, 2, 0, 4, 2), 2),
            (std::vector<int>{4, 2}));
  const std::vector<int> last =
      MaxKeptForwards(PipelineOps(PpSchedule::kInterleaved1F1B, 2, 1, 4, 2), 2);
  EXPECT_EQ(last[1], 0);
}

class PipelineKeepMeshTest : public PipelineMeshRunner {};

// What a rank reports of its operations (StepMetrics::pipeline_ops, pipeline_op_seconds, which
// bench/pipeline replays the schedules with): each kind's count on each stage, with time spent.
TEST_F(PipelineKeepMeshTest, EachStageReportsItsOperationsByKind) {
  struct Case {
    const char* schedule;
    int v;
    std::array<int, 4> stage0, stage1;  // forward, backward, weight, the last chunk's backward
  };
  // M = 8 / 2 = 4 micro-batches; 4 layers.
  for (const Case& c : {Case{"1f1b", 1, {4, 4, 0, 0}, {0, 0, 0, 4}},
                        Case{"interleaved_1f1b", 2, {8, 8, 0, 0}, {4, 4, 0, 4}},
                        Case{"zero_bubble", 1, {4, 4, 4, 0}, {0, 0, 4, 4}}}) {
    SCOPED_TRACE(c.schedule);
    JobSpec spec = Spec("llama", 4, PipeMesh{.P = 2});
    spec.parallelism.pp_schedule = c.schedule;
    if (c.v > 1) spec.parallelism.pp_virtual_stages = c.v;
    spec.train.steps = 2;
    const std::vector<StatusOr<PipeStepRecord>> ranks = Run(spec);
    ASSERT_EQ(ranks.size(), 2u);
    for (int p = 0; p < 2; ++p) {
      ASSERT_TRUE(ranks[p].ok()) << ranks[p].status().ToString();
      const PipeStepRecord& r = *ranks[p];
      ASSERT_EQ(r.ops.size(), 2u);
      const std::array<int, 4>& want = p == 0 ? c.stage0 : c.stage1;
      for (size_t step = 0; step < 2; ++step) {
        EXPECT_EQ(r.ops[step], want) << "stage " << p << " step " << step;
        for (int k = 0; k < 4; ++k) {
          EXPECT_EQ(r.op_seconds[step][k] > 0, want[k] > 0) << "stage " << p << " kind " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace meshrun
