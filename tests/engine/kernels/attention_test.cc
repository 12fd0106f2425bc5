// Blocked causal attention against a naive full-matrix reference and finite differences (float64)
// for the position layouts the model produces: plain causal, context-parallel chunk pairs,
// ring blocks with Tq != Tk (including rows that see no key) and unsorted positions; the
// log-sum-exp merge of key halves; float32 vs float64; accumulation and determinism.
#include <gtest/gtest.h>

#include <numeric>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::Cast;
using testing::Diff;
using testing::Dot;
using testing::ExpectClose;
using testing::NumericGrad;
using testing::Random;

struct Shape {
  int64_t B, H, Tq, Tk, D;
  int64_t QSize() const { return B * H * Tq * D; }
  int64_t KSize() const { return B * H * Tk * D; }
  double Scale() const { return 1.0 / std::sqrt(double(D)); }
};

struct Inputs {
  std::vector<double> q, k, v;
};

Inputs RandomInputs(const Shape& s, uint64_t seed) {
  // Spread 2: scores up to ~±4·sqrt(D)·scale, so the softmax is far from uniform.
  return {Random(s.QSize(), seed, -2, 2), Random(s.KSize(), seed + 1, -2, 2),
          Random(s.KSize(), seed + 2, -1, 1)};
}

std::vector<int32_t> Range(int32_t lo, int32_t hi) {  // [lo, hi)
  std::vector<int32_t> r(hi - lo);
  std::iota(r.begin(), r.end(), lo);
  return r;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Full-matrix attention in double, straight from the definition.
struct Naive {
  std::vector<double> out, lse, dq, dk, dv;
};

Naive NaiveAttention(const Shape& s, const Inputs& x, const std::vector<int32_t>& q_pos,
                     const std::vector<int32_t>& k_pos, const std::vector<double>& dout) {
  Naive r;
  r.out.assign(s.QSize(), 0.0);
  r.lse.assign(s.B * s.H * s.Tq, -INFINITY);
  r.dq.assign(s.QSize(), 0.0);
  r.dk.assign(s.KSize(), 0.0);
  r.dv.assign(s.KSize(), 0.0);
  const double scale = s.Scale();
  std::vector<double> p(s.Tk), dp(s.Tk);
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const double* q = x.q.data() + bh * s.Tq * s.D;
    const double* k = x.k.data() + bh * s.Tk * s.D;
    const double* v = x.v.data() + bh * s.Tk * s.D;
    for (int64_t i = 0; i < s.Tq; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < s.Tk; ++j) {
        p[j] = -INFINITY;
        if (k_pos[j] > q_pos[i]) continue;
        double dot = 0;
        for (int64_t d = 0; d < s.D; ++d) dot += q[i * s.D + d] * k[j * s.D + d];
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      if (mx == -INFINITY) continue;  // no visible key: out 0, lse -inf, no gradient
      double sum = 0;
      for (int64_t j = 0; j < s.Tk; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t j = 0; j < s.Tk; ++j) p[j] /= sum;
      r.lse[bh * s.Tq + i] = mx + std::log(sum);
      double* o = r.out.data() + (bh * s.Tq + i) * s.D;
      for (int64_t j = 0; j < s.Tk; ++j) {
        for (int64_t d = 0; d < s.D; ++d) o[d] += p[j] * v[j * s.D + d];
      }
      const double* g = dout.data() + (bh * s.Tq + i) * s.D;
      double p_dp = 0;
      for (int64_t j = 0; j < s.Tk; ++j) {
        dp[j] = 0;
        for (int64_t d = 0; d < s.D; ++d) dp[j] += g[d] * v[j * s.D + d];
        p_dp += p[j] * dp[j];
      }
      for (int64_t j = 0; j < s.Tk; ++j) {
        const double ds = p[j] * (dp[j] - p_dp) * scale;
        for (int64_t d = 0; d < s.D; ++d) {
          r.dv[(bh * s.Tk + j) * s.D + d] += p[j] * g[d];
          r.dq[(bh * s.Tq + i) * s.D + d] += ds * k[j * s.D + d];
          r.dk[(bh * s.Tk + j) * s.D + d] += ds * q[i * s.D + d];
        }
      }
    }
  }
  return r;
}

// Forward and backward of the blocked kernels, gradients accumulated onto `init`.
template <typename T>
struct Blocked {
  std::vector<T> out, lse, dq, dk, dv;
};

template <typename T>
Blocked<T> RunBlocked(const Shape& s, const Inputs& x, const std::vector<int32_t>& q_pos,
                      const std::vector<int32_t>& k_pos, const std::vector<double>& dout,
                      double grad_init = 0.0) {
  const auto q = Cast<T>(x.q), k = Cast<T>(x.k), v = Cast<T>(x.v), g = Cast<T>(dout);
  Blocked<T> r{std::vector<T>(s.QSize()), std::vector<T>(s.B * s.H * s.Tq),
               std::vector<T>(s.QSize(), T(grad_init)), std::vector<T>(s.KSize(), T(grad_init)),
               std::vector<T>(s.KSize(), T(grad_init))};
  AttentionForward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), q_pos.data(),
                   k_pos.data(), s.B, s.H, s.Tq, s.Tk, s.D, s.Scale());
  AttentionBackward(r.dq.data(), r.dk.data(), r.dv.data(), g.data(), q.data(), k.data(), v.data(),
                    r.out.data(), r.lse.data(), q_pos.data(), k_pos.data(), s.B, s.H, s.Tq, s.Tk,
                    s.D, s.Scale());
  if (grad_init != 0.0) {
    for (auto* grad : {&r.dq, &r.dk, &r.dv}) {
      for (T& e : *grad) e -= T(grad_init);
    }
  }
  return r;
}

void ExpectLseEqual(const std::vector<double>& got, const std::vector<double>& want, double tol,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " row " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], tol) << what << " row " << i;
    }
  }
}

// Blocked vs naive (float64, tight), gradients vs finite differences, gradient accumulation.
void CheckFloat64(const Shape& s, const std::vector<int32_t>& q_pos,
                  const std::vector<int32_t>& k_pos, uint64_t seed) {
  ASSERT_EQ(static_cast<int64_t>(q_pos.size()), s.Tq);
  ASSERT_EQ(static_cast<int64_t>(k_pos.size()), s.Tk);
  Inputs x = RandomInputs(s, seed);
  const auto R = Random(s.QSize(), seed + 10);
  const Naive ref = NaiveAttention(s, x, q_pos, k_pos, R);
  const auto got = RunBlocked<double>(s, x, q_pos, k_pos, R, /*grad_init=*/0.25);
  ExpectClose(got.out, ref.out, 1e-13, 1e-15, "out");
  ExpectLseEqual(got.lse, ref.lse, 1e-12, "lse");
  ExpectClose(got.dq, ref.dq, 1e-12, 1e-15, "dq vs naive");
  ExpectClose(got.dk, ref.dk, 1e-12, 1e-15, "dk vs naive");
  ExpectClose(got.dv, ref.dv, 1e-12, 1e-15, "dv vs naive");

  std::vector<double> out(s.QSize()), lse(s.B * s.H * s.Tq);
  auto loss = [&] {
    AttentionForward(out.data(), lse.data(), x.q.data(), x.k.data(), x.v.data(), q_pos.data(),
                     k_pos.data(), s.B, s.H, s.Tq, s.Tk, s.D, s.Scale());
    return Dot(out, R);
  };
  ExpectClose(got.dq, NumericGrad(x.q, loss, 150), testing::kFdRtol, testing::kFdAtol, "dq fd");
  ExpectClose(got.dk, NumericGrad(x.k, loss, 150), testing::kFdRtol, testing::kFdAtol, "dk fd");
  ExpectClose(got.dv, NumericGrad(x.v, loss, 150), testing::kFdRtol, testing::kFdAtol, "dv fd");
}

TEST(KernelsAttention, CausalMatchesNaiveAndFiniteDifferences) {
  const Shape s{2, 2, 70, 70, 8};  // 70: one full and one partial block
  CheckFloat64(s, Range(0, 70), Range(0, 70), 1);
}

TEST(KernelsAttention, CausalSeveralBlocks) {
  const Shape s{1, 2, 200, 200, 16};
  CheckFloat64(s, Range(0, 200), Range(0, 200), 2);
}

TEST(KernelsAttention, ContextParallelChunkPairs) {
  // seq 160, cp 2: rank 0 holds chunks 0 and 3 ([0,40) and [120,160)); the keys are all-gathered
  // in rank order, so they are not sorted: [0,40) [120,160) [40,80) [80,120).
  const auto rank0 = Concat(Range(0, 40), Range(120, 160));
  const auto rank1 = Concat(Range(40, 80), Range(80, 120));
  const Shape s{1, 2, 80, 160, 8};
  CheckFloat64(s, rank0, Concat(rank0, rank1), 3);
  CheckFloat64(s, rank1, Concat(rank0, rank1), 4);
  // The local block only (Tq = Tk), chunks wider than a block.
  const auto wide = Concat(Range(0, 100), Range(300, 400));
  CheckFloat64(Shape{1, 1, 200, 200, 8}, wide, wide, 5);
}

TEST(KernelsAttention, RingBlockWithRowsThatSeeNoKey) {
  // Queries [100,190), keys [130,280): rows before 130 see nothing, many blocks are skipped.
  const Shape s{2, 1, 90, 150, 8};
  CheckFloat64(s, Range(100, 190), Range(130, 280), 6);
  // A block where no row sees any key at all.
  CheckFloat64(Shape{1, 1, 30, 70, 4}, Range(0, 30), Range(30, 100), 7);
}

TEST(KernelsAttention, UnsortedPositions) {
  std::vector<int32_t> q_pos = Range(0, 150), k_pos = Range(0, 130);
  std::mt19937 rng(8);
  std::shuffle(q_pos.begin(), q_pos.end(), rng);
  std::shuffle(k_pos.begin(), k_pos.end(), rng);
  CheckFloat64(Shape{1, 2, 150, 130, 8}, q_pos, k_pos, 9);
}

TEST(KernelsAttention, NoVisibleKeyGivesZeroOutputAndMinusInfLse) {
  const Shape s{1, 1, 3, 5, 4};
  const auto x = RandomInputs(s, 1);
  const auto got = RunBlocked<float>(s, x, Range(0, 3), Range(10, 15), Random(s.QSize(), 2));
  for (float o : got.out) EXPECT_EQ(o, 0.f);
  for (float l : got.lse) EXPECT_EQ(l, -INFINITY);
  for (const auto* g : {&got.dq, &got.dk, &got.dv}) {
    for (float e : *g) EXPECT_EQ(e, 0.f);
  }
}

TEST(KernelsAttention, MergeOfKeyHalvesEqualsFullAttention) {
  // Keys split like two ring steps; the second half is invisible to the early queries, so the
  // merge sees lse = -inf on one side.
  const Shape full{2, 2, 150, 150, 8};
  const Shape half{2, 2, 150, 75, 8};
  const auto q_pos = Range(0, 150);
  const auto k_lo = Range(0, 75), k_hi = Range(75, 150);
  const Inputs x = RandomInputs(full, 11);
  const auto dout = Random(full.QSize(), 12);
  const Naive ref = NaiveAttention(full, x, q_pos, Range(0, 150), dout);

  // Split K and V by key index, per (b, h).
  Inputs lo{x.q, {}, {}}, hi{x.q, {}, {}};
  for (int64_t bh = 0; bh < full.B * full.H; ++bh) {
    for (const auto& [dst, j0] : {std::pair{&lo, int64_t{0}}, std::pair{&hi, int64_t{75}}}) {
      const int64_t off = (bh * full.Tk + j0) * full.D;
      dst->k.insert(dst->k.end(), x.k.begin() + off, x.k.begin() + off + 75 * full.D);
      dst->v.insert(dst->v.end(), x.v.begin() + off, x.v.begin() + off + 75 * full.D);
    }
  }
  const double scale = full.Scale();
  auto forward = [&](const Inputs& part, const std::vector<int32_t>& k_pos) {
    std::pair<std::vector<double>, std::vector<double>> r{std::vector<double>(half.QSize()),
                                                          std::vector<double>(150 * 4)};
    AttentionForward(r.first.data(), r.second.data(), part.q.data(), part.k.data(), part.v.data(),
                     q_pos.data(), k_pos.data(), half.B, half.H, half.Tq, half.Tk, half.D, scale);
    return r;
  };
  auto [out_a, lse_a] = forward(lo, k_lo);
  auto [out_b, lse_b] = forward(hi, k_hi);
  auto out_ba = out_b, lse_ba = lse_b;  // the other merge order
  AttentionMerge(out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), 600, half.D);
  AttentionMerge(out_ba.data(), lse_ba.data(), out_a.data(), lse_a.data(), 0, half.D);
  ExpectClose(out_a, ref.out, 1e-13, 1e-15, "merged out");
  ExpectLseEqual(lse_a, ref.lse, 1e-12, "merged lse");
  {
    auto [o2, l2] = forward(lo, k_lo);
    AttentionMerge(out_ba.data(), lse_ba.data(), o2.data(), l2.data(), 600, half.D);
    ExpectClose(out_ba, ref.out, 1e-13, 1e-15, "merged out (b then a)");
  }

  // Backward per half with the merged out/lse: dq sums, dk/dv are the halves of the full ones.
  std::vector<double> dq(full.QSize(), 0.0), dk_lo(half.KSize(), 0.0), dv_lo(half.KSize(), 0.0),
      dk_hi(half.KSize(), 0.0), dv_hi(half.KSize(), 0.0);
  AttentionBackward(dq.data(), dk_lo.data(), dv_lo.data(), dout.data(), lo.q.data(), lo.k.data(),
                    lo.v.data(), out_a.data(), lse_a.data(), q_pos.data(), k_lo.data(), half.B,
                    half.H, half.Tq, half.Tk, half.D, scale);
  AttentionBackward(dq.data(), dk_hi.data(), dv_hi.data(), dout.data(), hi.q.data(), hi.k.data(),
                    hi.v.data(), out_a.data(), lse_a.data(), q_pos.data(), k_hi.data(), half.B,
                    half.H, half.Tq, half.Tk, half.D, scale);
  std::vector<double> dk, dv;
  for (int64_t bh = 0; bh < full.B * full.H; ++bh) {
    const int64_t off = bh * 75 * full.D, len = 75 * full.D;
    dk.insert(dk.end(), dk_lo.begin() + off, dk_lo.begin() + off + len);
    dk.insert(dk.end(), dk_hi.begin() + off, dk_hi.begin() + off + len);
    dv.insert(dv.end(), dv_lo.begin() + off, dv_lo.begin() + off + len);
    dv.insert(dv.end(), dv_hi.begin() + off, dv_hi.begin() + off + len);
  }
  ExpectClose(dq, ref.dq, 1e-12, 1e-15, "dq from halves");
  ExpectClose(dk, ref.dk, 1e-12, 1e-15, "dk from halves");
  ExpectClose(dv, ref.dv, 1e-12, 1e-15, "dv from halves");
}

TEST(KernelsAttention, Float32MatchesFloat64) {
  const Shape s{1, 3, 200, 200, 64};
  const auto x = RandomInputs(s, 21);
  const auto dout = Random(s.QSize(), 22);
  const auto pos = Range(0, 200);
  const Naive ref = NaiveAttention(s, x, pos, pos, dout);
  const auto got = RunBlocked<float>(s, x, pos, pos, dout, /*grad_init=*/0.5);
  ExpectClose(got.out, ref.out, 1e-5, 0, "out");
  ExpectClose(got.lse, ref.lse, 1e-5, 0, "lse");
  ExpectClose(got.dq, ref.dq, 1e-5, 0, "dq");
  ExpectClose(got.dk, ref.dk, 1e-5, 0, "dk");
  ExpectClose(got.dv, ref.dv, 1e-5, 0, "dv");
}

TEST(KernelsAttention, DeterministicWithTwoThreads) {
  SetNumThreads(2);
  const Shape s{2, 3, 300, 300, 32};
  const auto x = RandomInputs(s, 31);
  const auto dout = Random(s.QSize(), 32);
  const auto pos = Range(0, 300);
  const auto a = RunBlocked<float>(s, x, pos, pos, dout);
  const auto b = RunBlocked<float>(s, x, pos, pos, dout);
  EXPECT_TRUE(testing::BitIdentical(a.out, b.out));
  EXPECT_TRUE(testing::BitIdentical(a.lse, b.lse));
  EXPECT_TRUE(testing::BitIdentical(a.dq, b.dq));
  EXPECT_TRUE(testing::BitIdentical(a.dk, b.dk));
  EXPECT_TRUE(testing::BitIdentical(a.dv, b.dv));
}

}  // namespace
}  // namespace meshrun::cpu
