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
  const bool llama = cfg_.llama();  // the parameters' names
  const bool gated = cfg_.gated_mlp(), layer_norm = cfg_.family().norm == NormKind::kLayerNorm;
  const int64_t Gl = gated ? 2 * Fl : Fl;
  const LayerStash s = LayerStashLayout(N);
  T* const none = nullptr;
  auto P = [&](const std::string& name) { return param(*FindParam(name)); };
  auto zero = [&](const Tensor& t) { return ops::Zero(dev, t.raw(), t.nbytes()); };
  auto keep = [&](int64_t at, const T* src, int64_t n) {
    return ops::Copy(dev, stash + at, src, sizeof(T) * n);
  };
  T* dres = dres_.template data<T>();
  T* dln = dln_.template data<T>();
  LayerActs& a = acts_[l];
  const std::string h = (llama ? "layers." : "h.") + std::to_string(cfg_.GlobalLayer(l)) + ".";
  MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, stash + s.norms, sizeof(T) * (s.numel - s.norms)));
  // MLP block: the proj's (down's) output gradient is dres, its input the activation.
  MESHRUN_RETURN_IF_ERROR(keep(s.dmlp, dres, N * C));
  MESHRUN_RETURN_IF_ERROR(keep(s.act, a.fch_gelu.template data<T>(), N * Fl));
  const bool overwrite = false;  // the ops' accumulate flag (BlockBackward)
  if (gated) MESHRUN_RETURN_IF_ERROR(zero(dfch_));
  const std::string down = h + (gated ? "mlp.down_proj.weight" : "mlp.c_proj.weight");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dfch_gelu_.template data<T>(), none, none, dres,
                                              a.fch_gelu.template data<T>(), P(down), N, Fl, C,
                                              overwrite));
  if (gated) {
    MESHRUN_RETURN_IF_ERROR(GatedBackward(dfch_.template data<T>(), a.fch.template data<T>(),
                                          dfch_gelu_.template data<T>(), N, Fl));
  } else {
    MESHRUN_RETURN_IF_ERROR(ops::GeluBackward(dev, dfch_.template data<T>(),
                                              a.fch.template data<T>(),
                                              dfch_gelu_.template data<T>(), N * Fl, overwrite));
  }
  const std::string up = h + (gated ? "mlp.gate_up.weight" : "mlp.c_fc.weight");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dln, none, none, dfch_.template data<T>(),
                                              a.ln2.template data<T>(), P(up), N, C, Gl,
                                              overwrite));
  MESHRUN_RETURN_IF_ERROR(keep(s.dfc, dfch_.template data<T>(), N * Gl));
  MESHRUN_RETURN_IF_ERROR(keep(s.ln2, a.ln2.template data<T>(), N * C));
  MESHRUN_RETURN_IF_ERROR(TpAllReduce(dln, N * C));
  T* norm2 = stash + s.norms + (layer_norm ? 2 * C : C);
  MESHRUN_RETURN_IF_ERROR(NormBackward(l, 2, a, a.res2.template data<T>(), dres, dln, norm2,
                                       layer_norm ? norm2 + C : none));
  // Attention block: the output projection's output gradient is dres now.
  MESHRUN_RETURN_IF_ERROR(keep(s.dattn, dres, N * C));
  MESHRUN_RETURN_IF_ERROR(keep(s.atty, a.atty.template data<T>(), N * Cl));
  const std::string o = h + (llama ? "self_attn.o_proj.weight" : "attn.c_proj.weight");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, datty_.template data<T>(), none, none, dres,
                                              a.atty.template data<T>(), P(o), N, Cl, C,
                                              overwrite));
  MESHRUN_RETURN_IF_ERROR(AttentionBackward(a));
  const std::string qkv = h + (llama ? "self_attn.qkv." : "attn.c_attn.");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dln, none, none, dqkv_.template data<T>(),
                                              a.ln1.template data<T>(), P(qkv + "weight"), N, C,
                                              QkvWidth(), overwrite));
  MESHRUN_RETURN_IF_ERROR(keep(s.dqkv, dqkv_.template data<T>(), N * QkvWidth()));
  MESHRUN_RETURN_IF_ERROR(keep(s.ln1, a.ln1.template data<T>(), N * C));
  MESHRUN_RETURN_IF_ERROR(TpAllReduce(dln, N * C));
  T* norm1 = stash + s.norms;
  return NormBackward(l, 1, a, residual, dres, dln, norm1, layer_norm ? norm1 + C : none);
}

template <typename T>
Status GPT2<T>::BlockBackwardWeight(int l, int64_t N, const T* stash) {
  // The gradients BlockBackward computes beside the input gradient, from what B kept; the
  // weights are not read (MatmulBackward without dinp).
  const Device dev = cfg_.device;
  const int64_t C = cfg_.d_model, Cl = AttnWidth(), Fl = cfg_.ff() / cfg_.tp_size;
  const bool llama = cfg_.llama();  // the parameters' names
  const bool gated = cfg_.gated_mlp(), layer_norm = cfg_.family().norm == NormKind::kLayerNorm;
  const int64_t Gl = gated ? 2 * Fl : Fl;
  const LayerStash s = LayerStashLayout(N);
  T* const none = nullptr;
  const T* no_weight = nullptr;
  auto G = [&](const std::string& name) { return grad(*FindParam(name)); };
  auto Gopt = [&](const std::string& name) -> T* {
    const ParamInfo* p = FindParam(name);
    return p != nullptr ? grad(*p) : nullptr;
  };
  const std::string h = (llama ? "layers." : "h.") + std::to_string(cfg_.GlobalLayer(l)) + ".";
  // MLP block.
  if (!gated)
    MESHRUN_RETURN_IF_ERROR(ops::BiasBackward(dev, G(h + "mlp.c_proj.bias"), stash + s.dmlp, N, C));
  const std::string down = h + (gated ? "mlp.down_proj.weight" : "mlp.c_proj.weight");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, G(down), none, stash + s.dmlp,
                                              stash + s.act, no_weight, N, Fl, C));
  const std::string up = h + (gated ? "mlp.gate_up.weight" : "mlp.c_fc.weight");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, G(up),
                                              gated ? none : G(h + "mlp.c_fc.bias"), stash + s.dfc,
                                              stash + s.ln2, no_weight, N, C, Gl));
  const T* norms = stash + s.norms;
  if (!layer_norm) {
    MESHRUN_RETURN_IF_ERROR(
        ops::Accumulate(dev, G(h + "post_attention_layernorm.weight"), norms + C, C));
  } else {
    MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, G(h + "ln_2.weight"), norms + 2 * C, C));
    MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, G(h + "ln_2.bias"), norms + 3 * C, C));
  }
  // Attention block.
  if (cfg_.family().linear_biases)
    MESHRUN_RETURN_IF_ERROR(
        ops::BiasBackward(dev, G(h + "attn.c_proj.bias"), stash + s.dattn, N, C));
  const std::string o = h + (llama ? "self_attn.o_proj.weight" : "attn.c_proj.weight");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, G(o), none, stash + s.dattn,
                                              stash + s.atty, no_weight, N, Cl, C));
  const std::string qkv = h + (llama ? "self_attn.qkv." : "attn.c_attn.");
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, none, G(qkv + "weight"), Gopt(qkv + "bias"),
                                              stash + s.dqkv, stash + s.ln1, no_weight, N, C,
                                              QkvWidth()));
  if (!layer_norm) {
    return ops::Accumulate(dev, G(h + "input_layernorm.weight"), norms, C);
  }
  MESHRUN_RETURN_IF_ERROR(ops::Accumulate(dev, G(h + "ln_1.weight"), norms, C));
  return ops::Accumulate(dev, G(h + "ln_1.bias"), norms + C, C);
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
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun
