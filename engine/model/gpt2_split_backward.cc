// Zero-bubble's split backward (decision 0059): the B pass (input gradients, with what each
// block's weight gradients need kept in a stash) and the W pass (the weight gradients from the
// stash), beside the whole backward of gpt2.cc.
#include <algorithm>
#include <string>

#include "engine/model/gpt2.h"
#include "engine/ops/ops.h"

namespace meshrun {

template <typename T>
typename GPT2<T>::LayerStash GPT2<T>::LayerStashLayout(int64_t N) const {
  const int64_t C = cfg_.d_model, Cl = AttnWidth(), Fl = cfg_.ff() / cfg_.tp_size;
  const bool gated = cfg_.gated_mlp(), layer_norm = cfg_.family().norm == NormKind::kLayerNorm;
  LayerStash s;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t first = at;
    at += n;
    return first;
  };
  s.ln1 = take(N * C);
  s.dqkv = take(N * QkvWidth());
  s.atty = take(N * Cl);
  s.dattn = take(N * C);
  s.ln2 = take(N * C);
  s.dfc = take(N * (gated ? 2 * Fl : Fl));
  s.act = take(N * Fl);
  s.dmlp = take(N * C);
  s.norms = take((layer_norm ? 4 : 2) * C);
  s.numel = at;
  return s;
}

template <typename T>
int64_t GPT2<T>::WeightStashNumel(int B, int Tn) const {
  const auto [lb, le] = ChunkLayers();
  return (le - lb) * LayerStashLayout(static_cast<int64_t>(B) * Tn).numel;
}

template <typename T>
StatusOr<double> GPT2<T>::StageBackwardInput(int key, const int32_t* inputs, const T* stage_input,
                                             const int32_t* targets, const T* output_grad, int B,
                                             int Tn, double grad_scale, const int32_t* positions,
                                             int kept_key) {
  for (const WeightStash& s : stashes_) {
    if (s.key == key) {
      return FailedPreconditionError("the input gradients of stash " + std::to_string(key) +
                                     " ran twice before its weight gradients");
    }
  }
  if (static_cast<int>(stashes_.size()) >= stash_limit_) {
    return FailedPreconditionError("a weight-gradient stash beyond the limit of " +
                                   std::to_string(stash_limit_) +
                                   " pending micro-batches (the schedule's bound)");
  }
  WeightStash stash;
  stash.key = key;
  stash.chunk = chunk_;
  stash.tokens = static_cast<int64_t>(B) * Tn;
  const int64_t numel = std::max<int64_t>(WeightStashNumel(B, Tn), 1);
  // A stash an earlier W freed, of this size, else a new one: a stash is megabytes, and a fresh
  // mapping per micro-batch is paid again in page faults.
  auto free = std::find_if(stash_free_.begin(), stash_free_.end(),
                           [&](const Tensor& t) { return t.numel() == numel; });
  if (free != stash_free_.end()) {
    stash.data = *free;
    stash_free_.erase(free);
  } else {
    MemoryKindScope kind(MemoryKind::kActivations);
    stash.data = Tensor::Empty({numel}, ScalarTypeOf<T>(), cfg_.device);
  }
  stash_ = stash.data.template data<T>();
  StatusOr<double> loss = StageForwardBackward(inputs, stage_input, targets, output_grad, B, Tn,
                                               grad_scale, positions, kept_key);
  stash_ = nullptr;
  if (loss.ok()) stashes_.push_back(std::move(stash));
  return loss;
}

template <typename T>
Status GPT2<T>::StageBackwardWeight(int key) {
  auto it = std::find_if(stashes_.begin(), stashes_.end(),
                         [&](const WeightStash& s) { return s.key == key; });
  if (it == stashes_.end()) {
    return FailedPreconditionError("the weight gradients of stash " + std::to_string(key) +
                                   " before its input gradients");
  }
  const int active = chunk_;
  chunk_ = it->chunk;
  const auto [lb, le] = ChunkLayers();
  chunk_ = active;
  const int64_t per_layer = LayerStashLayout(it->tokens).numel;
  const T* data = it->data.template data<T>();
  Status status = OkStatus();
  for (int l = le - 1; l >= lb && status.ok(); --l) {
    status = Hook(kBeforeWeightGrad, 1 + l);
    if (status.ok()) status = BlockBackwardWeight(l, it->tokens, data + (l - lb) * per_layer);
    if (status.ok()) status = Hook(kAfterWeightGrad, 1 + l);
  }
  stash_free_.push_back(it->data);  // free: its W is done; the next B reuses it
  stashes_.erase(it);
  return status;
}

template <typename T>
Status GPT2<T>::BlockBackwardInput(int l, const T* residual, T* stash) {
  // BlockBackward's order and kernels, with every weight and bias gradient left out (dweight,
  // dbias null) and the norms' gradients sent to the stash.
  const Device dev = cfg_.device;
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model, Cl = AttnWidth(),
                Fl = cfg_.ff() / cfg_.tp_size;
  const bool gated = cfg_.gated_mlp(), layer_norm = cfg_.family().norm == NormKind::kLayerNorm;
  const int64_t Gl = gated ? 2 * Fl : Fl;
  const LayerStash s = LayerStashLayout(N);
  T* const none = nullptr;
  using R = ParamRole;
  auto keep = [&](int64_t at, const T* src, int64_t n) {
    return ops::Copy(dev, stash + at, src, sizeof(T) * n);
  };
  T* dres = dres_.template data<T>();
  T* dln = dln_.template data<T>();
  LayerActs& a = acts_[l];
  MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, stash + s.norms, sizeof(T) * (s.numel - s.norms)));
  // MLP block: the proj's (down's) output gradient is dres, its input the activation.
  MESHRUN_RETURN_IF_ERROR(keep(s.dmlp, dres, N * C));
  MESHRUN_RETURN_IF_ERROR(keep(s.act, a.fch_gelu.template data<T>(), N * Fl));
  const bool overwrite = false;  // the ops' accumulate flag (BlockBackward)
  // The up projection's output gradient is computed where W reads it: in the stash, not copied
  // there (BlockBackward's dfch_ otherwise).
  T* dfc = stash + s.dfc;
  if (gated) MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dfc, sizeof(T) * N * Gl));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dfch_gelu_.template data<T>(), none, none, dres,
                                              a.fch_gelu.template data<T>(), W(l, R::kDownWeight),
                                              N, Fl, C, overwrite));
  if (gated) {
    MESHRUN_RETURN_IF_ERROR(
        GatedBackward(dfc, a.fch.template data<T>(), dfch_gelu_.template data<T>(), N, Fl));
  } else {
    MESHRUN_RETURN_IF_ERROR(ops::GeluBackward(dev, dfc, a.fch.template data<T>(),
                                              dfch_gelu_.template data<T>(), N * Fl, overwrite));
  }
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dln, none, none, dfc, a.ln2.template data<T>(),
                                              W(l, R::kUpWeight), N, C, Gl, overwrite));
  MESHRUN_RETURN_IF_ERROR(keep(s.ln2, a.ln2.template data<T>(), N * C));
  MESHRUN_RETURN_IF_ERROR(TpAfterMatmulInputGrad(R::kUpWeight, dln, N * C));
  T* norm2 = stash + s.norms + (layer_norm ? 2 * C : C);
  MESHRUN_RETURN_IF_ERROR(NormBackward(l, 2, a, a.res2.template data<T>(), dres, dln, norm2,
                                       layer_norm ? norm2 + C : none));
  // Attention block: the output projection's output gradient is dres now.
  MESHRUN_RETURN_IF_ERROR(keep(s.dattn, dres, N * C));
  MESHRUN_RETURN_IF_ERROR(keep(s.atty, a.atty.template data<T>(), N * Cl));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, datty_.template data<T>(), none, none, dres,
                                              a.atty.template data<T>(), W(l, R::kOutWeight), N, Cl,
                                              C, overwrite));
  // The qkv projection's output gradient likewise straight into the stash.
  T* dqkv = stash + s.dqkv;
  MESHRUN_RETURN_IF_ERROR(AttentionBackward(a, dqkv));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dln, none, none, dqkv, a.ln1.template data<T>(),
                                              W(l, R::kQkvWeight), N, C, QkvWidth(), overwrite));
  MESHRUN_RETURN_IF_ERROR(keep(s.ln1, a.ln1.template data<T>(), N * C));
  MESHRUN_RETURN_IF_ERROR(TpAfterMatmulInputGrad(R::kQkvWeight, dln, N * C));
  T* norm1 = stash + s.norms;
  return NormBackward(l, 1, a, residual, dres, dln, norm1, layer_norm ? norm1 + C : none);
}

template <typename T>
Status GPT2<T>::BlockBackwardWeight(int l, int64_t N, const T* stash) {
  // The gradients BlockBackward computes beside the input gradient, from what B kept; the
  // weights are not read (MatmulBackward without dinp).
  const Device dev = cfg_.device;
  const int64_t C = cfg_.d_model, Cl = AttnWidth(), Fl = cfg_.ff() / cfg_.tp_size;
  const bool gated = cfg_.gated_mlp(), layer_norm = cfg_.family().norm == NormKind::kLayerNorm;
  const int64_t Gl = gated ? 2 * Fl : Fl;
  const LayerStash s = LayerStashLayout(N);
  T* const none = nullptr;
  const T* no_weight = nullptr;
  using R = ParamRole;
  // MLP block.
  if (!gated)
    MESHRUN_RETURN_IF_ERROR(ops::BiasBackward(dev, Grad(l, R::kDownBias), stash + s.dmlp, N, C));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, Grad(l, R::kDownWeight), none,
                                              stash + s.dmlp, stash + s.act, no_weight, N, Fl, C));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, Grad(l, R::kUpWeight),
                                              gated ? none : Grad(l, R::kUpBias), stash + s.dfc,
                                              stash + s.ln2, no_weight, N, C, Gl));
  const T* norms = stash + s.norms;
  if (!layer_norm) {
    MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, Grad(l, R::kNorm2Weight), norms + C, C));
  } else {
    MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, Grad(l, R::kNorm2Weight), norms + 2 * C, C));
    MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, Grad(l, R::kNorm2Bias), norms + 3 * C, C));
  }
  // Attention block.
  if (cfg_.family().linear_biases)
    MESHRUN_RETURN_IF_ERROR(ops::BiasBackward(dev, Grad(l, R::kOutBias), stash + s.dattn, N, C));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, Grad(l, R::kOutWeight), none,
                                              stash + s.dattn, stash + s.atty, no_weight, N, Cl,
                                              C));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, Grad(l, R::kQkvWeight),
                                              Grad(l, R::kQkvBias), stash + s.dqkv, stash + s.ln1,
                                              no_weight, N, C, QkvWidth()));
  if (!layer_norm) return ops::Accumulate(dev, Grad(l, R::kNorm1Weight), norms, C);
  MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, Grad(l, R::kNorm1Weight), norms, C));
  return ops::Accumulate(dev, Grad(l, R::kNorm1Bias), norms + C, C);
}

#define MESHRUN_INSTANTIATE(T)                                                              \
  template typename GPT2<T>::LayerStash GPT2<T>::LayerStashLayout(int64_t) const;           \
  template int64_t GPT2<T>::WeightStashNumel(int, int) const;                               \
  template StatusOr<double> GPT2<T>::StageBackwardInput(int, const int32_t*, const T*,      \
                                                        const int32_t*, const T*, int, int, \
                                                        double, const int32_t*, int);       \
  template Status GPT2<T>::StageBackwardWeight(int);                                        \
  template Status GPT2<T>::BlockBackwardInput(int, const T*, T*);                           \
  template Status GPT2<T>::BlockBackwardWeight(int, int64_t, const T*);
MESHRUN_INSTANTIATE(MESHRUN_ELEMENT_TYPE)  // float; double in the float64 twin (element_type.h)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun
