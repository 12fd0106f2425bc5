// Causal multi-head attention, flash-attention style: scores exist one kBQ×kBK block at a time,
// the softmax is computed online (running max and sum per row), and the backward recomputes
// the probabilities from the saved log-sum-exp (FlashAttention-2). Masking is by global
// positions, so context-parallel chunk pairs and ring blocks need no special case; blocks
// whose keys all lie after all of their queries are skipped without touching them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/kernels/cpu/simd.h"

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

enum class Visibility { kNone, kPartial, kFull };
inline Visibility BlockVisibility(const PosRange& q, const PosRange& k) {
  if (k.lo > q.hi) return Visibility::kNone;   // every key after every query
  if (k.hi <= q.lo) return Visibility::kFull;  // every key at or before every query
  return Visibility::kPartial;
}

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// GEMM operands are packed (kernel_internal.h) once per block and reused by every product
// that needs them. A block of rows n ≤ kBQ (= kBK) of a row-major n×D matrix X serves as:
enum class Operand {
  kA,   // the left factor X (n×D), scaled by alpha
  kB,   // the right factor X (n×D)
  kBt,  // the right factor Xᵀ (D×n)
};

template <typename T>
int64_t PackedStride(Operand as, int64_t D) {
  static_assert(kBQ == kBK);
  switch (as) {
    case Operand::kA: return internal::PackedASize<T>(kBQ, D);
    case Operand::kB: return internal::PackedBSize<T>(kBQ, D);
    case Operand::kBt: return internal::PackedBSize<T>(D, kBQ);
  }
  return 0;
}

// Packs every block of the rows×D matrix x: block b goes to dst + b·PackedStride(as, D).
template <typename T>
void PackBlocks(T* dst, Operand as, const T* x, int64_t rows, int64_t D, T alpha = T(1)) {
  const int64_t stride = PackedStride<T>(as, D);
  for (int64_t b = 0; b * kBQ < rows; ++b) {
    const T* xb = x + b * kBQ * D;
    const int64_t n = std::min(kBQ, rows - b * kBQ);
    T* d = dst + b * stride;
    switch (as) {
      case Operand::kA: internal::PackA(d, false, xb, D, n, D, alpha); break;
      case Operand::kB: internal::PackB(d, false, xb, D, n, D); break;
      case Operand::kBt: internal::PackB(d, true, xb, D, D, n); break;
    }
  }
}

// A buffer of the calling thread per slot, grown as needed and kept between calls (attention
// runs every layer; the forward's packed K/V is the size of K and V of one call).
template <typename T, int kSlot>
T* Scratch(int64_t n) {
  thread_local std::vector<T> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// One query block of one (batch, head): out[nq,D] and lse[nq] from all visible key blocks.
// k_packed / v_packed hold the head's key blocks as Kᵀ and V operands.
template <typename T>
void ForwardQueryBlock(T* out, T* lse, const T* q, const T* k_packed, const T* v_packed,
                       const int32_t* q_pos, const int32_t* k_pos, int64_t nq, int64_t Tk,
                       int64_t D, T scale, const PosRange& q_range,
                       const std::vector<PosRange>& k_ranges) {
  T* S = Scratch<T, 0>(kBQ * kBK);
  T* acc = Scratch<T, 1>(kBQ * D);
  T* m = Scratch<T, 2>(kBQ);
  T* l = Scratch<T, 3>(kBQ);
  T* q_a = Scratch<T, 4>(internal::PackedASize<T>(kBQ, D));
  T* p_a = Scratch<T, 5>(internal::PackedASize<T>(kBQ, kBK));
  std::fill(acc, acc + nq * D, T(0));
  std::fill(m, m + nq, kNegInf<T>);
  std::fill(l, l + nq, T(0));
  PackBlocks(q_a, Operand::kA, q, nq, D, scale);
  const int64_t k_stride = PackedStride<T>(Operand::kBt, D);
  const int64_t v_stride = PackedStride<T>(Operand::kB, D);

  for (size_t kb = 0; kb < k_ranges.size(); ++kb) {
    const Visibility vis = BlockVisibility(q_range, k_ranges[kb]);
    if (vis == Visibility::kNone) continue;
    const int64_t j0 = kb * kBK;
    const int64_t nk = std::min(kBK, Tk - j0);
    // S = scale·Q Kᵀ
    internal::GemmPacked(nq, nk, D, q_a, k_packed + kb * k_stride, /*overwrite=*/true, S, kBK);
    const int32_t* kp = k_pos + j0;
    for (int64_t i = 0; i < nq; ++i) {
      T* s = S + i * kBK;
      if (vis == Visibility::kPartial) {
        const int32_t qp = q_pos[i];
#pragma omp simd
        for (int64_t j = 0; j < nk; ++j) s[j] = kp[j] > qp ? kNegInf<T> : s[j];
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
    // acc += P V
    internal::PackA(p_a, false, S, kBK, nq, nk, T(1));
    internal::GemmPacked(nq, D, nk, p_a, v_packed + kb * v_stride, /*overwrite=*/false, acc, D);
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
                  int64_t Tq, int64_t Tk, int64_t D, T scale, const std::vector<PosRange>& q_ranges,
                  const std::vector<PosRange>& k_ranges) {
  const int64_t nqb = static_cast<int64_t>(q_ranges.size());
  const int64_t nkb = static_cast<int64_t>(k_ranges.size());
  const int64_t a_stride = PackedStride<T>(Operand::kA, D);
  const int64_t b_stride = PackedStride<T>(Operand::kB, D);
  const int64_t bt_stride = PackedStride<T>(Operand::kBt, D);
  // Every block of the head, packed once in each role it plays below.
  T* q_a = Scratch<T, 10>(nqb * a_stride);    // Q as A (scaled): S = scale·Q Kᵀ
  T* q_b = Scratch<T, 11>(nqb * b_stride);    // Q as B: dK += dSᵀ Q
  T* do_a = Scratch<T, 12>(nqb * a_stride);   // dO as A: dP = dO Vᵀ
  T* do_b = Scratch<T, 13>(nqb * b_stride);   // dO as B: dV += Pᵀ dO
  T* k_bt = Scratch<T, 14>(nkb * bt_stride);  // Kᵀ as B: S
  T* k_b = Scratch<T, 15>(nkb * b_stride);    // K as B: dQ += dS K
  T* v_bt = Scratch<T, 16>(nkb * bt_stride);  // Vᵀ as B: dP
  PackBlocks(q_a, Operand::kA, q, Tq, D, scale);
  PackBlocks(q_b, Operand::kB, q, Tq, D);
  PackBlocks(do_a, Operand::kA, dout, Tq, D);
  PackBlocks(do_b, Operand::kB, dout, Tq, D);
  PackBlocks(k_bt, Operand::kBt, k, Tk, D);
  PackBlocks(k_b, Operand::kB, k, Tk, D);
  PackBlocks(v_bt, Operand::kBt, v, Tk, D);
  // Per block pair: P, dS and their packed forms.
  T* P = Scratch<T, 17>(kBQ * kBK);
  T* dS = Scratch<T, 18>(kBQ * kBK);
  T* pt_a = Scratch<T, 19>(internal::PackedASize<T>(kBK, kBQ));
  T* ds_a = Scratch<T, 20>(internal::PackedASize<T>(kBQ, kBK));
  T* dst_a = Scratch<T, 21>(internal::PackedASize<T>(kBK, kBQ));
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
    for (int64_t qb = 0; qb < nqb; ++qb) {
      const Visibility vis = BlockVisibility(q_ranges[qb], k_ranges[kb]);
      if (vis == Visibility::kNone) continue;
      const int64_t i0 = qb * kBQ;
      const int64_t nq = std::min(kBQ, Tq - i0);
      // P = exp(scale·Q Kᵀ − lse), zero where masked or where the row sees nothing.
      internal::GemmPacked(nq, nk, D, q_a + qb * a_stride, k_bt + kb * bt_stride, true, P, kBK);
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
#pragma omp simd
            for (int64_t j = 0; j < nk; ++j) p[j] = kp[j] > qp ? kNegInf<T> : p[j];
          }
          simd::ExpShift(p, nk, L);  // masked: e^{-inf} = 0
        } else if (vis == Visibility::kPartial) {
          const int32_t qp = q_pos[i0 + i];
#pragma omp simd
          for (int64_t j = 0; j < nk; ++j) p[j] = kp[j] > qp ? T(0) : internal::Exp(p[j] - L);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < nk; ++j) p[j] = internal::Exp(p[j] - L);
        }
      }
      // dV += Pᵀ dO
      internal::PackA(pt_a, true, P, kBK, nk, nq, T(1));
      internal::GemmPacked(nk, D, nq, pt_a, do_b + qb * b_stride, false, dv + j0 * D, D);
      // dP = dO Vᵀ, then dS = P ∘ (dP − Di)
      internal::GemmPacked(nq, nk, D, do_a + qb * a_stride, v_bt + kb * bt_stride, true, dS, kBK);
      for (int64_t i = 0; i < nq; ++i) {
        T* ds = dS + i * kBK;
        const T* p = P + i * kBK;
        const T di = Di[i0 + i];
#pragma omp simd
        for (int64_t j = 0; j < nk; ++j) ds[j] = p[j] * (ds[j] - di);
      }
      // dQ += scale·dS K; dK += scale·dSᵀ Q
      internal::PackA(ds_a, false, dS, kBK, nq, nk, scale);
      internal::GemmPacked(nq, D, nk, ds_a, k_b + kb * b_stride, false, dq + i0 * D, D);
      internal::PackA(dst_a, true, dS, kBK, nk, nq, scale);
      internal::GemmPacked(nk, D, nq, dst_a, q_b + qb * b_stride, false, dk + j0 * D, D);
    }
  }
}

}  // namespace

template <typename T>
void AttentionForward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* q_pos,
                      const int32_t* k_pos, int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                      double scale) {
  const std::vector<PosRange> q_ranges = BlockRanges(q_pos, Tq, kBQ);
  const std::vector<PosRange> k_ranges = BlockRanges(k_pos, Tk, kBK);
  const int64_t nqb = static_cast<int64_t>(q_ranges.size());
  const int64_t nkb = static_cast<int64_t>(k_ranges.size());
  const T sc = static_cast<T>(scale);
  [[maybe_unused]] const bool parallel =
      internal::WorthParallel(static_cast<double>(B) * H * Tq * Tk * D / 16);
  // Every key block of every head, packed once as Kᵀ and as V (read by all query blocks).
  const int64_t k_head = nkb * PackedStride<T>(Operand::kBt, D);
  const int64_t v_head = nkb * PackedStride<T>(Operand::kB, D);
  T* k_packed = Scratch<T, 30>(B * H * k_head);
  T* v_packed = Scratch<T, 31>(B * H * v_head);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    PackBlocks(k_packed + bh * k_head, Operand::kBt, k + bh * Tk * D, Tk, D);
    PackBlocks(v_packed + bh * v_head, Operand::kB, v + bh * Tk * D, Tk, D);
  }
  // Tasks are independent (one query block of one head), so the schedule does not affect the
  // result. Late query blocks see the most keys: hand them out first.
  const int64_t n_tasks = B * H * nqb;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t task = 0; task < n_tasks; ++task) {
    const int64_t bh = task / nqb;
    const int64_t qb = nqb - 1 - task % nqb;
    const int64_t i0 = qb * kBQ;
    const int64_t nq = std::min(kBQ, Tq - i0);
    ForwardQueryBlock(out + (bh * Tq + i0) * D, lse + bh * Tq + i0, q + (bh * Tq + i0) * D,
                      k_packed + bh * k_head, v_packed + bh * v_head, q_pos + i0, k_pos, nq, Tk, D,
                      sc, q_ranges[qb], k_ranges);
  }
}

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                       const T* out, const T* lse, const int32_t* q_pos, const int32_t* k_pos,
                       int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, double scale) {
  const std::vector<PosRange> q_ranges = BlockRanges(q_pos, Tq, kBQ);
  const std::vector<PosRange> k_ranges = BlockRanges(k_pos, Tk, kBK);
  const T sc = static_cast<T>(scale);
  [[maybe_unused]] const double work = static_cast<double>(B) * H * Tq * Tk * D / 16;
#pragma omp parallel for schedule(dynamic, 1) if (internal::WorthParallel(work))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t qo = bh * Tq * D;
    const int64_t ko = bh * Tk * D;
    BackwardHead(dq + qo, dk + ko, dv + ko, dout + qo, q + qo, k + ko, v + ko, out + qo,
                 lse + bh * Tq, q_pos, k_pos, Tq, Tk, D, sc, q_ranges, k_ranges);
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

#define MESHRUN_INSTANTIATE(T)                                                                     \
  template void AttentionForward<T>(T*, T*, const T*, const T*, const T*, const int32_t*,          \
                                    const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t,   \
                                    double);                                                       \
  template void AttentionBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                     const T*, const int32_t*, const int32_t*, int64_t, int64_t,   \
                                     int64_t, int64_t, int64_t, double);                           \
  template void AttentionMerge<T>(T*, T*, const T*, const T*, int64_t, int64_t);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::cpu
