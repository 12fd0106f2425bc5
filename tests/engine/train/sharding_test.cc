// FSDP's sharded state in one process: four ranks as four threads over the fake backend (no
// sockets), against one rank that owns the whole model. What is checked is what FSDP is for:
// a sharded rank holds no full copy, materialises at most one block besides the embedding and
// final units, and still computes exactly the one-rank gradients; and the boxes a checkpoint
// stores for a shard cover exactly its elements.
#include "engine/train/sharding.h"

#include <gtest/gtest.h>

#include <cmath>
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

std::vector<RankResult> RunSharded(int n, bool reshard, const Batch& batch, int B, int T) {
  std::shared_ptr<FakeWorld> world = FakeWorld::Create(n);
  std::vector<std::unique_ptr<Communicator>> comms =
      world->ConnectAll(MeshAxis::kDpShardCp, nullptr);
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankResult& out = results[r];
      GPT2<float> model(SmallConfig(1, 0, n), /*own_storage=*/false);
      ShardedState state(&model, comms[r].get(), nullptr, nullptr, reshard);
      state.InitDeterministic(42);
      ModelParallel par;
      par.fsdp = &state;
      model.SetParallel(&par);
      state.ZeroGrad();
      // Every rank runs the same batch, so the mean over the group is the one-rank gradient.
      StatusOr<double> loss = model.ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T,
                                                    1.0 / (static_cast<double>(n) * B * T));
      out.status = loss.status();
      if (!loss.ok()) return;
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
