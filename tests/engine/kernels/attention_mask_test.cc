// Blocked attention with a lower bound per query (q_lo: sliding windows, documents, both)
// against a naive full-matrix reference (float64, forward and backward), float32 against it, the
// context-parallel layouts (a rank's chunk pair against every key, ring blocks merged by
// log-sum-exp with rows that see no key of a block), and q_lo = 0 equal bit for bit to no
// q_lo (the causal path is unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <numeric>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::BitIdentical;
using testing::Cast;
using testing::ExpectClose;
using testing::Random;

struct MaskShape {
  int64_t B, H, Tq, Tk, D;
  int64_t QSize() const { return B * H * Tq * D; }
  int64_t KSize() const { return B * H * Tk * D; }
  double Scale() const { return 1.0 / std::sqrt(double(D)); }
};

struct MaskInputs {
  std::vector<double> q, k, v, dout;
};

MaskInputs MaskRandomInputs(const MaskShape& s, uint64_t seed) {
  return {Random(s.QSize(), seed, -2, 2), Random(s.KSize(), seed + 1, -2, 2),
          Random(s.KSize(), seed + 2, -1, 1), Random(s.QSize(), seed + 3, -1, 1)};
}

struct MaskResult {
  std::vector<double> out, lse, dq, dk, dv;
};

// Query i of sequence b sees key j iff lo[b·Tq + i] <= k_pos[j] <= q_pos[i], from the definition.
MaskResult NaiveMasked(const MaskShape& s, const MaskInputs& x, const std::vector<int32_t>& q_pos,
                       const std::vector<int32_t>& k_pos, const std::vector<int32_t>& lo) {
  MaskResult r;
  r.out.assign(s.QSize(), 0.0);
  r.lse.assign(s.B * s.H * s.Tq, -INFINITY);
  r.dq.assign(s.QSize(), 0.0);
  r.dk.assign(s.KSize(), 0.0);
  r.dv.assign(s.KSize(), 0.0);
  const double scale = s.Scale();
  std::vector<double> p(s.Tk), dp(s.Tk);
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int64_t b = bh / s.H;
    const double* q = x.q.data() + bh * s.Tq * s.D;
    const double* k = x.k.data() + bh * s.Tk * s.D;
    const double* v = x.v.data() + bh * s.Tk * s.D;
    for (int64_t i = 0; i < s.Tq; ++i) {
      const int32_t first = lo.empty() ? INT_MIN : lo[b * s.Tq + i];
      double mx = -INFINITY;
      for (int64_t j = 0; j < s.Tk; ++j) {
        p[j] = -INFINITY;
        if (k_pos[j] > q_pos[i] || k_pos[j] < first) continue;
        double dot = 0;
        for (int64_t d = 0; d < s.D; ++d) dot += q[i * s.D + d] * k[j * s.D + d];
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (int64_t j = 0; j < s.Tk; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t j = 0; j < s.Tk; ++j) p[j] /= sum;
      r.lse[bh * s.Tq + i] = mx + std::log(sum);
      double* o = r.out.data() + (bh * s.Tq + i) * s.D;
      for (int64_t j = 0; j < s.Tk; ++j) {
        for (int64_t d = 0; d < s.D; ++d) o[d] += p[j] * v[j * s.D + d];
      }
      const double* g = x.dout.data() + (bh * s.Tq + i) * s.D;
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

template <typename T>
MaskResult BlockedMasked(const MaskShape& s, const MaskInputs& x, const std::vector<int32_t>& q_pos,
                         const std::vector<int32_t>& k_pos, const std::vector<int32_t>& lo) {
  const auto q = Cast<T>(x.q), k = Cast<T>(x.k), v = Cast<T>(x.v), g = Cast<T>(x.dout);
  std::vector<T> out(s.QSize()), lse(s.B * s.H * s.Tq), dq(s.QSize()), dk(s.KSize()), dv(s.KSize());
  const int32_t* lo_ptr = lo.empty() ? nullptr : lo.data();
  AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), q_pos.data(), k_pos.data(),
                   s.B, s.H, s.Tq, s.Tk, s.D, s.Scale(), lo_ptr);
  AttentionBackward(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                    out.data(), lse.data(), q_pos.data(), k_pos.data(), s.B, s.H, s.Tq, s.Tk, s.D,
                    s.Scale(), lo_ptr);
  return {Cast<double>(out), Cast<double>(lse), Cast<double>(dq), Cast<double>(dk),
          Cast<double>(dv)};
}

std::vector<int32_t> MaskRange(int32_t first, int32_t end) {
  std::vector<int32_t> r(end - first);
  std::iota(r.begin(), r.end(), first);
  return r;
}

// q_lo of a sliding window W (0: none) and per-sequence document starts (empty: one document)
// at query positions q_pos, as the model computes it.
std::vector<int32_t> LowerBounds(int64_t B, const std::vector<int32_t>& q_pos, int window,
                                 const std::vector<int32_t>& doc_starts) {
  const int64_t Tq = static_cast<int64_t>(q_pos.size());
  std::vector<int32_t> lo(B * Tq, INT_MIN);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < Tq; ++i) {
      int32_t& l = lo[b * Tq + i];
      if (!doc_starts.empty()) l = doc_starts[b * Tq + i];
      if (window > 0) l = std::max(l, q_pos[i] - window + 1);
    }
  }
  return lo;
}

// Document starts of B sequences of T tokens with boundaries after the given positions (the
// same list shifted by b·shift for sequence b, so that sequences differ).
std::vector<int32_t> DocStarts(int64_t B, int64_t T, const std::vector<int32_t>& ends,
                               int32_t shift) {
  std::vector<int32_t> starts(B * T);
  for (int64_t b = 0; b < B; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      starts[b * T + t] = start;
      for (int32_t e : ends) {
        if (t == std::min<int64_t>(T - 1, e + b * shift)) start = static_cast<int32_t>(t + 1);
      }
    }
  }
  return starts;
}

void ExpectMatches(const MaskResult& got, const MaskResult& want, double tol,
                   const std::string& what) {
  ASSERT_EQ(got.lse.size(), want.lse.size());
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      ASSERT_EQ(got.lse[i], want.lse[i]) << what << " lse row " << i;
    } else {
      ASSERT_NEAR(got.lse[i], want.lse[i], tol * (1 + std::fabs(want.lse[i])))
          << what << " lse row " << i;
    }
  }
  ExpectClose(got.out, want.out, tol, tol, what + " out");
  ExpectClose(got.dq, want.dq, tol, tol, what + " dq");
  ExpectClose(got.dk, want.dk, tol, tol, what + " dk");
  ExpectClose(got.dv, want.dv, tol, tol, what + " dv");
}

// One sequence layout: windows from 1 (only itself) to past the sequence, documents, both.
TEST(AttentionMaskTest, WindowsAndDocumentsMatchTheNaiveReference) {
  const MaskShape s{2, 2, 200, 200, 16};
  const MaskInputs x = MaskRandomInputs(s, 11);
  const std::vector<int32_t> pos = MaskRange(0, 200);
  const std::vector<int32_t> docs = DocStarts(2, 200, {0, 37, 63, 64, 150}, 9);
  struct Case {
    int window;
    bool documents;
  };
  for (const Case c : {Case{1, false}, Case{5, false}, Case{64, false}, Case{100, false},
                       Case{500, false}, Case{0, true}, Case{17, true}}) {
    const std::vector<int32_t> lo =
        LowerBounds(2, pos, c.window, c.documents ? docs : std::vector<int32_t>{});
    const std::string what =
        "window " + std::to_string(c.window) + (c.documents ? " with documents" : "");
    const MaskResult want = NaiveMasked(s, x, pos, pos, lo);
    ExpectMatches(BlockedMasked<double>(s, x, pos, pos, lo), want, 1e-10, what + " (float64)");
    ExpectMatches(BlockedMasked<float>(s, x, pos, pos, lo), want, 2e-4, what + " (float32)");
  }
}

// Context parallel, cp 2: rank c's queries are chunks c and 3−c of 4; allgather attends to every
// key at once, ring to one rank's block at a time, merged by log-sum-exp, with the backward run
// per block on the merged out/lse (as engine/model/gpt2_attention.cc does).
TEST(AttentionMaskTest, ContextParallelLayoutsMatchTheWholeSequence) {
  const int64_t T = 256, chunk = T / 4, Tl = T / 2, B = 2, H = 2, D = 8;
  const std::vector<int32_t> all = MaskRange(0, T);
  const std::vector<int32_t> docs_all = DocStarts(B, T, {20, 100, 101, 190}, 13);
  for (const int window : {0, 7, 80}) {
    for (const bool documents : {false, true}) {
      if (window == 0 && !documents) continue;
      const MaskShape whole{B, H, T, T, D};
      const MaskInputs x = MaskRandomInputs(whole, 21 + window);
      const std::vector<int32_t> lo_all =
          LowerBounds(B, all, window, documents ? docs_all : std::vector<int32_t>{});
      const MaskResult want = NaiveMasked(whole, x, all, all, lo_all);
      const std::string what =
          "window " + std::to_string(window) + (documents ? " with documents" : "");
      // Each rank's rows: its chunk pair, in the rank's local order.
      auto rows_of = [&](int c) {
        std::vector<int32_t> r = MaskRange(c * chunk, (c + 1) * chunk);
        const std::vector<int32_t> hi = MaskRange((3 - c) * chunk, (4 - c) * chunk);
        r.insert(r.end(), hi.begin(), hi.end());
        return r;
      };
      // (B,H,T,D) rows of the whole sequence gathered for positions `rows`.
      auto take = [&](const std::vector<double>& t, const std::vector<int32_t>& rows) {
        std::vector<double> out;
        for (int64_t bh = 0; bh < B * H; ++bh) {
          for (int32_t r : rows) {
            out.insert(out.end(), t.begin() + (bh * T + r) * D, t.begin() + (bh * T + r + 1) * D);
          }
        }
        return out;
      };
      std::vector<std::vector<int32_t>> rank_rows = {rows_of(0), rows_of(1)};
      // The gathered keys in rank order (allgather's layout).
      std::vector<int32_t> gathered = rank_rows[0];
      gathered.insert(gathered.end(), rank_rows[1].begin(), rank_rows[1].end());
      MaskResult dk_sum_ring{{},
                             {},
                             {},
                             std::vector<double>(B * H * T * D, 0.0),
                             std::vector<double>(B * H * T * D, 0.0)};
      for (int c = 0; c < 2; ++c) {
        const std::vector<int32_t>& qp = rank_rows[c];
        std::vector<int32_t> lo(B * Tl);
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t i = 0; i < Tl; ++i) lo[b * Tl + i] = lo_all[b * T + qp[i]];
        }
        MaskInputs local{take(x.q, qp), take(x.k, gathered), take(x.v, gathered), take(x.dout, qp)};
        const MaskShape gs{B, H, Tl, T, D};
        const MaskResult got = BlockedMasked<double>(gs, local, qp, gathered, lo);
        const MaskResult want_rows{take(want.out, qp), {}, take(want.dq, qp), {}, {}};
        ExpectClose(got.out, want_rows.out, 1e-10, 1e-10,
                    what + " allgather out rank " + std::to_string(c));
        ExpectClose(got.dq, want_rows.dq, 1e-10, 1e-10,
                    what + " allgather dq rank " + std::to_string(c));
        // Ring: one key block (a rank's rows) at a time.
        const MaskShape bs{B, H, Tl, Tl, D};
        std::vector<double> out, lse;
        const std::vector<double> q = take(x.q, qp), g = take(x.dout, qp);
        for (int s = 0; s < 2; ++s) {
          const std::vector<int32_t>& kp = rank_rows[(c - s + 2) % 2];
          const std::vector<double> k = take(x.k, kp), v = take(x.v, kp);
          std::vector<double> o(bs.QSize()), l(B * H * Tl);
          AttentionForward(o.data(), l.data(), q.data(), k.data(), v.data(), qp.data(), kp.data(),
                           B, H, Tl, Tl, D, bs.Scale(), lo.data());
          if (s == 0) {
            out = o;
            lse = l;
          } else {
            AttentionMerge(out.data(), lse.data(), o.data(), l.data(), B * H * Tl, D);
          }
        }
        ExpectClose(out, want_rows.out, 1e-10, 1e-10, what + " ring out rank " + std::to_string(c));
        std::vector<double> dq(bs.QSize(), 0.0);
        for (int s = 0; s < 2; ++s) {
          const std::vector<int32_t>& kp = rank_rows[(c - s + 2) % 2];
          const std::vector<double> k = take(x.k, kp), v = take(x.v, kp);
          std::vector<double> dk(bs.KSize(), 0.0), dv(bs.KSize(), 0.0);
          AttentionBackward(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                            out.data(), lse.data(), qp.data(), kp.data(), B, H, Tl, Tl, D,
                            bs.Scale(), lo.data());
          for (int64_t bh = 0; bh < B * H; ++bh) {  // back to whole-sequence rows
            for (int64_t j = 0; j < Tl; ++j) {
              for (int64_t d = 0; d < D; ++d) {
                dk_sum_ring.dk[(bh * T + kp[j]) * D + d] += dk[(bh * Tl + j) * D + d];
                dk_sum_ring.dv[(bh * T + kp[j]) * D + d] += dv[(bh * Tl + j) * D + d];
              }
            }
          }
        }
        ExpectClose(dq, want_rows.dq, 1e-10, 1e-10, what + " ring dq rank " + std::to_string(c));
      }
      ExpectClose(dk_sum_ring.dk, want.dk, 1e-10, 1e-10, what + " ring dk");
      ExpectClose(dk_sum_ring.dv, want.dv, 1e-10, 1e-10, what + " ring dv");
    }
  }
}

// A lower bound that excludes nothing (0 at positions ≥ 0) takes exactly the causal path.
TEST(AttentionMaskTest, ZeroLowerBoundIsTheCausalKernelBitForBit) {
  const MaskShape s{1, 3, 190, 190, 32};
  const MaskInputs x = MaskRandomInputs(s, 31);
  const std::vector<int32_t> pos = MaskRange(0, 190);
  const std::vector<int32_t> zero(190, 0);
  const MaskResult a = BlockedMasked<float>(s, x, pos, pos, {});
  const MaskResult b = BlockedMasked<float>(s, x, pos, pos, zero);
  EXPECT_TRUE(BitIdentical(a.out, b.out));
  EXPECT_TRUE(BitIdentical(a.dq, b.dq));
  EXPECT_TRUE(BitIdentical(a.dk, b.dk));
  EXPECT_TRUE(BitIdentical(a.dv, b.dv));
}

}  // namespace
}  // namespace meshrun::cpu
