// FSDP's sharded state in one process: four ranks as four threads over the fake backend (no
// sockets), against one rank that owns the whole model. What is checked is what FSDP is for:
// a sharded rank holds no full copy, materialises at most two blocks (the current one and the
// prefetched one) besides the embedding and final units, and still computes exactly the
// one-rank gradients; and the boxes a checkpoint stores for a shard cover exactly its elements.
#include "engine/train/sharding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "engine/comm/fake_backend.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/model/gpt2.h"

namespace meshrun {
namespace {

GPT2Config SmallConfig(int tp_size = 1, int tp_rank = 0, int fsdp_size = 1) {
  GPT2Config cfg;
  cfg.vocab_size = 48;
  cfg.n_layer = 3;
  cfg.n_head = 4;
  cfg.d_model = 32;
  cfg.max_seq_len = 16;
  cfg.tp_size = tp_size;
  cfg.tp_rank = tp_rank;
  cfg.fsdp_size = fsdp_size;
  return cfg;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch MakeBatch(int B, int T, int vocab) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(tok(rng));
    b.targets.push_back(tok(rng));
  }
  return b;
}

// The global row-major index of element j of a piece.
int64_t GlobalIndexInPiece(const ParamInfo& p, const ParamPiece& piece, int64_t j) {
  int64_t g = 0;
  int64_t rem = j;
  std::vector<int64_t> coord(piece.shape.size());
  for (size_t d = piece.shape.size(); d-- > 0;) {
    coord[d] = rem % piece.shape[d];
    rem /= piece.shape[d];
  }
  for (size_t d = 0; d < coord.size(); ++d) {
    g = g * p.global_shape[d] + piece.offset[d] + coord[d];
  }
  return g;
}

TEST(PiecesOfTest, EveryRangeIsCoveredExactlyWithTheRightGlobalElements) {
  // tp 2: c_attn holds three boxes (q, k, v rows), c_proj a column block.
  const std::vector<ParamInfo> layout = GPT2ParamLayout(SmallConfig(2, 1));
  std::mt19937 rng(3);
  int checked = 0;
  for (const ParamInfo& p : layout) {
    for (int trial = 0; trial < 20; ++trial) {
      std::uniform_int_distribution<int64_t> pick(0, p.numel - 1);
      int64_t a = pick(rng), b = pick(rng);
      if (a > b) std::swap(a, b);
      const int64_t count = b - a + 1;
      int64_t covered = 0;
      int64_t next_local = a;
      for (const ParamPiece& piece : PiecesOf(p, a, count)) {
        ASSERT_EQ(piece.local_first, next_local) << p.name << ": pieces are in local order";
        int64_t n = 1;
        for (int64_t d : piece.shape) n *= d;
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(GlobalIndexInPiece(p, piece, j), GlobalIndex(p, piece.local_first + j))
              << p.name << " local " << piece.local_first + j;
        }
        covered += n;
        next_local += n;
        ++checked;
      }
      ASSERT_EQ(covered, count) << p.name << " [" << a << ", " << b << "]";
    }
  }
  EXPECT_GT(checked, 1000);
}

// One rank's result of a forward/backward over the fake world.
struct RankResult {
  Status status;
  double loss = 0;
  std::vector<float> shard_grads;
  std::vector<ShardSegment> segments;
  bool owned_storage = true;
  bool units_left_gathered = false;
  size_t parameter_buffers = 0, gradient_buffers = 0;
};

// micro_batches > 1 runs the batch that many times as gradient accumulation (the reduce-scatter
// of one micro-batch's last unit is then still in flight when the next forward starts).
std::vector<RankResult> RunSharded(int n, bool reshard, const Batch& batch, int B, int T,
                                   bool gather_bf16 = false,
                                   std::shared_ptr<CommStats> stats = nullptr,
                                   int micro_batches = 1) {
  std::shared_ptr<FakeWorld> world = FakeWorld::Create(n);
  std::vector<std::unique_ptr<Communicator>> comms = world->ConnectAll(MeshAxis::kDpShardCp, stats);
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankResult& out = results[r];
      GPT2<float> model(SmallConfig(1, 0, n), /*own_storage=*/false);
      ShardedState state(&model, comms[r].get(), nullptr, nullptr, reshard);
      state.set_gather_bf16(gather_bf16);
      state.InitDeterministic(42);
      ModelParallel par;
      par.fsdp = &state;
      model.SetParallel(&par);
      state.ZeroGrad();
      // Every rank runs the same batch, so the mean over the group is the one-rank gradient.
      StatusOr<double> loss = 0.0;
      for (int m = 0; m < micro_batches && loss.ok(); ++m) {
        state.set_last_micro_batch(m + 1 == micro_batches);
        loss = model.ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T,
                                     1.0 / (static_cast<double>(n) * B * T));
      }
      out.status = loss.ok() ? state.FinishGradients() : loss.status();
      if (!out.status.ok()) return;
      out.loss = *loss;
      out.shard_grads.assign(state.grads(), state.grads() + state.size());
      out.segments = state.segments();
      out.owned_storage = model.owns_storage();
      for (size_t u = 0; u < model.units().size(); ++u) {
        const int ui = static_cast<int>(u);
        out.units_left_gathered |= model.unit_params(ui) != nullptr;
        out.units_left_gathered |= model.unit_grads(ui) != nullptr;
      }
      out.parameter_buffers = state.parameter_buffers();
      out.gradient_buffers = state.gradient_buffers();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

class ShardedStateTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::SetNumThreads(1); }
};

TEST_P(ShardedStateTest, FourShardsComputeTheOneRankGradientsAndMaterialiseOneBlock) {
  const bool reshard = GetParam();
  const int B = 2, T = 16;
  const GPT2Config cfg = SmallConfig();
  const Batch batch = MakeBatch(B, T, cfg.vocab_size);

  GPT2<float> reference(cfg);
  reference.InitDeterministic(42);
  reference.ZeroGrad();
  StatusOr<double> want_loss = reference.ForwardBackward(batch.inputs.data(), batch.targets.data(),
                                                         B, T, 1.0 / (static_cast<double>(B) * T));
  ASSERT_TRUE(want_loss.ok()) << want_loss.status().ToString();

  const std::vector<RankResult> ranks = RunSharded(4, reshard, batch, B, T);
  int64_t elements = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankResult& got = ranks[r];
    ASSERT_TRUE(got.status.ok()) << "rank " << r << ": " << got.status.ToString();
    EXPECT_FALSE(got.owned_storage) << "a sharded model must not own full buffers";
    EXPECT_FALSE(got.units_left_gathered) << "every unit is freed after its backward";
    EXPECT_NEAR(got.loss, *want_loss, 1e-6 * std::fabs(*want_loss));
    // Units 0 and L+1 stay from forward to backward; resharding adds one block at a time
    // (a freed buffer is reused by any unit it fits), keeping every block's parameters adds
    // all of them (L = 3).
    if (reshard) {
      EXPECT_LE(got.parameter_buffers, 3u);
    } else {
      EXPECT_EQ(got.parameter_buffers, 5u);
    }
    EXPECT_LE(got.gradient_buffers, 3u);
    for (const ShardSegment& s : got.segments) {
      const ParamInfo& p = reference.params()[s.param];
      const float* want = reference.grad(p) + s.param_first;
      for (int64_t i = 0; i < s.count; ++i) {
        ASSERT_NEAR(got.shard_grads[s.shard_offset + i], want[i], 1e-6 + 1e-4 * std::fabs(want[i]))
            << p.name << "[" << s.param_first + i << "] on rank " << r;
      }
      elements += s.count;
    }
  }
  EXPECT_EQ(elements, [&] {
    int64_t n = 0;
    for (const ParamInfo& p : reference.params()) n += p.numel;
    return n;
  }()) << "the four shards hold every element exactly once";
}

INSTANTIATE_TEST_SUITE_P(ReshardAfterForward, ShardedStateTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Reshard" : "KeepUntilBackward";
                         });

// Gradient accumulation with the overlapped reduce-scatters: each micro-batch's last unit is
// reduce-scattered while the next forward runs, and the shard still sums every micro-batch.
TEST(ShardedOverlapTest, MicroBatchesAccumulateTheOneRankGradients) {
  cpu::SetNumThreads(1);
  const int B = 2, T = 16, micro = 3;
  const GPT2Config cfg = SmallConfig();
  const Batch batch = MakeBatch(B, T, cfg.vocab_size);
  GPT2<float> reference(cfg);
  reference.InitDeterministic(42);
  reference.ZeroGrad();
  for (int m = 0; m < micro; ++m) {
    ASSERT_TRUE(reference
                    .ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T,
                                     1.0 / (static_cast<double>(B) * T))
                    .ok());
  }
  const std::vector<RankResult> ranks = RunSharded(4, true, batch, B, T, false, nullptr, micro);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankResult& got = ranks[r];
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    EXPECT_LE(got.parameter_buffers, 3u) << "the prefetch keeps at most two blocks gathered";
    EXPECT_LE(got.gradient_buffers, 3u) << "one reduce-scatter in flight";
    for (const ShardSegment& s : got.segments) {
      const ParamInfo& p = reference.params()[s.param];
      const float* want = reference.grad(p) + s.param_first;
      for (int64_t i = 0; i < s.count; ++i) {
        ASSERT_NEAR(got.shard_grads[s.shard_offset + i], want[i], 1e-6 + 1e-4 * std::fabs(want[i]))
            << p.name << "[" << s.param_first + i << "] on rank " << r;
      }
    }
  }
}

// Mixed precision's gathers on the host (the trainer uses them on cuda only): the shard is sent
// as bf16, half the bytes, and the model computes with the bf16-rounded weights, so the loss and
// gradients agree with float32 within bf16 rounding.
TEST(ShardedOverlapTest, Bf16GathersSendHalfTheBytesAndStayWithinBf16Rounding) {
  cpu::SetNumThreads(1);
  const int B = 2, T = 16;
  const Batch batch = MakeBatch(B, T, SmallConfig().vocab_size);
  auto fp32_stats = std::make_shared<CommStats>(), bf16_stats = std::make_shared<CommStats>();
  const std::vector<RankResult> fp32 = RunSharded(4, true, batch, B, T, false, fp32_stats);
  const std::vector<RankResult> bf16 = RunSharded(4, true, batch, B, T, true, bf16_stats);
  const CommCounter g32 = fp32_stats->Get(MeshAxis::kDpShard, CommOp::kAllGather);
  const CommCounter g16 = bf16_stats->Get(MeshAxis::kDpShard, CommOp::kAllGather);
  ASSERT_GT(g32.calls, 0u);
  EXPECT_EQ(g16.calls, g32.calls);
  EXPECT_DOUBLE_EQ(g16.bytes * 2, g32.bytes);
  EXPECT_EQ(bf16_stats->Get(MeshAxis::kDpShard, CommOp::kReduceScatter).bytes,
            fp32_stats->Get(MeshAxis::kDpShard, CommOp::kReduceScatter).bytes)
      << "gradients are reduce-scattered in float32";
  for (size_t r = 0; r < fp32.size(); ++r) {
    ASSERT_TRUE(fp32[r].status.ok()) << fp32[r].status.ToString();
    ASSERT_TRUE(bf16[r].status.ok()) << bf16[r].status.ToString();
    EXPECT_NE(bf16[r].loss, fp32[r].loss) << "the weights were rounded";
    EXPECT_NEAR(bf16[r].loss, fp32[r].loss, 1e-2 * std::fabs(fp32[r].loss));
    double diff = 0, norm = 0;
    for (size_t i = 0; i < fp32[r].shard_grads.size(); ++i) {
      const double d = bf16[r].shard_grads[i] - fp32[r].shard_grads[i];
      diff += d * d;
      norm += static_cast<double>(fp32[r].shard_grads[i]) * fp32[r].shard_grads[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), 3e-2) << "rank " << r;
    EXPECT_FALSE(bf16[r].units_left_gathered);
  }
}

// A communicator that overlaps as NCCL does, on the host: a started call does nothing until
// Wait, which runs it (on an inner fake communicator). A caller that reads a started call's
// output, or writes its input, before Wait computes something else; the CPU backends, which
// complete in Start, would hide that.
class DeferredCommunicator final : public Communicator {
 public:
  DeferredCommunicator(CommConfig config, std::unique_ptr<Communicator> inner)
      : Communicator(std::move(config)), inner_(std::move(inner)) {}
  bool overlaps() const override { return true; }
  int started = 0;

 protected:
  Status DoAllReduce(float* data, size_t count, Duration t) override {
    return inner_->AllReduce(data, count, t);
  }
  Status DoReduceScatter(const float* in, float* out, size_t count, Duration t) override {
    return inner_->ReduceScatter(in, out, count, t);
  }
  Status DoAllGather(const void* in, void* out, size_t bytes, Duration t) override {
    return inner_->AllGatherBytes(in, out, bytes, t);
  }
  Status DoBroadcast(void* data, size_t bytes, int root, Duration t) override {
    return inner_->BroadcastBytes(data, bytes, root, t);
  }
  Status DoSendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                    int src, Duration t) override {
    return inner_->SendRecvBytes(send, send_bytes, dst, recv, recv_bytes, src, t);
  }
  Status DoBarrier(Duration t) override { return inner_->Barrier(t); }
  StatusOr<int64_t> DoStart(AsyncOp op, const void* input, void* output, size_t count,
                            Duration) override {
    pending_[next_] = {op, input, output, count};
    ++started;
    return next_++;
  }
  Status DoWait(int64_t ticket, Duration t, double*) override {
    const Call c = pending_.at(ticket);
    pending_.erase(ticket);
    switch (c.op) {
      case AsyncOp::kAllReduce: return inner_->AllReduce(static_cast<float*>(c.output), c.count, t);
      case AsyncOp::kReduceScatter:
        return inner_->ReduceScatter(static_cast<const float*>(c.input),
                                     static_cast<float*>(c.output), c.count, t);
      case AsyncOp::kAllGather:
        return inner_->AllGather(static_cast<const float*>(c.input), static_cast<float*>(c.output),
                                 c.count, t);
      case AsyncOp::kAllGatherBytes: return inner_->AllGatherBytes(c.input, c.output, c.count, t);
    }
    return InternalError("unknown op");
  }

 private:
  struct Call {
    AsyncOp op;
    const void* input;
    void* output;
    size_t count;
  };
  std::unique_ptr<Communicator> inner_;
  std::map<int64_t, Call> pending_;
  int64_t next_ = 0;
};

// dp_replicate 2 × dp_shard S on communicators that really defer their started calls, with a
// bucket per unit and three micro-batches: the prefetched gathers (bf16 ones too), the
// reduce-scatters waited for a unit later (one across micro-batches) and the buckets started
// during the last backward still give every rank the one-rank gradients of the batch (within
// bf16 rounding for bf16 gathers). S = 1: replicas only, the buckets follow the model's backward.
struct DeferredCase {
  int S;
  bool bf16;
};
class DeferredTest : public ::testing::TestWithParam<DeferredCase> {};

TEST_P(DeferredTest, DeferredCallsAndBucketsGiveTheOneRankGradients) {
  cpu::SetNumThreads(1);
  const int B = 2, T = 16, micro = 3, R = 2, S = GetParam().S;
  const bool bf16 = GetParam().bf16;
  const GPT2Config cfg = SmallConfig();
  const Batch batch = MakeBatch(B, T, cfg.vocab_size);
  GPT2<float> reference(cfg);
  reference.InitDeterministic(42);
  reference.ZeroGrad();
  for (int m = 0; m < micro; ++m) {
    ASSERT_TRUE(reference
                    .ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T,
                                     1.0 / (static_cast<double>(B) * T))
                    .ok());
  }
  // Rank g = r·S + s: fsdp group r (ranks s), replicate group s (ranks r).
  std::vector<std::unique_ptr<DeferredCommunicator>> fsdp(R * S), replicate(R * S);
  for (int r = 0; r < R; ++r) {
    auto world = FakeWorld::Create(S, "fsdp/" + std::to_string(r));
    for (int s = 0; s < S; ++s) {
      CommConfig c{MeshAxis::kDpShardCp,
                   "fsdp/" + std::to_string(r),
                   s,
                   S,
                   std::chrono::seconds(10),
                   nullptr};
      fsdp[r * S + s] = std::make_unique<DeferredCommunicator>(c, world->Connect(c).value());
    }
  }
  for (int s = 0; s < S; ++s) {
    auto world = FakeWorld::Create(R, "replicate/" + std::to_string(s));
    for (int r = 0; r < R; ++r) {
      CommConfig c{MeshAxis::kDpReplicate,
                   "replicate/" + std::to_string(s),
                   r,
                   R,
                   std::chrono::seconds(10),
                   nullptr};
      replicate[r * S + s] = std::make_unique<DeferredCommunicator>(c, world->Connect(c).value());
    }
  }
  std::vector<RankResult> results(R * S);
  std::vector<size_t> buckets(R * S);
  std::vector<std::thread> threads;
  for (int g = 0; g < R * S; ++g) {
    threads.emplace_back([&, g] {
      RankResult& out = results[g];
      GPT2<float> model(SmallConfig(1, 0, S), /*own_storage=*/S == 1);
      ShardedState state(&model, S > 1 ? fsdp[g].get() : nullptr, replicate[g].get(), nullptr,
                         true);
      state.set_gather_bf16(bf16);
      state.set_replicate_bucket_bytes(1);  // one bucket per unit
      buckets[g] = state.replicate_buckets().size();
      state.InitDeterministic(42);
      ModelParallel par;
      par.fsdp = &state;
      model.SetParallel(&par);
      state.ZeroGrad();
      StatusOr<double> loss = 0.0;
      for (int m = 0; m < micro && loss.ok(); ++m) {
        state.set_last_micro_batch(m + 1 == micro);
        loss = model.ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T,
                                     1.0 / (static_cast<double>(R * S) * B * T));
      }
      out.status = loss.ok() ? state.FinishGradients() : loss.status();
      if (!out.status.ok()) return;
      out.shard_grads.assign(state.grads(), state.grads() + state.size());
      out.segments = state.segments();
      out.parameter_buffers = state.parameter_buffers();
      out.gradient_buffers = state.gradient_buffers();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int g = 0; g < R * S; ++g) {
    const RankResult& got = results[g];
    ASSERT_TRUE(got.status.ok()) << "rank " << g << ": " << got.status.ToString();
    EXPECT_EQ(buckets[g], reference.units().size());
    EXPECT_EQ(fsdp[g]->started > 0, S > 1);
    EXPECT_EQ(replicate[g]->started, static_cast<int>(reference.units().size()));
    EXPECT_LE(got.parameter_buffers, 3u);
    EXPECT_LE(got.gradient_buffers, 3u);
    double diff = 0, norm = 0;
    for (const ShardSegment& s : got.segments) {
      const ParamInfo& p = reference.params()[s.param];
      const float* want = reference.grad(p) + s.param_first;
      for (int64_t i = 0; i < s.count; ++i) {
        const double d = got.shard_grads[s.shard_offset + i] - want[i];
        diff += d * d;
        norm += static_cast<double>(want[i]) * want[i];
        if (!bf16) {
          ASSERT_NEAR(got.shard_grads[s.shard_offset + i], want[i],
                      1e-6 + 1e-4 * std::fabs(want[i]))
              << p.name << "[" << s.param_first + i << "] on rank " << g;
        }
      }
    }
    EXPECT_LT(std::sqrt(diff / norm), bf16 ? 3e-2 : 1e-5) << "rank " << g;
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, DeferredTest,
                         ::testing::Values(DeferredCase{2, false}, DeferredCase{1, false},
                                           DeferredCase{2, true}),
                         [](const ::testing::TestParamInfo<DeferredCase>& info) {
                           return "R2S" + std::to_string(info.param.S) +
                                  (info.param.bf16 ? "_bf16" : "");
                         });

TEST(RecomputeTest, SelectiveAndFullGiveTheSameLossAndGradientsAsNone) {
  cpu::SetNumThreads(1);
  const int B = 2, T = 16;
  const Batch batch = MakeBatch(B, T, SmallConfig().vocab_size);
  auto run = [&](Recompute mode, std::vector<float>* grads) {
    GPT2Config cfg = SmallConfig();
    cfg.recompute = mode;
    GPT2<float> model(cfg);
    model.InitDeterministic(5);
    model.ZeroGrad();
    StatusOr<double> loss = model.ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T,
                                                  1.0 / (static_cast<double>(B) * T));
    EXPECT_TRUE(loss.ok());
    grads->assign(model.grads_data(), model.grads_data() + model.num_params());
    return loss.ok() ? *loss : 0.0;
  };
  std::vector<float> none, selective, full;
  const double loss_none = run(Recompute::kNone, &none);
  EXPECT_EQ(run(Recompute::kSelective, &selective), loss_none);
  EXPECT_EQ(run(Recompute::kFull, &full), loss_none);
  // The same kernels on the same inputs: bitwise the same gradients.
  EXPECT_EQ(selective, none);
  EXPECT_EQ(full, none);
}

}  // namespace
}  // namespace meshrun
