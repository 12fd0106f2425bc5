// GPT-2 attention on one rank: split heads, causal attention over this rank's queries and
// (under context parallel) every rank's keys, merge heads. Context parallel has two strategies
// (docs/job-spec.md cp_comm_strategy): `allgather` gathers K and V once per layer;
// `ring` passes K/V blocks around the cp ring and merges partial results by log-sum-exp.
// docs/parallelism.md gives the bytes each moves.
#include <cmath>
#include <cstring>

#include "common/parallel_dims.h"
#include "engine/comm/communicator.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/model/gpt2.h"

namespace meshrun {
namespace {

// qkv rows [q (H·D) | k (K·D) | v (K·D)] → q, k, v each (B,H,T,D): with grouped-query
// attention (K < H) query head h reads key/value head h/(H/K), so k and v are repeated.
template <typename T>
void SplitHeads(T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t K,
                int64_t D) {
  const int64_t W = (H + 2 * K) * D, group = H / K;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      const T* row = qkv + (b * Tn + t) * W;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t dst = ((b * H + h) * Tn + t) * D;
        const int64_t kv = h / group;
        std::memcpy(q + dst, row + h * D, sizeof(T) * D);
        std::memcpy(k + dst, row + (H + kv) * D, sizeof(T) * D);
        std::memcpy(v + dst, row + (H + K + kv) * D, sizeof(T) * D);
      }
    }
  }
}

// The inverse of SplitHeads: the gradients of a repeated k/v head are summed (in head order).
template <typename T>
void MergeQkvGrads(T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B, int64_t Tn, int64_t H,
                   int64_t K, int64_t D) {
  const int64_t W = (H + 2 * K) * D, group = H / K;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      T* row = dqkv + (b * Tn + t) * W;
      std::memset(row + H * D, 0, sizeof(T) * 2 * K * D);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t src = ((b * H + h) * Tn + t) * D;
        const int64_t kv = h / group;
        std::memcpy(row + h * D, dq + src, sizeof(T) * D);
        T* rk = row + (H + kv) * D;
        T* rv = row + (H + K + kv) * D;
        for (int64_t d = 0; d < D; ++d) {
          rk[d] += dk[src + d];
          rv[d] += dv[src + d];
        }
      }
    }
  }
}

// (B,H,T,D) ↔ (B,T,H·D). to_rows picks the direction.
template <typename T>
void Transpose(T* rows, T* heads, int64_t B, int64_t Tn, int64_t H, int64_t D, bool to_rows) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        T* r = rows + (b * Tn + t) * H * D + h * D;
        T* x = heads + ((b * H + h) * Tn + t) * D;
        if (to_rows) {
          std::memcpy(r, x, sizeof(T) * D);
        } else {
          std::memcpy(x, r, sizeof(T) * D);
        }
      }
    }
  }
}

// Gathered blocks [j][B][H][Tl][D] ↔ one sequence (B,H,n·Tl,D) whose key j·Tl + t is token t of
// cp rank j. to_seq picks the direction.
template <typename T>
void BlocksToSequence(T* blocks, T* seq, int64_t n, int64_t BH, int64_t Tl, int64_t D,
                      bool to_seq) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t bh = 0; bh < BH; ++bh) {
      T* blk = blocks + ((j * BH + bh) * Tl) * D;
      T* dst = seq + (bh * n * Tl + j * Tl) * D;
      if (to_seq) {
        std::memcpy(dst, blk, sizeof(T) * Tl * D);
      } else {
        std::memcpy(blk, dst, sizeof(T) * Tl * D);
      }
    }
  }
}

// Global positions of cp rank j's tokens (docs/data.md: chunks j and 2C−1−j of 2C).
std::vector<int32_t> CpPositions(int j, int cp_size, int local_len) {
  std::vector<int32_t> pos(local_len);
  const int chunk = local_len / 2;
  for (int t = 0; t < chunk; ++t) {
    pos[t] = CpChunkIndex(cp_size, j, 0) * chunk + t;
    pos[chunk + t] = CpChunkIndex(cp_size, j, 1) * chunk + t;
  }
  return pos;
}

// cp's exchange buffers count as communication memory; the gathered K and V as activations.
void EnsureSize(Tensor& t, int64_t n, ScalarType dt, MemoryKind kind = MemoryKind::kCommunication) {
  MemoryKindScope scope(kind);
  if (!t.defined() || t.numel() < n) t = Tensor::Empty({n}, dt);
}

}  // namespace

template <typename T>
Status GPT2<T>::AttentionForward(LayerActs& a, bool split_qkv) {
  const int64_t B = B_, Tn = T_, Hl = cfg_.n_head / cfg_.tp_size, D = cfg_.d_model / cfg_.n_head;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int32_t* pos = seq_positions_.data();
  T* q = a.q.template data<T>();
  T* k = a.k.template data<T>();
  T* v = a.v.template data<T>();
  T* att = a.att.template data<T>();
  T* lse = a.lse.template data<T>();
  if (split_qkv) {
    const int64_t Kl = cfg_.kv_heads() / cfg_.tp_size;
    SplitHeads(q, k, v, qkv_.template data<T>(), B, Tn, Hl, Kl, D);
    if (cfg_.llama()) {  // rotary embeddings at the tokens' global positions
      cpu::RopeForward(q, rope_cos_.data(), rope_sin_.data(), B * Hl, Tn, D);
      cpu::RopeForward(k, rope_cos_.data(), rope_sin_.data(), B * Hl, Tn, D);
    }
  }
  Communicator* cp = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->cp != nullptr && par_->cp->size() > 1) cp = par_->cp;
  }
  if (cp == nullptr) {
    cpu::AttentionForward(att, lse, q, k, v, pos, pos, B, Hl, Tn, Tn, D, scale);
  } else if constexpr (std::is_same_v<T, float>) {
    const int n = cp->size(), c = cp->rank();
    const int64_t count = B * Hl * Tn * D;
    const ScalarType dt = ScalarTypeOf<T>();
    const CallOptions on_cp = CallOptions::Axis("cp");
    if (!par_->cp_ring) {
      // Gather every rank's K and V once; keep them for the backward.
      k_positions_.clear();
      for (int j = 0; j < n; ++j) {
        const std::vector<int32_t> pj = CpPositions(j, n, static_cast<int>(Tn));
        k_positions_.insert(k_positions_.end(), pj.begin(), pj.end());
      }
      EnsureSize(cp_kv_, n * count, dt);
      EnsureSize(a.k_all, n * count, dt, MemoryKind::kActivations);
      EnsureSize(a.v_all, n * count, dt, MemoryKind::kActivations);
      for (auto [local, all] : {std::pair{k, &a.k_all}, std::pair{v, &a.v_all}}) {
        MESHRUN_RETURN_IF_ERROR(
            cp->AllGather(local, cp_kv_.template data<T>(), static_cast<size_t>(count), on_cp));
        BlocksToSequence(cp_kv_.template data<T>(), all->template data<T>(), n, B * Hl, Tn, D,
                         /*to_seq=*/true);
      }
      cpu::AttentionForward(att, lse, q, a.k_all.template data<T>(), a.v_all.template data<T>(),
                            pos, k_positions_.data(), B, Hl, Tn, n * Tn, D, scale);
    } else {
      // Ring: step s holds the K/V block of rank c − s; merge each partial by log-sum-exp.
      EnsureSize(cp_send_, 2 * count, dt);
      EnsureSize(cp_recv_, 2 * count, dt);
      EnsureSize(cp_kv_, count + B * Hl * Tn, dt);
      T* cur = cp_send_.template data<T>();
      T* nxt = cp_recv_.template data<T>();
      std::memcpy(cur, k, sizeof(T) * count);
      std::memcpy(cur + count, v, sizeof(T) * count);
      cpu::AttentionForward(att, lse, q, k, v, pos, pos, B, Hl, Tn, Tn, D, scale);
      T* part_out = cp_kv_.template data<T>();
      T* part_lse = part_out + count;
      for (int s = 1; s < n; ++s) {
        MESHRUN_RETURN_IF_ERROR(
            cp->SendRecv(cur, 2 * count, (c + 1) % n, nxt, 2 * count, (c - 1 + n) % n, on_cp));
        std::swap(cur, nxt);
        const std::vector<int32_t> kpos = CpPositions((c - s + n) % n, n, static_cast<int>(Tn));
        cpu::AttentionForward(part_out, part_lse, q, cur, cur + count, pos, kpos.data(), B, Hl, Tn,
                              Tn, D, scale);
        cpu::AttentionMerge(att, lse, part_out, part_lse, B * Hl * Tn, D);
      }
    }
  }
  Transpose(a.atty.template data<T>(), att, B, Tn, Hl, D, /*to_rows=*/true);
  return OkStatus();
}

template <typename T>
Status GPT2<T>::AttentionBackward(LayerActs& a) {
  const int64_t B = B_, Tn = T_, Hl = cfg_.n_head / cfg_.tp_size, D = cfg_.d_model / cfg_.n_head;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int32_t* pos = seq_positions_.data();
  const int64_t count = B * Hl * Tn * D;
  T* datt = datt_.template data<T>();
  T* dq = dq_.template data<T>();
  T* dk = dk_.template data<T>();
  T* dv = dv_.template data<T>();
  const T* q = a.q.template data<T>();
  const T* att = a.att.template data<T>();
  const T* lse = a.lse.template data<T>();
  Transpose(datty_.template data<T>(), datt, B, Tn, Hl, D, /*to_rows=*/false);
  std::memset(dq, 0, sizeof(T) * count);
  std::memset(dk, 0, sizeof(T) * count);
  std::memset(dv, 0, sizeof(T) * count);
  Communicator* cp = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->cp != nullptr && par_->cp->size() > 1) cp = par_->cp;
  }
  if (cp == nullptr) {
    cpu::AttentionBackward(dq, dk, dv, datt, q, a.k.template data<T>(), a.v.template data<T>(), att,
                           lse, pos, pos, B, Hl, Tn, Tn, D, scale);
  } else if constexpr (std::is_same_v<T, float>) {
    const int n = cp->size(), c = cp->rank();
    const ScalarType dt = ScalarTypeOf<T>();
    const CallOptions on_cp = CallOptions::Axis("cp");
    if (!par_->cp_ring) {
      // Gradients for every rank's keys, then reduce-scattered back to their owners.
      EnsureSize(cp_dkv_, 2 * n * count, dt);
      T* dk_all = cp_dkv_.template data<T>();
      T* dv_all = dk_all + n * count;
      std::memset(dk_all, 0, sizeof(T) * 2 * n * count);
      cpu::AttentionBackward(dq, dk_all, dv_all, datt, q, a.k_all.template data<T>(),
                             a.v_all.template data<T>(), att, lse, pos, k_positions_.data(), B, Hl,
                             Tn, n * Tn, D, scale);
      EnsureSize(cp_kv_, n * count, dt);
      for (auto [all, local] : {std::pair{dk_all, dk}, std::pair{dv_all, dv}}) {
        BlocksToSequence(cp_kv_.template data<T>(), all, n, B * Hl, Tn, D, /*to_seq=*/false);
        MESHRUN_RETURN_IF_ERROR(
            cp->ReduceScatter(cp_kv_.template data<T>(), local, static_cast<size_t>(count), on_cp));
      }
    } else {
      // Ring: blocks travel with their K, V and the dK, dV accumulated so far; after the last
      // step each accumulator is one hop from its owner.
      EnsureSize(cp_send_, 4 * count, dt);
      EnsureSize(cp_recv_, 4 * count, dt);
      T* cur = cp_send_.template data<T>();
      T* nxt = cp_recv_.template data<T>();
      std::memcpy(cur, a.k.template data<T>(), sizeof(T) * count);
      std::memcpy(cur + count, a.v.template data<T>(), sizeof(T) * count);
      std::memset(cur + 2 * count, 0, sizeof(T) * 2 * count);
      for (int s = 0; s < n; ++s) {
        const std::vector<int32_t> kpos = CpPositions((c - s + n) % n, n, static_cast<int>(Tn));
        cpu::AttentionBackward(dq, cur + 2 * count, cur + 3 * count, datt, q, cur, cur + count, att,
                               lse, pos, kpos.data(), B, Hl, Tn, Tn, D, scale);
        if (s + 1 < n) {
          MESHRUN_RETURN_IF_ERROR(
              cp->SendRecv(cur, 4 * count, (c + 1) % n, nxt, 4 * count, (c - 1 + n) % n, on_cp));
          std::swap(cur, nxt);
        }
      }
      MESHRUN_RETURN_IF_ERROR(cp->SendRecv(cur + 2 * count, 2 * count, (c + 1) % n, nxt, 2 * count,
                                           (c - 1 + n) % n, on_cp));
      std::memcpy(dk, nxt, sizeof(T) * count);
      std::memcpy(dv, nxt + count, sizeof(T) * count);
    }
  }
  if (cfg_.llama()) {
    cpu::RopeBackward(dq, rope_cos_.data(), rope_sin_.data(), B * Hl, Tn, D);
    cpu::RopeBackward(dk, rope_cos_.data(), rope_sin_.data(), B * Hl, Tn, D);
  }
  MergeQkvGrads(dqkv_.template data<T>(), dq, dk, dv, B, Tn, Hl, cfg_.kv_heads() / cfg_.tp_size, D);
  return OkStatus();
}

template Status GPT2<float>::AttentionForward(GPT2<float>::LayerActs&, bool);
template Status GPT2<double>::AttentionForward(GPT2<double>::LayerActs&, bool);
template Status GPT2<float>::AttentionBackward(GPT2<float>::LayerActs&);
template Status GPT2<double>::AttentionBackward(GPT2<double>::LayerActs&);

}  // namespace meshrun
