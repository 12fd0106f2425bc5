// GPT-2 attention on one rank: split heads, causal attention over this rank's queries and
// (under context parallel) every rank's keys, merge heads. Sliding windows and documents only
// raise each query's first visible key position (q_lo_, by global positions), so both cp
// strategies apply them unchanged: a K/V block of another rank is masked by its positions. Context
// parallel has two strategies (docs/job-spec.md cp_comm_strategy): `allgather` gathers K and V once
// per layer; `ring` passes K/V blocks around the cp ring and merges partial results by log-sum-exp.
// docs/parallelism.md gives the bytes each moves. Every op runs on the model's device.
#include <cmath>
#include <cstring>

#include "common/parallel_dims.h"
#include "engine/comm/communicator.h"
#include "engine/model/gpt2.h"
#include "engine/ops/ops.h"

namespace meshrun {
namespace {

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
void EnsureSize(Tensor& t, int64_t n, ScalarType dt, Device dev,
                MemoryKind kind = MemoryKind::kCommunication) {
  MemoryKindScope scope(kind);
  if (!t.defined() || t.numel() < n) t = Tensor::Empty({n}, dt, dev);
}

}  // namespace

template <typename T>
Status GPT2<T>::Rope(T* x, bool backward) {
  const int64_t Hl = cfg_.n_head / cfg_.tp_size, D = cfg_.head_dim(), half = D / 2;
  const T* cos = rope_.template data<T>();
  if (!row_rope_) {  // one table for every sequence
    const T* sin = cos + static_cast<int64_t>(T_) * half;
    return backward ? ops::RopeBackward(cfg_.device, x, cos, sin, B_ * Hl, T_, D)
                    : ops::RopeForward(cfg_.device, x, cos, sin, B_ * Hl, T_, D);
  }
  // Documents: each sequence has its own positions, so its own rows of the table.
  const T* sin = cos + static_cast<int64_t>(B_) * T_ * half;
  for (int64_t b = 0; b < B_; ++b) {
    T* xb = x + b * Hl * T_ * D;
    const int64_t off = b * T_ * half;
    MESHRUN_RETURN_IF_ERROR(
        backward ? ops::RopeBackward(cfg_.device, xb, cos + off, sin + off, Hl, T_, D)
                 : ops::RopeForward(cfg_.device, xb, cos + off, sin + off, Hl, T_, D));
  }
  return OkStatus();
}

template <typename T>
Status GPT2<T>::PrepareCpPositions() {
  const Communicator* cp = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->cp != nullptr && par_->cp->size() > 1) cp = par_->cp;
  }
  if (cp == nullptr) return OkStatus();
  std::vector<int32_t> all;
  for (int j = 0; j < cp->size(); ++j) {
    const std::vector<int32_t> pj = CpPositions(j, cp->size(), T_);
    all.insert(all.end(), pj.begin(), pj.end());
  }
  return Upload(cp_positions_, all.data(), static_cast<int64_t>(all.size()));
}

template <typename T>
Status GPT2<T>::AttentionForward(LayerActs& a, bool split_qkv) {
  const Device dev = cfg_.device;
  const int64_t B = B_, Tn = T_, Hl = cfg_.n_head / cfg_.tp_size, D = cfg_.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int32_t* pos = seq_positions_dev_.template data<int32_t>();
  const int32_t* lo = has_q_lo_ ? q_lo_.template data<int32_t>() : nullptr;
  T* q = a.q.template data<T>();
  T* k = a.k.template data<T>();
  T* v = a.v.template data<T>();
  T* att = a.att.template data<T>();
  T* lse = a.lse.template data<T>();
  if (split_qkv) {
    const int64_t Kl = cfg_.kv_heads() / cfg_.tp_size;
    MESHRUN_RETURN_IF_ERROR(
        ops::SplitHeads(dev, q, k, v, qkv_.template data<T>(), B, Tn, Hl, Kl, D));
    if (!cfg_.family().learned_positions) {  // rotary embeddings at the tokens' global (or
                                             // document) positions
      MESHRUN_RETURN_IF_ERROR(Rope(q, /*backward=*/false));
      MESHRUN_RETURN_IF_ERROR(Rope(k, /*backward=*/false));
    }
  }
  Communicator* cp = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->cp != nullptr && par_->cp->size() > 1) cp = par_->cp;
  }
  if (cp == nullptr) {
    MESHRUN_RETURN_IF_ERROR(
        ops::AttentionForward(dev, att, lse, q, k, v, pos, pos, B, Hl, Tn, Tn, D, scale, lo));
  } else if constexpr (std::is_same_v<T, float>) {
    const int n = cp->size(), c = cp->rank();
    const int64_t count = B * Hl * Tn * D;
    const ScalarType dt = ScalarTypeOf<T>();
    const CallOptions on_cp = CallOptions::Axis(MeshAxis::kCp);
    const int32_t* cp_pos = cp_positions_.template data<int32_t>();
    if (!par_->cp_ring) {
      // Gather every rank's K and V once; keep them for the backward.
      EnsureSize(cp_kv_, n * count, dt, dev);
      EnsureSize(a.k_all, n * count, dt, dev, MemoryKind::kActivations);
      EnsureSize(a.v_all, n * count, dt, dev, MemoryKind::kActivations);
      for (auto [local, all] : {std::pair{k, &a.k_all}, std::pair{v, &a.v_all}}) {
        MESHRUN_RETURN_IF_ERROR(
            cp->AllGather(local, cp_kv_.template data<T>(), static_cast<size_t>(count), on_cp));
        MESHRUN_RETURN_IF_ERROR(ops::BlocksToSequence(dev, all->template data<T>(),
                                                      cp_kv_.template data<T>(), n, B * Hl, Tn, D));
      }
      MESHRUN_RETURN_IF_ERROR(ops::AttentionForward(dev, att, lse, q, a.k_all.template data<T>(),
                                                    a.v_all.template data<T>(), pos, cp_pos, B, Hl,
                                                    Tn, n * Tn, D, scale, lo));
    } else {
      // Ring: step s holds the K/V block of rank c − s; merge each partial by log-sum-exp.
      EnsureSize(cp_send_, 2 * count, dt, dev);
      EnsureSize(cp_recv_, 2 * count, dt, dev);
      EnsureSize(cp_kv_, count + B * Hl * Tn, dt, dev);
      T* cur = cp_send_.template data<T>();
      T* nxt = cp_recv_.template data<T>();
      MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, cur, k, sizeof(T) * count));
      MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, cur + count, v, sizeof(T) * count));
      MESHRUN_RETURN_IF_ERROR(
          ops::AttentionForward(dev, att, lse, q, k, v, pos, pos, B, Hl, Tn, Tn, D, scale, lo));
      T* part_out = cp_kv_.template data<T>();
      T* part_lse = part_out + count;
      for (int s = 1; s < n; ++s) {
        MESHRUN_RETURN_IF_ERROR(
            cp->SendRecv(cur, 2 * count, (c + 1) % n, nxt, 2 * count, (c - 1 + n) % n, on_cp));
        std::swap(cur, nxt);
        const int32_t* kpos = cp_pos + static_cast<int64_t>((c - s + n) % n) * Tn;
        MESHRUN_RETURN_IF_ERROR(ops::AttentionForward(dev, part_out, part_lse, q, cur, cur + count,
                                                      pos, kpos, B, Hl, Tn, Tn, D, scale, lo));
        MESHRUN_RETURN_IF_ERROR(
            ops::AttentionMerge(dev, att, lse, part_out, part_lse, B * Hl * Tn, D));
      }
    }
  }
  return ops::HeadsToRows(dev, a.atty.template data<T>(), att, B, Tn, Hl, D);
}

template <typename T>
Status GPT2<T>::AttentionBackward(LayerActs& a, T* dqkv) {
  const Device dev = cfg_.device;
  const int64_t B = B_, Tn = T_, Hl = cfg_.n_head / cfg_.tp_size, D = cfg_.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int32_t* pos = seq_positions_dev_.template data<int32_t>();
  const int32_t* lo = has_q_lo_ ? q_lo_.template data<int32_t>() : nullptr;
  const int64_t count = B * Hl * Tn * D;
  T* datt = datt_.template data<T>();
  T* dq = dq_.template data<T>();
  T* dk = dk_.template data<T>();
  T* dv = dv_.template data<T>();
  const T* q = a.q.template data<T>();
  const T* att = a.att.template data<T>();
  const T* lse = a.lse.template data<T>();
  MESHRUN_RETURN_IF_ERROR(ops::RowsToHeads(dev, datt, datty_.template data<T>(), B, Tn, Hl, D));
  MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dq, sizeof(T) * count));
  MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dk, sizeof(T) * count));
  MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dv, sizeof(T) * count));
  Communicator* cp = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->cp != nullptr && par_->cp->size() > 1) cp = par_->cp;
  }
  if (cp == nullptr) {
    MESHRUN_RETURN_IF_ERROR(ops::AttentionBackward(dev, dq, dk, dv, datt, q, a.k.template data<T>(),
                                                   a.v.template data<T>(), att, lse, pos, pos, B,
                                                   Hl, Tn, Tn, D, scale, lo));
  } else if constexpr (std::is_same_v<T, float>) {
    const int n = cp->size(), c = cp->rank();
    const ScalarType dt = ScalarTypeOf<T>();
    const CallOptions on_cp = CallOptions::Axis(MeshAxis::kCp);
    const int32_t* cp_pos = cp_positions_.template data<int32_t>();
    if (!par_->cp_ring) {
      // Gradients for every rank's keys, then reduce-scattered back to their owners.
      EnsureSize(cp_dkv_, 2 * n * count, dt, dev);
      T* dk_all = cp_dkv_.template data<T>();
      T* dv_all = dk_all + n * count;
      MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dk_all, sizeof(T) * 2 * n * count));
      MESHRUN_RETURN_IF_ERROR(ops::AttentionBackward(
          dev, dq, dk_all, dv_all, datt, q, a.k_all.template data<T>(), a.v_all.template data<T>(),
          att, lse, pos, cp_pos, B, Hl, Tn, n * Tn, D, scale, lo));
      EnsureSize(cp_kv_, n * count, dt, dev);
      for (auto [all, local] : {std::pair{dk_all, dk}, std::pair{dv_all, dv}}) {
        MESHRUN_RETURN_IF_ERROR(
            ops::SequenceToBlocks(dev, cp_kv_.template data<T>(), all, n, B * Hl, Tn, D));
        MESHRUN_RETURN_IF_ERROR(
            cp->ReduceScatter(cp_kv_.template data<T>(), local, static_cast<size_t>(count), on_cp));
      }
    } else {
      // Ring: blocks travel with their K, V and the dK, dV accumulated so far; after the last
      // step each accumulator is one hop from its owner.
      EnsureSize(cp_send_, 4 * count, dt, dev);
      EnsureSize(cp_recv_, 4 * count, dt, dev);
      T* cur = cp_send_.template data<T>();
      T* nxt = cp_recv_.template data<T>();
      MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, cur, a.k.template data<T>(), sizeof(T) * count));
      MESHRUN_RETURN_IF_ERROR(
          ops::Copy(dev, cur + count, a.v.template data<T>(), sizeof(T) * count));
      MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, cur + 2 * count, sizeof(T) * 2 * count));
      for (int s = 0; s < n; ++s) {
        const int32_t* kpos = cp_pos + static_cast<int64_t>((c - s + n) % n) * Tn;
        MESHRUN_RETURN_IF_ERROR(ops::AttentionBackward(dev, dq, cur + 2 * count, cur + 3 * count,
                                                       datt, q, cur, cur + count, att, lse, pos,
                                                       kpos, B, Hl, Tn, Tn, D, scale, lo));
        if (s + 1 < n) {
          MESHRUN_RETURN_IF_ERROR(
              cp->SendRecv(cur, 4 * count, (c + 1) % n, nxt, 4 * count, (c - 1 + n) % n, on_cp));
          std::swap(cur, nxt);
        }
      }
      MESHRUN_RETURN_IF_ERROR(cp->SendRecv(cur + 2 * count, 2 * count, (c + 1) % n, nxt, 2 * count,
                                           (c - 1 + n) % n, on_cp));
      MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, dk, nxt, sizeof(T) * count));
      MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, dv, nxt + count, sizeof(T) * count));
    }
  }
  if (!cfg_.family().learned_positions) {
    MESHRUN_RETURN_IF_ERROR(Rope(dq, /*backward=*/true));
    MESHRUN_RETURN_IF_ERROR(Rope(dk, /*backward=*/true));
  }
  return ops::MergeQkvGrads(dev, dqkv, dq, dk, dv, B, Tn, Hl, cfg_.kv_heads() / cfg_.tp_size, D);
}

// float; double in the float64 twin (element_type.h).
using Model = GPT2<MESHRUN_ELEMENT_TYPE>;
template Status Model::Rope(MESHRUN_ELEMENT_TYPE*, bool);
template Status Model::PrepareCpPositions();
template Status Model::AttentionForward(Model::LayerActs&, bool);
template Status Model::AttentionBackward(Model::LayerActs&, MESHRUN_ELEMENT_TYPE*);

}  // namespace meshrun
