// Causal multi-head attention, flash-attention style: scores exist one kBQ×kBK block at a time,
// the softmax is computed online (running max and sum per row), and the backward recomputes
// the probabilities from the saved log-sum-exp (FlashAttention-2). Masking is by global
// positions, so context-parallel chunk pairs and ring blocks need no special case: query i of
// sequence b sees key j iff q_lo[b,i] <= k_pos[j] <= q_pos[i] (q_lo: the first position a query
// sees, for sliding windows and documents; null: 0). Blocks that no query of a block can see
// are skipped without touching them, blocks that every query sees entirely are not masked.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/cpu/tile_gemm.h"

namespace meshrun::cpu {
namespace {

constexpr int64_t kBQ = 64;  // query rows per block
constexpr int64_t kBK = 64;  // key rows per block

// Smallest and largest position of each block of `block` consecutive rows; positions need not
// be sorted or contiguous, these bounds are all the block skipping relies on.
struct PosRange {
  int32_t lo, hi;
};
std::vector<PosRange> BlockRanges(const int32_t* pos, int64_t n, int64_t block) {
  std::vector<PosRange> r((n + block - 1) / block);
  for (size_t b = 0; b < r.size(); ++b) {
    const int64_t end = std::min<int64_t>(n, (b + 1) * block);
    r[b] = {pos[b * block], pos[b * block]};
    for (int64_t i = b * block; i < end; ++i) {
      r[b].lo = std::min(r[b].lo, pos[i]);
      r[b].hi = std::max(r[b].hi, pos[i]);
    }
  }
  return r;
}

// The range of q_lo over each query block of each sequence, B·nqb entries (b-major); with no
// q_lo every entry is {INT32_MIN, INT32_MIN}: no lower bound.
std::vector<PosRange> LowerBoundRanges(const int32_t* q_lo, int64_t B, int64_t Tq, int64_t block) {
  const int64_t nqb = (Tq + block - 1) / block;
  constexpr int32_t kNoBound = std::numeric_limits<int32_t>::min();
  std::vector<PosRange> r(B * nqb, PosRange{kNoBound, kNoBound});
  if (q_lo == nullptr) return r;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<PosRange> rb = BlockRanges(q_lo + b * Tq, Tq, block);
    std::copy(rb.begin(), rb.end(), r.begin() + b * nqb);
  }
  return r;
}

enum class Visibility { kNone, kPartial, kFull };
// q: the block's query positions, lo: its queries' lower bounds, k: the key block's positions.
inline Visibility BlockVisibility(const PosRange& q, const PosRange& lo, const PosRange& k) {
  if (k.lo > q.hi || k.hi < lo.lo) return Visibility::kNone;    // every key after or below all
  if (k.hi <= q.lo && k.lo >= lo.hi) return Visibility::kFull;  // every key inside every window
  return Visibility::kPartial;
}

// The mask of one element: key position kp outside [lo, qp].
inline bool Masked(int32_t kp, int32_t qp, int32_t lo) {
  return kp > qp || kp < lo;
}
constexpr int32_t kNoLowerBound = std::numeric_limits<int32_t>::min();

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Inside a partially visible block pair, the products run in groups of kG query rows (and kG
// key rows) and skip what every row of a group masks: on the causal diagonal that is the
// upper triangle, 3/8 of the block. Group bounds from the positions alone, so any order works.
constexpr int64_t kG = 16;
constexpr int64_t kMaxGroups = kBQ / kG;
static_assert(kBQ == kBK && kBQ % kG == 0);

struct GroupBounds {
  int64_t size;              // rows per group: kG, or kBQ (one group) for a fully visible pair
  int64_t cols[kMaxGroups];  // query group g: keys [0, cols[g]) hold every key it sees
  int64_t rows[kMaxGroups];  // key group h: queries [rows[h], nq) hold every query that sees it
};

// For nq query positions qp and nk key positions kp of one block pair; full blocks get the
// whole block.
inline GroupBounds Bounds(Visibility vis, const int32_t* qp, int64_t nq, const int32_t* kp,
                          int64_t nk) {
  GroupBounds b;
  b.size = vis == Visibility::kPartial ? kG : kBQ;
  for (int64_t g = 0; g < kMaxGroups; ++g) {
    b.cols[g] = nk;
    b.rows[g] = 0;
  }
  if (vis != Visibility::kPartial) return b;
  for (int64_t g = 0; g * kG < nq; ++g) {
    int32_t qmax = qp[g * kG];
    for (int64_t i = g * kG; i < std::min(nq, (g + 1) * kG); ++i) qmax = std::max(qmax, qp[i]);
    int64_t c = 0;
    for (int64_t j = 0; j < nk; ++j) {
      if (kp[j] <= qmax) c = j + 1;
    }
    b.cols[g] = c;
  }
  for (int64_t h = 0; h * kG < nk; ++h) {
    int32_t kmin = kp[h * kG];
    for (int64_t j = h * kG; j < std::min(nk, (h + 1) * kG); ++j) kmin = std::min(kmin, kp[j]);
    int64_t r = 0;
    while (r < nq && qp[r] < kmin) ++r;
    b.rows[h] = r;
  }
  return b;
}

// A buffer of the calling thread per slot, grown as needed and kept between calls (attention
// runs every layer; the forward's transposed K is the size of K of one call).
template <typename T, int kSlot>
T* Scratch(int64_t n) {
  thread_local std::vector<T> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// The rows×D matrix x of one head as Xᵀ in key blocks: block b is D×kBK, row-major, at
// dst + b·D·kBK (columns past the last row are 0). A block product then reads Kᵀ with a row
// stride of kBK elements, not of the sequence length: at T = 1024 that stride would be 4 KiB and
// every row of a B panel would fall into the same L1 set.
template <typename T>
void TransposeBlocks(T* dst, const T* x, int64_t rows, int64_t D) {
  for (int64_t b = 0; b * kBK < rows; ++b) {
    const int64_t j0 = b * kBK;
    const int64_t n = std::min(kBK, rows - j0);
    T* d = dst + b * D * kBK;
    for (int64_t j = 0; j < n; ++j) {
      const T* src = x + (j0 + j) * D;
      for (int64_t c = 0; c < D; ++c) d[c * kBK + j] = src[c];
    }
    for (int64_t c = 0; c < D; ++c) std::fill(d + c * kBK + n, d + (c + 1) * kBK, T(0));
  }
}

template <typename T>
int64_t TransposedSize(int64_t rows, int64_t D) {
  return (rows + kBK - 1) / kBK * kBK * D;
}

// One query block of one (batch, head): out[nq,D] and lse[nq] from all visible key blocks.
// k_t holds the head's keys as TransposeBlocks; v is the head's V as it lies (Tk×D).
template <typename T>
void ForwardQueryBlock(T* out, T* lse, const T* q, const T* k_t, const T* v, const int32_t* q_pos,
                       const int32_t* k_pos, const int32_t* q_lo, int64_t nq, int64_t Tk, int64_t D,
                       T scale, const PosRange& q_range, const PosRange& lo_range,
                       const std::vector<PosRange>& k_ranges) {
  const internal::TileGemmFn<T> gemm = internal::TileGemm<T>(false);
  T* S = Scratch<T, 0>(kBQ * kBK);
  T* acc = Scratch<T, 1>(kBQ * D);
  T* m = Scratch<T, 2>(kBQ);
  T* l = Scratch<T, 3>(kBQ);
  std::fill(acc, acc + nq * D, T(0));
  std::fill(m, m + nq, kNegInf<T>);
  std::fill(l, l + nq, T(0));

  for (size_t kb = 0; kb < k_ranges.size(); ++kb) {
    const Visibility vis = BlockVisibility(q_range, lo_range, k_ranges[kb]);
    if (vis == Visibility::kNone) continue;
    const int64_t j0 = kb * kBK;
    const int64_t nk = std::min(kBK, Tk - j0);
    const int32_t* kp = k_pos + j0;
    const GroupBounds gb = Bounds(vis, q_pos, nq, kp, nk);
    const int64_t gs = gb.size;
    // S = scale·Q Kᵀ (columns past a group's bound are left as they are: the mask covers them)
    for (int64_t g = 0; g * gs < nq; ++g) {
      gemm(std::min(gs, nq - g * gs), gb.cols[g], D, scale, q + g * gs * D, D, k_t + kb * D * kBK,
           kBK, /*accumulate=*/false, S + g * gs * kBK, kBK);
    }
    for (int64_t i = 0; i < nq; ++i) {
      T* s = S + i * kBK;
      if (vis == Visibility::kPartial) {
        const int32_t qp = q_pos[i];
        const int32_t lo = q_lo != nullptr ? q_lo[i] : kNoLowerBound;
#pragma omp simd
        for (int64_t j = 0; j < nk; ++j) s[j] = Masked(kp[j], qp, lo) ? kNegInf<T> : s[j];
      }
      T mx = kNegInf<T>;
      if constexpr (sizeof(T) == sizeof(float)) {
        mx = simd::RowMax(s, nk);
      } else {
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < nk; ++j) mx = s[j] > mx ? s[j] : mx;
      }
      const T m_new = std::max(m[i], mx);
      if (m_new == kNegInf<T>) {  // no visible key for this row yet
        std::fill(s, s + nk, T(0));
        continue;
      }
      T sum = 0;
      if constexpr (sizeof(T) == sizeof(float)) {
        sum = simd::ExpShiftSum(s, s, nk, m_new);  // e^{-inf} = 0 for the masked keys
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < nk; ++j) {
          s[j] = internal::Exp(s[j] - m_new);
          sum += s[j];
        }
      }
      const T corr = internal::Exp(m[i] - m_new);  // 0 while m[i] is still -inf
      l[i] = l[i] * corr + sum;
      m[i] = m_new;
      if (corr != T(1)) {
        T* a = acc + i * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] *= corr;
      }
    }
    // acc += P V (P is 0 past each group's bound)
    for (int64_t g = 0; g * gs < nq; ++g) {
      gemm(std::min(gs, nq - g * gs), D, gb.cols[g], T(1), S + g * gs * kBK, kBK, v + j0 * D, D,
           /*accumulate=*/true, acc + g * gs * D, D);
    }
  }

  for (int64_t i = 0; i < nq; ++i) {
    T* o = out + i * D;
    if (l[i] == T(0)) {  // the row sees no key at all
      std::fill(o, o + D, T(0));
      lse[i] = kNegInf<T>;
      continue;
    }
    const T inv = T(1) / l[i];
    const T* a = acc + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] = a[d] * inv;
    lse[i] = m[i] + std::log(l[i]);
  }
}

// All query and key blocks of one (batch, head). dq, dk and dv of this head are touched by this
// call only, so heads run in parallel without races and each sum has a fixed order.
template <typename T>
void BackwardHead(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                  const T* out, const T* lse, const int32_t* q_pos, const int32_t* k_pos,
                  const int32_t* q_lo, int64_t Tq, int64_t Tk, int64_t D, T scale,
                  const std::vector<PosRange>& q_ranges, const PosRange* lo_ranges,
                  const std::vector<PosRange>& k_ranges) {
  const internal::TileGemmFn<T> gemm = internal::TileGemm<T>(false);
  const internal::TileGemmFn<T> gemm_ta = internal::TileGemm<T>(true);  // op(A) = Aᵀ
  const int64_t nqb = static_cast<int64_t>(q_ranges.size());
  const int64_t nkb = static_cast<int64_t>(k_ranges.size());
  // Kᵀ and Vᵀ of the head, once (the right factors of S and dP); every other operand is read
  // where it lies.
  T* k_t = Scratch<T, 14>(TransposedSize<T>(Tk, D));
  T* v_t = Scratch<T, 16>(TransposedSize<T>(Tk, D));
  TransposeBlocks(k_t, k, Tk, D);
  TransposeBlocks(v_t, v, Tk, D);
  // Per block pair: P and dS.
  T* P = Scratch<T, 17>(kBQ * kBK);
  T* dS = Scratch<T, 18>(kBQ * kBK);
  T* Di = Scratch<T, 22>(Tq);
  // Di = rowsum(dO ∘ O): the softmax backward's Σ_j P_ij·dP_ij, using the full out of the row.
  for (int64_t i = 0; i < Tq; ++i) {
    const T* o = out + i * D;
    const T* g = dout + i * D;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; ++d) s += o[d] * g[d];
    Di[i] = s;
  }

  for (int64_t kb = 0; kb < nkb; ++kb) {
    const int64_t j0 = kb * kBK;
    const int64_t nk = std::min(kBK, Tk - j0);
    const int32_t* kp = k_pos + j0;
    const T* kt_b = k_t + kb * D * kBK;
    const T* vt_b = v_t + kb * D * kBK;
    for (int64_t qb = 0; qb < nqb; ++qb) {
      const Visibility vis = BlockVisibility(q_ranges[qb], lo_ranges[qb], k_ranges[kb]);
      if (vis == Visibility::kNone) continue;
      const int64_t i0 = qb * kBQ;
      const int64_t nq = std::min(kBQ, Tq - i0);
      const GroupBounds gb = Bounds(vis, q_pos + i0, nq, kp, nk);
      const int64_t gs = gb.size;
      // P = exp(scale·Q Kᵀ − lse), zero where masked or where the row sees nothing.
      for (int64_t g = 0; g * gs < nq; ++g) {
        gemm(std::min(gs, nq - g * gs), gb.cols[g], D, scale, q + (i0 + g * gs) * D, D, kt_b, kBK,
             false, P + g * gs * kBK, kBK);
      }
      for (int64_t i = 0; i < nq; ++i) {
        T* p = P + i * kBK;
        const T L = lse[i0 + i];
        if (L == kNegInf<T>) {
          std::fill(p, p + nk, T(0));
          continue;
        }
        if constexpr (sizeof(T) == sizeof(float)) {
          if (vis == Visibility::kPartial) {
            const int32_t qp = q_pos[i0 + i];
            const int32_t lo = q_lo != nullptr ? q_lo[i0 + i] : kNoLowerBound;
#pragma omp simd
            for (int64_t j = 0; j < nk; ++j) p[j] = Masked(kp[j], qp, lo) ? kNegInf<T> : p[j];
          }
          simd::ExpShift(p, nk, L);  // masked: e^{-inf} = 0
        } else if (vis == Visibility::kPartial) {
          const int32_t qp = q_pos[i0 + i];
          const int32_t lo = q_lo != nullptr ? q_lo[i0 + i] : kNoLowerBound;
#pragma omp simd
          for (int64_t j = 0; j < nk; ++j)
            p[j] = Masked(kp[j], qp, lo) ? T(0) : internal::Exp(p[j] - L);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < nk; ++j) p[j] = internal::Exp(p[j] - L);
        }
      }
      // dV += Pᵀ dO (key group h: the queries before rows[h] have P = 0 there)
      for (int64_t h = 0; h * gs < nk; ++h) {
        const int64_t r0 = gb.rows[h];
        gemm_ta(std::min(gs, nk - h * gs), D, nq - r0, T(1), P + r0 * kBK + h * gs, kBK,
                dout + (i0 + r0) * D, D, true, dv + (j0 + h * gs) * D, D);
      }
      // dP = dO Vᵀ, then dS = P ∘ (dP − Di), 0 past each group's bound
      for (int64_t g = 0; g * gs < nq; ++g) {
        const int64_t rows = std::min(gs, nq - g * gs), cols = gb.cols[g];
        gemm(rows, cols, D, T(1), dout + (i0 + g * gs) * D, D, vt_b, kBK, false, dS + g * gs * kBK,
             kBK);
        for (int64_t i = g * gs; i < g * gs + rows; ++i) {
          T* ds = dS + i * kBK;
          const T* p = P + i * kBK;
          const T di = Di[i0 + i];
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - di);
          std::fill(ds + cols, ds + nk, T(0));
        }
      }
      // dQ += scale·dS K; dK += scale·dSᵀ Q
      for (int64_t g = 0; g * gs < nq; ++g) {
        gemm(std::min(gs, nq - g * gs), D, gb.cols[g], scale, dS + g * gs * kBK, kBK, k + j0 * D, D,
             true, dq + (i0 + g * gs) * D, D);
      }
      for (int64_t h = 0; h * gs < nk; ++h) {
        const int64_t r0 = gb.rows[h];
        gemm_ta(std::min(gs, nk - h * gs), D, nq - r0, scale, dS + r0 * kBK + h * gs, kBK,
                q + (i0 + r0) * D, D, true, dk + (j0 + h * gs) * D, D);
      }
    }
  }
}

}  // namespace

template <typename T>
void AttentionForward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* q_pos,
                      const int32_t* k_pos, int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                      double scale, const int32_t* q_lo) {
  const std::vector<PosRange> q_ranges = BlockRanges(q_pos, Tq, kBQ);
  const std::vector<PosRange> lo_ranges = LowerBoundRanges(q_lo, B, Tq, kBQ);
  const std::vector<PosRange> k_ranges = BlockRanges(k_pos, Tk, kBK);
  const int64_t nqb = static_cast<int64_t>(q_ranges.size());
  const T sc = static_cast<T>(scale);
  [[maybe_unused]] const bool parallel =
      internal::WorthParallel(static_cast<double>(B) * H * Tq * Tk * D / 16);
  // Every head's keys transposed once (read by all its query blocks); V is used as it lies.
  const int64_t k_head = TransposedSize<T>(Tk, D);
  T* k_t = Scratch<T, 30>(B * H * k_head);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t bh = 0; bh < B * H; ++bh) TransposeBlocks(k_t + bh * k_head, k + bh * Tk * D, Tk, D);
  // Tasks are independent (one query block of one head), so the schedule does not affect the
  // result. Late query blocks see the most keys: hand them out first.
  const int64_t n_tasks = B * H * nqb;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t task = 0; task < n_tasks; ++task) {
    const int64_t bh = task / nqb;
    const int64_t qb = nqb - 1 - task % nqb;
    const int64_t i0 = qb * kBQ;
    const int64_t nq = std::min(kBQ, Tq - i0);
    const int64_t b = bh / H;
    ForwardQueryBlock(out + (bh * Tq + i0) * D, lse + bh * Tq + i0, q + (bh * Tq + i0) * D,
                      k_t + bh * k_head, v + bh * Tk * D, q_pos + i0, k_pos,
                      q_lo != nullptr ? q_lo + b * Tq + i0 : nullptr, nq, Tk, D, sc, q_ranges[qb],
                      lo_ranges[b * nqb + qb], k_ranges);
  }
}

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                       const T* out, const T* lse, const int32_t* q_pos, const int32_t* k_pos,
                       int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, double scale,
                       const int32_t* q_lo) {
  const std::vector<PosRange> q_ranges = BlockRanges(q_pos, Tq, kBQ);
  const std::vector<PosRange> k_ranges = BlockRanges(k_pos, Tk, kBK);
  const std::vector<PosRange> lo_ranges = LowerBoundRanges(q_lo, B, Tq, kBQ);
  const int64_t nqb = static_cast<int64_t>(q_ranges.size());
  const T sc = static_cast<T>(scale);
  [[maybe_unused]] const double work = static_cast<double>(B) * H * Tq * Tk * D / 16;
#pragma omp parallel for schedule(dynamic, 1) if (internal::WorthParallel(work))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t qo = bh * Tq * D;
    const int64_t ko = bh * Tk * D;
    const int64_t b = bh / H;
    BackwardHead(dq + qo, dk + ko, dv + ko, dout + qo, q + qo, k + ko, v + ko, out + qo,
                 lse + bh * Tq, q_pos, k_pos, q_lo != nullptr ? q_lo + b * Tq : nullptr, Tq, Tk, D,
                 sc, q_ranges, lo_ranges.data() + b * nqb, k_ranges);
  }
}

template <typename T>
void AttentionMerge(T* out_a, T* lse_a, const T* out_b, const T* lse_b, int64_t rows, int64_t D) {
#pragma omp parallel for schedule(static) if (internal::WorthParallel(rows * D))
  for (int64_t r = 0; r < rows; ++r) {
    const T la = lse_a[r];
    const T lb = lse_b[r];
    if (lb == kNegInf<T>) continue;  // b saw no key: a is unchanged
    T* oa = out_a + r * D;
    const T* ob = out_b + r * D;
    if (la == kNegInf<T>) {
      std::copy(ob, ob + D, oa);
      lse_a[r] = lb;
      continue;
    }
    // Relative to the larger side: w = e^{-|la − lb|} ≤ 1, so nothing overflows.
    const T w = std::exp(-std::abs(la - lb));
    const T inv = T(1) / (T(1) + w);
    const T ca = la >= lb ? inv : w * inv;
    const T cb = la >= lb ? w * inv : inv;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) oa[d] = ca * oa[d] + cb * ob[d];
    lse_a[r] = std::max(la, lb) + std::log1p(w);
  }
}

MESHRUN_INSTANTIATE_CPU_KERNELS(AttentionForward, AttentionBackward, AttentionMerge)

}  // namespace meshrun::cpu
