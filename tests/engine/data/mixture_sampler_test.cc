// Weighted mixtures of docs/data.md "Mixtures": the measured proportions, the schedule as the
// docs word it (reimplemented here from the text), one source equal to BatchSampler, the same
// global batches whatever the dp split, per-source epochs, and the per-source counters.
#include "engine/data/mixture_sampler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

// A stream of n tokens first, first + 1, …, written as a nanoGPT file (raw little-endian
// uint16) and loaded as the trainer loads one (so the test does not depend on how a TokenStream
// holds its tokens).
TokenStream MixStream(int32_t first, int64_t n) {
  static const fs::path dir = [] {
    char pattern[] = "/tmp/meshrun_mixture_test_XXXXXX";
    EXPECT_NE(mkdtemp(pattern), nullptr);
    static const std::string made = pattern;
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(made, ec);
    });
    return fs::path(pattern);
  }();
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<uint16_t>(first + i);
    bytes.push_back(static_cast<char>(id & 0xFF));
    bytes.push_back(static_cast<char>(id >> 8));
  }
  const std::string path =
      (dir / ("s" + std::to_string(first) + "-" + std::to_string(n) + ".bin")).string();
  std::ofstream(path, std::ios::binary) << bytes;
  StatusOr<TokenStream> s = LoadTokens(path, "nanogpt");
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : TokenStream{};
}

// The schedule exactly as docs/data.md words it, written from the text: quotas
// q_i = round(2^30·w_i/Σw); errors e_i start at 0; for each slot every e_i += q_i, the largest
// (lowest index on a tie) takes the slot and gives back Q = Σq_i.
std::vector<int> MixDocSchedule(const std::vector<double>& w, int64_t slots) {
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<int64_t> q, e(w.size(), 0);
  int64_t Q = 0;
  for (double x : w) {
    q.push_back(static_cast<int64_t>(std::round(x / sum * 1073741824.0)));
    Q += q.back();
  }
  std::vector<int> out;
  for (int64_t g = 0; g < slots; ++g) {
    size_t j = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      e[i] += q[i];
      if (e[i] > e[j]) j = i;
    }
    e[j] -= Q;
    out.push_back(static_cast<int>(j));
  }
  return out;
}

TEST(MixtureSamplerTest, SeventyThirtyWithinOnePercentOverTenThousandWindows) {
  const TokenStream a = MixStream(0, 4001), b = MixStream(10000, 2001);
  auto sampler = MixtureSampler::Create({{&a, 0.7}, {&b, 0.3}}, 8, 10, 1337, Order::kShuffled);
  ASSERT_TRUE(sampler.ok()) << sampler.status().ToString();
  int64_t count[2] = {0, 0};
  for (int64_t k = 0; k < 1000; ++k) {  // 1000 steps × 10 = 10,000 windows
    for (int i = 0; i < 10; ++i) {
      const MixtureSampler::Window w = sampler->WindowOf(k, i);
      ++count[w.source];
      // The greedy schedule stays within one window of each share at every prefix.
      const double g = static_cast<double>(k * 10 + i + 1);
      EXPECT_LE(std::fabs(count[0] - 0.7 * g), 1.0) << "after " << g << " windows";
      EXPECT_LE(std::fabs(count[1] - 0.3 * g), 1.0) << "after " << g << " windows";
    }
  }
  EXPECT_NEAR(count[0] / 10000.0, 0.7, 0.01);
  EXPECT_NEAR(count[1] / 10000.0, 0.3, 0.01);
  // The tokens say which source a sequence came from.
  std::vector<int32_t> in(10 * 8), tg(10 * 8);
  ASSERT_TRUE(sampler->Fill(7, 0, 10, in.data(), tg.data()).ok());
  for (int i = 0; i < 10; ++i) {
    const MixtureSampler::Window w = sampler->WindowOf(7, i);
    const int32_t first = (w.source == 0 ? 0 : 10000) + static_cast<int32_t>(w.window) * 8;
    EXPECT_EQ(in[i * 8], first);
    EXPECT_EQ(tg[i * 8 + 7], first + 8);
  }
}

TEST(MixtureSamplerTest, ScheduleIsTheOneTheDocsWord) {
  const TokenStream a = MixStream(0, 401), b = MixStream(1000, 301), c = MixStream(2000, 201);
  for (const std::vector<double>& w :
       std::vector<std::vector<double>>{{0.7, 0.3}, {0.5, 0.3, 0.2}, {1, 1, 1}, {5, 0.01, 2}}) {
    std::vector<MixtureSampler::Source> sources;
    const TokenStream* streams[3] = {&a, &b, &c};
    for (size_t i = 0; i < w.size(); ++i) sources.push_back({streams[i], w[i]});
    auto sampler = MixtureSampler::Create(sources, 4, 6, 7, Order::kSequential);
    ASSERT_TRUE(sampler.ok()) << sampler.status().ToString();
    const std::vector<int> want = MixDocSchedule(w, 6000);
    std::vector<int64_t> counts(w.size(), 0);
    for (int64_t g = 0; g < 6000; ++g) {
      const MixtureSampler::Window got = sampler->WindowOf(g / 6, static_cast<int>(g % 6));
      ASSERT_EQ(got.source, want[g]) << "slot " << g;
      // Sequential: the source's own counter mod its N_w windows.
      EXPECT_EQ(got.window, counts[got.source] % sampler->num_windows(got.source));
      ++counts[got.source];
    }
    EXPECT_EQ(sampler->CountsBefore(1000), counts);
  }
}

TEST(MixtureSamplerTest, OneSourceIsTodaysBatchSampler) {
  const TokenStream s = MixStream(0, 1003);
  for (Order order : {Order::kSequential, Order::kShuffled}) {
    for (double weight : {1.0, 0.25}) {
      auto mixture = MixtureSampler::Create({{&s, weight}}, 16, 5, 42, order);
      auto plain = BatchSampler::Create(&s, 16, 5, 42, order);
      ASSERT_TRUE(mixture.ok() && plain.ok());
      std::vector<int32_t> in1(5 * 16), tg1(5 * 16), in2(5 * 16), tg2(5 * 16);
      for (int64_t k = 0; k < 40; ++k) {  // 200 windows: over three epochs of 62
        ASSERT_TRUE(mixture->Fill(k, 0, 5, in1.data(), tg1.data()).ok());
        ASSERT_TRUE(plain->Fill(k, 0, 5, in2.data(), tg2.data()).ok());
        EXPECT_EQ(in1, in2) << "step " << k;
        EXPECT_EQ(tg1, tg2) << "step " << k;
        for (int i = 0; i < 5; ++i)
          EXPECT_EQ(mixture->WindowOf(k, i).window, plain->WindowOf(k, i));
      }
    }
  }
}

// Each mesh's dp ranks (a separate sampler each, as separate processes have) fill their slices
// micro-batch by micro-batch; concatenated in dp order they are the global batch, the same
// token ids for 1 rank, 2 ranks (dp_shard 2) and dp_shard 2 × tp 2 (both tp ranks of a dp rank
// see the same ids).
TEST(MixtureSamplerTest, GlobalBatchIsTheSameUnderEveryMesh) {
  const TokenStream a = MixStream(0, 701), b = MixStream(5000, 301);
  const int B = 8, T = 4, mb = 2;
  struct Mesh {
    const char* name;
    int dp, tp;
  };
  auto batches_of = [&](const Mesh& mesh, int64_t steps) {
    std::vector<std::vector<int32_t>> out(static_cast<size_t>(steps));
    for (int d = 0; d < mesh.dp; ++d) {
      std::vector<std::vector<int32_t>> per_tp;
      for (int t = 0; t < mesh.tp; ++t) {
        auto sampler = MixtureSampler::Create({{&a, 0.7}, {&b, 0.3}}, T, B, 1337, Order::kShuffled);
        EXPECT_TRUE(sampler.ok());
        const SeqRange range = *DpRankRange(B, mesh.dp, d);
        std::vector<int32_t> mine;
        for (int64_t k = 0; k < steps; ++k) {
          for (int first = 0; first < range.count; first += mb) {
            std::vector<int32_t> in(mb * T), tg(mb * T);
            EXPECT_TRUE(sampler->Fill(k, range.first + first, mb, in.data(), tg.data()).ok());
            mine.insert(mine.end(), in.begin(), in.end());
            auto& batch = out[static_cast<size_t>(k)];
            if (t == 0) batch.insert(batch.end(), in.begin(), in.end());
          }
        }
        per_tp.push_back(mine);
      }
      for (int t = 1; t < mesh.tp; ++t) EXPECT_EQ(per_tp[t], per_tp[0]) << mesh.name << " tp " << t;
    }
    return out;
  };
  const auto one = batches_of({"1 rank", 1, 1}, 120);
  const auto two = batches_of({"dp_shard 2", 2, 1}, 120);
  const auto four = batches_of({"dp_shard 2 x tp 2", 2, 2}, 120);
  ASSERT_EQ(one.size(), 120u);
  for (size_t k = 0; k < one.size(); ++k) {
    ASSERT_EQ(one[k].size(), static_cast<size_t>(B * T));
    EXPECT_EQ(two[k], one[k]) << "step " << k;
    EXPECT_EQ(four[k], one[k]) << "step " << k;
  }
  // Both sources appear in the batches (the test would pass trivially otherwise).
  std::set<bool> from_b;
  for (const auto& batch : one) {
    for (size_t i = 0; i < batch.size(); i += T) from_b.insert(batch[i] >= 5000);
  }
  EXPECT_EQ(from_b.size(), 2u);
}

TEST(MixtureSamplerTest, EverySourceHasItsOwnShuffledEpochs) {
  // Source 1 has 10 windows and takes ~30% of 400 slots: it wraps through many of its epochs,
  // each a permutation of its windows under seed + 1.
  const TokenStream a = MixStream(0, 4001), b = MixStream(9000, 41);
  const uint64_t seed = 99;
  auto sampler = MixtureSampler::Create({{&a, 0.7}, {&b, 0.3}}, 4, 4, seed, Order::kShuffled);
  ASSERT_TRUE(sampler.ok());
  ASSERT_EQ(sampler->num_windows(1), 10);
  std::vector<int64_t> windows_of_b;
  for (int64_t k = 0; k < 100; ++k) {
    for (int i = 0; i < 4; ++i) {
      const MixtureSampler::Window w = sampler->WindowOf(k, i);
      if (w.source == 1) windows_of_b.push_back(w.window);
    }
  }
  ASSERT_GE(windows_of_b.size(), 110u);
  for (size_t c = 0; c < windows_of_b.size(); ++c) {
    const int64_t epoch = static_cast<int64_t>(c) / 10;
    EXPECT_EQ(windows_of_b[c], EpochShuffle(10, seed + 1, epoch).At(static_cast<int64_t>(c % 10)))
        << "counter " << c;
    EXPECT_EQ(sampler->EpochOf(1, static_cast<int64_t>(c)), epoch);
  }
}

TEST(MixtureSamplerTest, CountersAtAStepDoNotDependOnWhatWasAskedBefore) {
  const TokenStream a = MixStream(0, 801), b = MixStream(3000, 801);
  auto fresh = [&] {
    StatusOr<MixtureSampler> made =
        MixtureSampler::Create({{&a, 2}, {&b, 1}}, 4, 6, 3, Order::kSequential);
    return std::move(*made);
  };
  MixtureSampler s = fresh();
  const std::vector<int64_t> at50 = s.CountsBefore(50);
  EXPECT_EQ(at50[0] + at50[1], 300);
  EXPECT_EQ(at50, (std::vector<int64_t>{200, 100}));
  s.WindowOf(90, 3);                    // move ahead…
  EXPECT_EQ(s.CountsBefore(50), at50);  // …and back: replayed from the start
  MixtureSampler t = fresh();           // a resumed run asks step 50 first
  EXPECT_EQ(t.WindowOf(50, 0).source, fresh().WindowOf(50, 0).source);
  EXPECT_EQ(t.WindowOf(50, 0).window, s.WindowOf(50, 0).window);
}

TEST(MixtureSamplerTest, BadWeightsAreRefused) {
  EXPECT_FALSE(MixtureQuotas({}).ok());
  EXPECT_FALSE(MixtureQuotas({1, 0}).ok());
  EXPECT_FALSE(MixtureQuotas({1, -1}).ok());
  EXPECT_FALSE(MixtureQuotas({1, NAN}).ok());
  EXPECT_FALSE(MixtureQuotas({1, 1e-12}).ok());
  auto q = MixtureQuotas({0.7, 0.3});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)[0], 751619277);  // round(0.7 · 2^30)
  EXPECT_EQ((*q)[1], 322122547);  // round(0.3 · 2^30)
}

}  // namespace
}  // namespace meshrun
