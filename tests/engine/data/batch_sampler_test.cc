// Tests for the window sampler of docs/data.md (sequential, shuffled, dp slices) and the cp
// chunk split.
#include "engine/data/batch_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

namespace meshrun {
namespace {

TokenStream Iota(int64_t n) {
  TokenStream s;
  s.path = "iota";
  s.format = "text";
  s.tokens.resize(static_cast<size_t>(n));
  std::iota(s.tokens.begin(), s.tokens.end(), 0);
  s.max_token_id = static_cast<int32_t>(n - 1);
  return s;
}

TEST(BatchSamplerTest, SequentialWindowsAndWraparound) {
  // N = 23 tokens, T = 4: N_w = floor(22 / 4) = 5 windows.
  const TokenStream s = Iota(23);
  auto sampler = BatchSampler::Create(&s, 4, 3, 0, Order::kSequential);
  ASSERT_TRUE(sampler.ok()) << sampler.status().ToString();
  EXPECT_EQ(sampler->num_windows(), 5);
  std::vector<int32_t> in(3 * 4), tgt(3 * 4);
  // Step 1 takes windows 3, 4, 0 (wraps).
  ASSERT_TRUE(sampler->Fill(1, 0, 3, in.data(), tgt.data()).ok());
  const int expected_windows[3] = {3, 4, 0};
  for (int i = 0; i < 3; ++i) {
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(in[i * 4 + t], expected_windows[i] * 4 + t);
      EXPECT_EQ(tgt[i * 4 + t], expected_windows[i] * 4 + t + 1);
    }
  }
  // The last window's last target is token N_w·T, which exists (N − 1 ≥ N_w·T).
  EXPECT_EQ(tgt[1 * 4 + 3], 20);
  for (int64_t k = 0; k < 10; ++k) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sampler->WindowOf(k, i), (k * 3 + i) % 5);
  }
}

TEST(BatchSamplerTest, ExactFitHasNoExtraWindow) {
  const TokenStream s = Iota(9);  // N − 1 = 8 = 2·T: two windows, the last target is token 8
  auto sampler = BatchSampler::Create(&s, 4, 1, 0, Order::kSequential);
  ASSERT_TRUE(sampler.ok());
  EXPECT_EQ(sampler->num_windows(), 2);
}

TEST(BatchSamplerTest, TooShortStreamIsAnError) {
  const TokenStream s = Iota(4);
  auto sampler = BatchSampler::Create(&s, 4, 1, 0, Order::kSequential);
  ASSERT_FALSE(sampler.ok());
  EXPECT_NE(sampler.status().message().find("too short"), std::string::npos);
  EXPECT_TRUE(BatchSampler::Create(&s, 3, 1, 0, Order::kSequential).ok());
}

TEST(BatchSamplerTest, FillRangeIsChecked) {
  const TokenStream s = Iota(100);
  auto sampler = BatchSampler::Create(&s, 4, 4, 0, Order::kSequential);
  ASSERT_TRUE(sampler.ok());
  std::vector<int32_t> in(16), tgt(16);
  EXPECT_FALSE(sampler->Fill(0, 2, 3, in.data(), tgt.data()).ok());
  EXPECT_FALSE(sampler->Fill(-1, 0, 1, in.data(), tgt.data()).ok());
  EXPECT_TRUE(sampler->Fill(0, 2, 2, in.data(), tgt.data()).ok());
}

TEST(BatchSamplerTest, ShuffledIsAPermutationPerEpoch) {
  const TokenStream s = Iota(7 * 8 + 1);  // N_w = 7 with T = 8
  // B = 3 does not divide N_w, so steps straddle epochs.
  auto sampler = BatchSampler::Create(&s, 8, 3, 42, Order::kShuffled);
  ASSERT_TRUE(sampler.ok());
  ASSERT_EQ(sampler->num_windows(), 7);
  std::vector<int64_t> slots;
  for (int64_t k = 0; k < 7 * 4; ++k) {  // 84 slots = 12 epochs
    for (int i = 0; i < 3; ++i) slots.push_back(sampler->WindowOf(k, i));
  }
  bool some_epoch_not_identity = false;
  for (size_t e = 0; e < 12; ++e) {
    std::vector<int64_t> epoch(slots.begin() + e * 7, slots.begin() + (e + 1) * 7);
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> identity(7);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(sorted, identity) << "epoch " << e;
    const EpochShuffle shuffle(7, 42, static_cast<int64_t>(e));
    for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(epoch[i], shuffle.At(i)) << "epoch " << e;
    if (epoch != identity) some_epoch_not_identity = true;
  }
  EXPECT_TRUE(some_epoch_not_identity);
  // Epochs get different permutations.
  const EpochShuffle e0(100, 42, 0), e1(100, 42, 1);
  std::vector<int64_t> p0, p1;
  for (int64_t i = 0; i < 100; ++i) {
    p0.push_back(e0.At(i));
    p1.push_back(e1.At(i));
  }
  EXPECT_NE(p0, p1);
}

// The Feistel order is a bijection of [0, n) for every n: small ones, each side of the powers of
// 4 where the cipher's domain grows, and a few larger ones.
TEST(EpochShuffleTest, IsABijectionForEverySize) {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 300; ++n) sizes.push_back(n);
  for (int64_t p = 16; p <= (int64_t{1} << 20); p *= 4) {
    for (int64_t d : {-1, 0, 1}) sizes.push_back(p + d);
  }
  sizes.push_back(999983);
  for (int64_t n : sizes) {
    const EpochShuffle shuffle(n, 1337, 5);
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t w = shuffle.At(i);
      ASSERT_GE(w, 0) << "n " << n;
      ASSERT_LT(w, n) << "n " << n;
      ASSERT_FALSE(seen[static_cast<size_t>(w)]) << "n " << n << ": " << w << " twice";
      seen[static_cast<size_t>(w)] = true;
    }
  }
}

// Nothing is stored, so an epoch of 2^40 windows (a petabyte-scale data set) costs what one of
// ten does; its indices stay in range and distinct.
TEST(EpochShuffleTest, HugeEpochsNeedNoTable) {
  const int64_t n = (int64_t{1} << 40) + 12345;
  const EpochShuffle shuffle(n, 7, 0);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 1000; ++i) {
    const int64_t w = shuffle.At(i * 1000003);
    EXPECT_GE(w, 0);
    EXPECT_LT(w, n);
    seen.insert(w);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

// Over many epochs (keys), the window at a position is close to uniform: each of 10 windows comes
// first 2,000 ± 300 times in 20,000 epochs (the standard deviation is 42).
TEST(EpochShuffleTest, PositionsAreCloseToUniformOverKeys) {
  std::vector<int> first(10, 0), last(10, 0);
  for (int64_t e = 0; e < 20000; ++e) {
    const EpochShuffle shuffle(10, 2024, e);
    ++first[static_cast<size_t>(shuffle.At(0))];
    ++last[static_cast<size_t>(shuffle.At(9))];
  }
  for (int w = 0; w < 10; ++w) {
    EXPECT_NEAR(first[w], 2000, 300) << "window " << w;
    EXPECT_NEAR(last[w], 2000, 300) << "window " << w;
  }
}

// A checkpoint written before the Feistel order resumes with the stored Fisher–Yates
// permutation it was reading (decision 0042): set_shuffle(kFisherYates) gives exactly it.
TEST(BatchSamplerTest, FisherYatesRuleIsThePreviousOrder) {
  const TokenStream s = Iota(7 * 8 + 1);  // N_w = 7
  auto sampler = BatchSampler::Create(&s, 8, 3, 42, Order::kShuffled);
  ASSERT_TRUE(sampler.ok());
  EXPECT_EQ(sampler->shuffle(), ShuffleRule::kFeistel);
  sampler->set_shuffle(ShuffleRule::kFisherYates);
  for (int64_t slot = 0; slot < 7 * 5; ++slot) {
    EXPECT_EQ(sampler->WindowOf(slot / 3, static_cast<int>(slot % 3)),
              EpochPermutation(7, 42, slot / 7)[slot % 7])
        << "slot " << slot;
  }
  EXPECT_EQ(*ParseShuffleRule(ShuffleRuleName(ShuffleRule::kFeistel)), ShuffleRule::kFeistel);
  EXPECT_EQ(*ParseShuffleRule("fisher-yates"), ShuffleRule::kFisherYates);
  EXPECT_FALSE(ParseShuffleRule("random").ok());
}

TEST(BatchSamplerTest, ShuffledIsDeterministicAndSeedDependent) {
  const TokenStream s = Iota(1000);
  auto a = BatchSampler::Create(&s, 4, 8, 1337, Order::kShuffled);
  auto b = BatchSampler::Create(&s, 4, 8, 1337, Order::kShuffled);
  auto c = BatchSampler::Create(&s, 4, 8, 1338, Order::kShuffled);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<int64_t> wa, wb, wc;
  // Visit b's steps in reverse to show the result does not depend on call order.
  for (int64_t k = 0; k < 100; ++k) {
    for (int i = 0; i < 8; ++i) {
      wa.push_back(a->WindowOf(k, i));
      wc.push_back(c->WindowOf(k, i));
    }
  }
  wb.resize(wa.size());
  for (int64_t k = 99; k >= 0; --k) {
    for (int i = 0; i < 8; ++i) wb[k * 8 + i] = b->WindowOf(k, i);
  }
  EXPECT_EQ(wa, wb);
  EXPECT_NE(wa, wc);
  // Pinned values: the order must be identical on every machine and build. A change here
  // changes every shuffled run: only on purpose, with a new ShuffleRule for old checkpoints.
  std::vector<int64_t> feistel0, feistel3;
  for (int64_t i = 0; i < 10; ++i) {
    feistel0.push_back(EpochShuffle(10, 1337, 0).At(i));
    feistel3.push_back(EpochShuffle(10, 1337, 3).At(i));
  }
  EXPECT_EQ(feistel0, (std::vector<int64_t>{7, 1, 2, 5, 6, 3, 9, 4, 0, 8}));
  EXPECT_EQ(feistel3, (std::vector<int64_t>{4, 7, 8, 0, 2, 5, 1, 9, 6, 3}));
  // The previous rule (ShuffleRule::kFisherYates), which old checkpoints resume with.
  EXPECT_EQ(EpochPermutation(10, 1337, 0), (std::vector<int64_t>{3, 0, 9, 6, 5, 1, 4, 7, 8, 2}));
  EXPECT_EQ(EpochPermutation(10, 1337, 3), (std::vector<int64_t>{5, 8, 3, 4, 2, 7, 6, 1, 0, 9}));
}

TEST(BatchSamplerTest, SplitMixMatchesReference) {
  // Reference values of splitmix64 seeded with 0 (from the public-domain C implementation).
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(rng.Next(), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(rng.Next(), 0x06C45D188009454FULL);
}

TEST(BatchSamplerTest, UnionOfDpSlicesIsTheGlobalBatch) {
  const TokenStream s = Iota(5000);
  const int T = 16, B = 8;
  for (Order order : {Order::kSequential, Order::kShuffled}) {
    auto sampler = BatchSampler::Create(&s, T, B, 7, order);
    ASSERT_TRUE(sampler.ok());
    for (int64_t step : {0, 1, 37}) {
      std::vector<int32_t> gin(B * T), gtgt(B * T);
      ASSERT_TRUE(sampler->Fill(step, 0, B, gin.data(), gtgt.data()).ok());
      for (int dp : {1, 2, 4}) {
        std::vector<int32_t> uin(B * T, -1), utgt(B * T, -1);
        for (int d = 0; d < dp; ++d) {
          auto range = DpRankRange(B, dp, d);
          ASSERT_TRUE(range.ok());
          // Each dp rank fills its slice in micro-batches of 1 sequence.
          for (int m = 0; m < range->count; ++m) {
            const int seq = range->first + m;
            ASSERT_TRUE(sampler->Fill(step, seq, 1, &uin[seq * T], &utgt[seq * T]).ok());
          }
        }
        EXPECT_EQ(uin, gin) << "dp=" << dp << " step=" << step;
        EXPECT_EQ(utgt, gtgt) << "dp=" << dp << " step=" << step;
      }
    }
  }
  EXPECT_FALSE(DpRankRange(6, 4, 0).ok());
  EXPECT_FALSE(DpRankRange(8, 4, 4).ok());
}

TEST(CpChunkTest, ChunksCoverTheSequenceOnceWithGlobalPositions) {
  const int L = 16;
  std::vector<int32_t> seq(L);
  for (int i = 0; i < L; ++i) seq[i] = 100 + i;
  for (int C : {1, 2, 4}) {
    ASSERT_TRUE(ValidateCpSplit(L, C, 0).ok());
    std::vector<int> seen(L, 0);
    for (int c = 0; c < C; ++c) {
      std::vector<int32_t> tok(L / C), pos(L / C);
      CpChunk(seq.data(), L, C, c, tok.data(), pos.data());
      for (int j = 0; j < L / C; ++j) {
        ASSERT_GE(pos[j], 0);
        ASSERT_LT(pos[j], L);
        EXPECT_EQ(tok[j], seq[pos[j]]);
        ++seen[pos[j]];
      }
      if (C > 1) {
        const int chunk = L / (2 * C);
        EXPECT_EQ(pos[0], c * chunk);                    // chunk c first
        EXPECT_EQ(pos[chunk], (2 * C - 1 - c) * chunk);  // then chunk 2C−1−c
      }
    }
    EXPECT_EQ(seen, std::vector<int>(L, 1)) << "C=" << C;
  }
  // C = 2, rank 0 holds chunks 0 and 3 of 4: positions 0..3 and 12..15.
  std::vector<int32_t> tok(8), pos(8);
  CpChunk(seq.data(), L, 2, 0, tok.data(), pos.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
}

TEST(CpChunkTest, BatchHelperAndValidation) {
  const int L = 8, N = 3, C = 2;
  std::vector<int32_t> tokens(N * L);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<int32_t> out(N * L / C), pos(N * L / C), single(L / C);
  CpChunkBatch(tokens.data(), N, L, C, 1, out.data(), pos.data());
  for (int s = 0; s < N; ++s) {
    CpChunk(tokens.data() + s * L, L, C, 1, single.data(), nullptr);
    EXPECT_TRUE(std::equal(single.begin(), single.end(), out.begin() + s * L / C));
    EXPECT_EQ(pos[s * L / C], 2);  // rank 1 of 2: chunk 1 of 4 starts at position 2
  }
  EXPECT_FALSE(ValidateCpSplit(10, 2, 0).ok());
  EXPECT_FALSE(ValidateCpSplit(8, 2, 2).ok());
  EXPECT_TRUE(ValidateCpSplit(7, 1, 0).ok());
}

TEST(OrderTest, Parse) {
  EXPECT_EQ(*ParseOrder("sequential"), Order::kSequential);
  EXPECT_EQ(*ParseOrder("shuffled"), Order::kShuffled);
  EXPECT_FALSE(ParseOrder("random").ok());
}

}  // namespace
}  // namespace meshrun
