// The model on one rank, forward and backward in execution order (GPT-2 and the Llama family;
// its parameters and their layout are in gpt2_layout.cc).
#include "engine/model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/comm/communicator.h"
#include "engine/ops/ops.h"

namespace meshrun {

#if !MESHRUN_FLOAT64  // not a template: the product library holds it (element_type.h)
void DocumentStarts(const int32_t* inputs, int B, int Tn, int32_t eot, int32_t* starts) {
  for (int b = 0; b < B; ++b) {
    const int32_t* in = inputs + static_cast<int64_t>(b) * Tn;
    int32_t* out = starts + static_cast<int64_t>(b) * Tn;
    int32_t start = 0;
    for (int t = 0; t < Tn; ++t) {
      out[t] = start;
      if (in[t] == eot) start = t + 1;
    }
  }
}
#endif

template <typename T>
GPT2<T>::GPT2(GPT2Config cfg, bool own_storage)
    : cfg_(cfg), layout_(GPT2ParamLayout(cfg)), units_(GPT2Units(cfg, layout_)) {
  num_params_ = units_.back().offset + units_.back().padded;
  // Every parameter by its role and layer, once: the math below never looks a name up.
  layer_handles_.resize(static_cast<size_t>(cfg_.stage_layers()));
  for (const ParamInfo& p : layout_) {
    ParamHandles& h = p.layer < 0 ? outer_handles_ : layer_handles_[static_cast<size_t>(p.layer)];
    h.of[static_cast<size_t>(p.role)] = &p;
  }
  unit_params_.assign(units_.size(), nullptr);
  unit_grads_.assign(units_.size(), nullptr);
  if (!own_storage) return;
  {
    MemoryKindScope kind(MemoryKind::kParameters);
    params_ = Tensor::Zeros({num_params_}, ScalarTypeOf<T>(), cfg_.device);
  }
  {
    MemoryKindScope kind(MemoryKind::kGradients);
    grads_ = Tensor::Zeros({num_params_}, ScalarTypeOf<T>(), cfg_.device);
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    unit_params_[u] = params_.template data<T>() + units_[u].offset;
    unit_grads_[u] = grads_.template data<T>() + units_[u].offset;
  }
}

template <typename T>
const ParamInfo* GPT2<T>::FindParam(const std::string& name) const {
  for (const ParamInfo& p : layout_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

template <typename T>
const ParamInfo& GPT2<T>::HeadParam() const {
  const ParamRole r = cfg_.tie_embeddings ? ParamRole::kTokenEmbedding : ParamRole::kHead;
  return *outer_handles_[r];
}

template <typename T>
void GPT2<T>::InitDeterministic(uint64_t seed) {
  if (cfg_.device.type == DeviceType::kCount) return;  // no values there to set
  const bool on_host = cfg_.device.type == DeviceType::kCpu;
  std::vector<T> host;
  for (const ParamInfo& p : layout_) {
    // Computed on the host; a device copy follows (a device failure is sticky and surfaces at
    // the next op).
    if (!on_host) host.resize(static_cast<size_t>(p.numel));
    T* dst = on_host ? param(p) : host.data();
    if (p.init_std == 0.0) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<T>(p.init_value);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) {
        dst[i] = static_cast<T>(p.init_std * InitNormal(seed, p.name, GlobalIndex(p, i)));
      }
    }
    if (!on_host) (void)ops::CopyFromHost(cfg_.device, param(p), dst, sizeof(T) * p.numel);
  }
}

template <typename T>
void GPT2<T>::ZeroGrad() {
  if (owns_storage()) (void)ops::Zero(cfg_.device, grads_data(), sizeof(T) * num_params_);
}

template <typename T>
Status GPT2<T>::Upload(Tensor& dst, const int32_t* host, int64_t n) {
  if (!dst.defined() || dst.numel() < n) {
    // Host-side values mirrored on the device (ids, positions): "other", outside the memory
    // model's kinds, as they were when they lived on the host.
    MemoryKindScope kind(MemoryKind::kOther);
    dst = Tensor::Empty({std::max<int64_t>(n, 1)}, ScalarType::kInt32, cfg_.device);
  }
  return ops::CopyFromHost(cfg_.device, dst.raw(), host, sizeof(int32_t) * n);
}

template <typename T>
void GPT2<T>::EnsureActivations(int B, int Tn) {
  B_ = B;
  T_ = Tn;
  const int64_t N = static_cast<int64_t>(B) * T_;
  if (N <= capacity_tokens_) return;
  capacity_tokens_ = static_cast<int>(N);
  // Free sets of the old shapes (PrepareBatch refuses to grow while forwards are kept).
  layers_free_.clear();
  encoded_free_.clear();
  MemoryKindScope kind(MemoryKind::kActivations);
  const int64_t C = cfg_.d_model, V = cfg_.vocab_rows(), Hl = cfg_.n_head / cfg_.tp_size,
                Cl = AttnWidth(), Fl = cfg_.ff() / cfg_.tp_size, Wl = QkvWidth(),
                Gl = cfg_.gated_mlp() ? 2 * Fl : Fl;  // fc output: gate|up
  // RMSNorm keeps no mean.
  const bool llama = cfg_.family().norm != NormKind::kLayerNorm;
  const ScalarType dt = ScalarTypeOf<T>();
  const Device dev = cfg_.device;
  auto empty = [&](std::vector<int64_t> shape) { return Tensor::Empty(std::move(shape), dt, dev); };
  encoded_ = empty({N, C});
  lnf_ = empty({N, C});
  lnf_mean_ = empty({llama ? 0 : N});
  lnf_rstd_ = empty({N});
  head_rows_ = HeadChunkRows(N, V);
  // Only the last pipeline stage computes the head.
  head_logits_ = cfg_.stage_last ? empty({head_rows_, V}) : Tensor();
  logits_ = Tensor();  // the whole logits only for Forward() (allocated there)
  losses_ = empty({N});
  // One layer's full set of activations.
  auto allocate = [&](LayerActs& a) {
    a.ln1 = empty({N, C});
    a.ln1_mean = empty({llama ? 0 : N});  // RMSNorm keeps no mean
    a.ln1_rstd = empty({N});
    a.q = empty({N, Cl});
    a.k = empty({N, Cl});
    a.v = empty({N, Cl});
    a.att = empty({N, Cl});
    a.lse = empty({N * Hl});
    a.atty = empty({N, Cl});
    a.res2 = empty({N, C});
    a.ln2 = empty({N, C});
    a.ln2_mean = empty({llama ? 0 : N});
    a.ln2_rstd = empty({N});
    a.fch = empty({N, Gl});
    a.fch_gelu = empty({N, Fl});
    a.res3 = empty({N, C});
  };
  acts_.clear();
  acts_.resize(cfg_.stage_layers());
  work_ = LayerActs();
  if (cfg_.recompute == Recompute::kNone) {
    for (LayerActs& a : acts_) allocate(a);
  } else {
    allocate(work_);
    const bool full = cfg_.recompute == Recompute::kFull;
    for (LayerActs& a : acts_) {
      a = work_;  // every tensor a view of the shared set, then the kept ones of its own
      a.res3 = empty({N, C});
      if (full) continue;
      a.res2 = empty({N, C});
      a.q = empty({N, Cl});
      a.k = empty({N, Cl});
      a.v = empty({N, Cl});
      a.fch = empty({N, Gl});
    }
    // Context parallel (allgather): every rank's K and V are gathered again on recompute.
    const Communicator* cp = par_ != nullptr ? par_->cp : nullptr;
    if (cp != nullptr && cp->size() > 1 && !par_->cp_ring) {
      const int64_t all = static_cast<int64_t>(cp->size()) * N * Cl;
      work_.k_all = empty({all});
      work_.v_all = empty({all});
      for (LayerActs& a : acts_) {
        a.k_all = work_.k_all;
        a.v_all = work_.v_all;
      }
    }
  }
  MemoryKindScope scratch(MemoryKind::kActivations);
  qkv_ = empty({N, Wl});
  dres_ = empty({N, C});
  dln_ = empty({N, C});
  dqkv_ = empty({N, Wl});
  dq_ = empty({N, Cl});
  dk_ = empty({N, Cl});
  dv_ = empty({N, Cl});
  datt_ = empty({N, Cl});
  datty_ = empty({N, Cl});
  dfch_ = empty({N, Gl});
  dfch_gelu_ = empty({N, Fl});
}

template <typename T>
Status GPT2<T>::Hook(int which, int unit) {
  if (par_ == nullptr || par_->fsdp == nullptr) return OkStatus();
  switch (which) {
    case kBeforeForward: return par_->fsdp->BeforeForward(unit);
    case kAfterForward: return par_->fsdp->AfterForward(unit);
    case kBeforeBackward: return par_->fsdp->BeforeBackward(unit);
    case kBeforeInputGrad: return par_->fsdp->BeforeInputGrad(unit);
    case kAfterInputGrad: return par_->fsdp->AfterInputGrad(unit);
    case kBeforeWeightGrad: return par_->fsdp->BeforeWeightGrad(unit);
    case kAfterWeightGrad: return par_->fsdp->AfterWeightGrad(unit);
    default: return par_->fsdp->AfterBackward(unit);
  }
}

template <typename T>
Status GPT2<T>::TpAfterMatmul(ParamRole r, T* out, int64_t count) {
  return TpSplitOf(r) == TpSplit::kRow ? TpAllReduce(out, count) : OkStatus();
}

template <typename T>
Status GPT2<T>::TpAfterMatmulInputGrad(ParamRole r, T* dinp, int64_t count) {
  const TpSplit split = TpSplitOf(r);
  return split == TpSplit::kColumn || split == TpSplit::kVocab ? TpAllReduce(dinp, count)
                                                               : OkStatus();
}

template <typename T>
Status GPT2<T>::TpAfterLookup(ParamRole r, T* out, int64_t count) {
  return TpSplitOf(r) == TpSplit::kVocab ? TpAllReduce(out, count) : OkStatus();
}

template <typename T>
Status GPT2<T>::TpAllReduce(T* data, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->tp != nullptr && par_->tp->size() > 1) {
      return par_->tp->AllReduce(data, static_cast<size_t>(count),
                                 CallOptions::Axis(MeshAxis::kTp));
    }
  }
  return OkStatus();
}

template <typename T>
Status GPT2<T>::Forward(const int32_t* inputs, int B, int Tn, const int32_t* positions) {
  if (cfg_.tp_size > 1) {
    return FailedPreconditionError("the whole logits need the whole vocabulary: tp_size 1 only");
  }
  MESHRUN_RETURN_IF_ERROR(ForwardTrunk(inputs, B, Tn, positions));
  const int64_t N = static_cast<int64_t>(B) * Tn, C = cfg_.d_model, V = cfg_.vocab_size;
  if (!logits_.defined() || logits_.numel() < N * V) {
    MemoryKindScope kind(MemoryKind::kActivations);
    logits_ = Tensor::Empty({N, V}, ScalarTypeOf<T>(), cfg_.device);
  }
  return ops::MatmulForward(cfg_.device, logits_.template data<T>(), lnf_.template data<T>(),
                            param(HeadParam()), static_cast<const T*>(nullptr), N, C, V);
}

template <typename T>
Status GPT2<T>::PrepareRope() {
  // Llama's rotary frequencies, as transformers computes them in float32: inv_freq[i] =
  // theta^(−2i/D), rescaled by llama3's rule, then angle = position·inv_freq.
  const int64_t D = cfg_.head_dim(), half = D / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    inv[i] = 1.0f / std::pow(static_cast<float>(cfg_.rope_theta), expo);
  }
  if (cfg_.rope_scaling.llama3) {
    const RopeScaling& r = cfg_.rope_scaling;
    const double orig = r.original_max_position_embeddings;
    const double low_wavelen = orig / r.low_freq_factor, high_wavelen = orig / r.high_freq_factor;
    for (int64_t i = 0; i < half; ++i) {
      const float f = inv[i];
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      if (wavelen > low_wavelen) {
        inv[i] = f / static_cast<float>(r.factor);
      } else if (wavelen >= high_wavelen) {
        const float smooth = static_cast<float>((orig / wavelen - r.low_freq_factor) /
                                                (r.high_freq_factor - r.low_freq_factor));
        inv[i] = (1.0f - smooth) * f / static_cast<float>(r.factor) + smooth * f;
      }
    }
  }
  // [cos (rows, D/2) | sin (rows, D/2)], computed on the host, then on the model's device: one
  // row per local position, or with documents one per token (B·T, positions from the
  // document's start).
  const int64_t rows = row_rope_ ? static_cast<int64_t>(B_) * T_ : T_;
  const int64_t n = rows * half;
  rope_host_.resize(static_cast<size_t>(2 * n));
  // The counting device takes no values: only the table's buffer below counts.
  for (int64_t t = 0; t < rows && cfg_.device.type != DeviceType::kCount; ++t) {
    const int32_t pos = row_rope_ ? row_positions_[t] : seq_positions_[t];
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];
      rope_host_[t * half + i] = static_cast<T>(std::cos(angle));
      rope_host_[n + t * half + i] = static_cast<T>(std::sin(angle));
    }
  }
  if (!rope_.defined() || rope_.numel() < 2 * n) {
    MemoryKindScope kind(MemoryKind::kOther);  // a host table mirrored (see Upload)
    rope_ = Tensor::Empty({std::max<int64_t>(2 * n, 1)}, ScalarTypeOf<T>(), cfg_.device);
  }
  return ops::CopyFromHost(cfg_.device, rope_.raw(), rope_host_.data(), sizeof(T) * 2 * n);
}

template <typename T>
Status GPT2<T>::PrepareBatch(const int32_t* inputs, int B, int Tn, const int32_t* positions) {
  const int64_t N = static_cast<int64_t>(B) * Tn;
  if (N > capacity_tokens_ && !kept_.empty()) {
    return FailedPreconditionError("a batch of " + std::to_string(N) + " tokens while " +
                                   std::to_string(kept_.size()) + " forwards of at most " +
                                   std::to_string(capacity_tokens_) +
                                   " are kept for their backward");
  }
  EnsureActivations(B, Tn);
  // The batch's token ids and positions on the model's device (every call: the shape may
  // shrink and grow again, and every row is refilled).
  MESHRUN_RETURN_IF_ERROR(Upload(tokens_, inputs, N));
  seq_positions_.resize(Tn);
  for (int t = 0; t < Tn; ++t) seq_positions_[t] = positions ? positions[t] : t;
  // Documents (SetDocumentStarts, this forward only): each row's position counts from its
  // document's start, and its queries see nothing before it.
  const std::vector<int32_t> docs = std::move(doc_starts_);
  doc_starts_.clear();
  if (!docs.empty() && static_cast<int64_t>(docs.size()) != N) {
    return InvalidArgumentError("document starts for " + std::to_string(docs.size()) +
                                " tokens, the batch has " + std::to_string(N));
  }
  row_positions_.resize(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    row_positions_[i] = seq_positions_[i % Tn] - (docs.empty() ? 0 : docs[i]);
  }
  MESHRUN_RETURN_IF_ERROR(Upload(seq_positions_dev_, seq_positions_.data(), Tn));
  MESHRUN_RETURN_IF_ERROR(Upload(positions_, row_positions_.data(), N));
  // The first key position each query sees: its window's and its document's start.
  has_q_lo_ = !docs.empty() || cfg_.sliding_window > 0;
  if (has_q_lo_) {
    std::vector<int32_t> lo(static_cast<size_t>(N), std::numeric_limits<int32_t>::min());
    for (int64_t i = 0; i < N; ++i) {
      if (!docs.empty()) lo[i] = docs[i];
      if (cfg_.sliding_window > 0) {
        lo[i] = std::max(lo[i], seq_positions_[i % Tn] - cfg_.sliding_window + 1);
      }
    }
    MESHRUN_RETURN_IF_ERROR(Upload(q_lo_, lo.data(), N));
  }
  row_rope_ = !docs.empty();
  if (!cfg_.family().learned_positions) MESHRUN_RETURN_IF_ERROR(PrepareRope());
  return PrepareCpPositions();
}

template <typename T>
Status GPT2<T>::ForwardTrunk(const int32_t* inputs, int B, int Tn, const int32_t* positions,
                             const T* stage_input) {
  MESHRUN_RETURN_IF_ERROR(PrepareBatch(inputs, B, Tn, positions));
  const Device dev = cfg_.device;
  const int64_t N = static_cast<int64_t>(B) * Tn, C = cfg_.d_model;
  // The active chunk's layers [lb, le) (every layer of a whole model).
  const auto [lb, le] = ChunkLayers();
  const bool first = ChunkFirst(), last_chunk = ChunkLast();
  kept_output_ = nullptr;
  MESHRUN_RETURN_IF_ERROR(EnsureChunkActivations());

  using R = ParamRole;
  T* x = encoded_.template data<T>();
  if (ChunkUsesEmbedding()) MESHRUN_RETURN_IF_ERROR(Hook(kBeforeForward, 0));
  if (first) {
    // The token embedding is vocab-parallel: each tp rank adds its rows, the all-reduce sums
    // them.
    MESHRUN_RETURN_IF_ERROR(ops::EmbeddingRowsForward(dev, x, tokens_data(),
                                                      W(-1, R::kTokenEmbedding), cfg_.vocab_first(),
                                                      cfg_.vocab_rows(), N, C));
    MESHRUN_RETURN_IF_ERROR(TpAfterLookup(R::kTokenEmbedding, x, N * C));
    if (cfg_.family().embedding_scale) {  // × √d_model, rounded to the compute dtype (Gemma)
      MESHRUN_RETURN_IF_ERROR(ops::Scale(
          dev, x, N * C, static_cast<double>(static_cast<T>(std::sqrt(static_cast<double>(C))))));
    }
    if (cfg_.family().learned_positions)
      MESHRUN_RETURN_IF_ERROR(
          ops::AddRows(dev, x, W(-1, R::kPositionEmbedding), positions_data(), N, C));
  } else {
    // A later pipeline stage starts from the previous stage's output.
    if (stage_input == nullptr) return InvalidArgumentError("pipeline stage without its input");
    MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, x, stage_input, sizeof(T) * N * C));
  }
  for (int l = lb; l < le; ++l) {
    MESHRUN_RETURN_IF_ERROR(Hook(kBeforeForward, 1 + l));
    MESHRUN_RETURN_IF_ERROR(BlockForward(l, l == lb ? x : acts_[l - 1].res3.template data<T>()));
    MESHRUN_RETURN_IF_ERROR(Hook(kAfterForward, 1 + l));
  }
  if (!last_chunk) return OkStatus();
  const int L = cfg_.stage_layers();
  MESHRUN_RETURN_IF_ERROR(Hook(kBeforeForward, L + 1));
  const T* last = le > lb ? acts_[le - 1].res3.template data<T>() : x;
  return NormForwardOp(lnf_.template data<T>(), lnf_mean_.template data<T>(),
                       lnf_rstd_.template data<T>(), last, -1, 0);
}

template <typename T>
std::pair<ParamRole, ParamRole> GPT2<T>::NormRoles(int l, int which) {
  if (l < 0) return {ParamRole::kFinalNormWeight, ParamRole::kFinalNormBias};
  if (which == 1) return {ParamRole::kNorm1Weight, ParamRole::kNorm1Bias};
  return {ParamRole::kNorm2Weight, ParamRole::kNorm2Bias};
}

template <typename T>
StatusOr<const T*> GPT2<T>::NormWeight(const T* w) {
  if (cfg_.family().norm != NormKind::kRMSNormOnePlus) return w;
  const int64_t C = cfg_.d_model;
  if (!norm_weight_.defined()) {
    MemoryKindScope kind(MemoryKind::kActivations);
    norm_weight_ = Tensor::Empty({C}, ScalarTypeOf<T>(), cfg_.device);
  }
  T* out = norm_weight_.template data<T>();
  MESHRUN_RETURN_IF_ERROR(ops::Fill(cfg_.device, out, 1.0, C));
  MESHRUN_RETURN_IF_ERROR(ops::Accumulate(cfg_.device, out, w, C));
  return static_cast<const T*>(out);
}

template <typename T>
Status GPT2<T>::NormForwardOp(T* out, T* mean, T* rstd, const T* inp, int l, int which) {
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model;
  const auto [weight, bias] = NormRoles(l, which);
  if (cfg_.family().norm == NormKind::kLayerNorm) {
    return ops::LayerNormForward(cfg_.device, out, mean, rstd, inp, W(l, weight), W(l, bias), N, C,
                                 cfg_.ln_eps);
  }
  MESHRUN_ASSIGN_OR_RETURN(const T* w, NormWeight(W(l, weight)));
  return ops::RMSNormForward(cfg_.device, out, rstd, inp, w, N, C, cfg_.ln_eps);
}

template <typename T>
Status GPT2<T>::NormBackwardOp(T* dinp, const T* dout, const T* inp, const T* mean, const T* rstd,
                               int l, int which, T* dweight, T* dbias) {
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model;
  const auto [weight, bias] = NormRoles(l, which);
  // Zero-bubble's B sends the parameter gradients to its stash (dweight, dbias) when given.
  if (cfg_.family().norm == NormKind::kLayerNorm) {
    return ops::LayerNormBackward(cfg_.device, dinp, dweight ? dweight : Grad(l, weight),
                                  dweight ? dbias : Grad(l, bias), dout, inp, W(l, weight), mean,
                                  rstd, N, C);
  }
  // ∂/∂w of x̂·(1 + w) is ∂/∂w of x̂·w: the gradient lands on w as it is stored.
  MESHRUN_ASSIGN_OR_RETURN(const T* w, NormWeight(W(l, weight)));
  return ops::RMSNormBackward(cfg_.device, dinp, dweight ? dweight : Grad(l, weight), dout, inp, w,
                              rstd, N, C);
}

template <typename T>
Status GPT2<T>::GatedForward(T* out, const T* gate_up, int64_t N, int64_t F) {
  if (cfg_.family().mlp == MlpKind::kGeGLU) {
    return ops::GeGLUForward(cfg_.device, out, gate_up, N, F);
  }
  return ops::SwiGLUForward(cfg_.device, out, gate_up, N, F);
}

template <typename T>
Status GPT2<T>::GatedBackward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t F) {
  if (cfg_.family().mlp == MlpKind::kGeGLU) {
    return ops::GeGLUBackward(cfg_.device, dgate_up, gate_up, dout, N, F);
  }
  return ops::SwiGLUBackward(cfg_.device, dgate_up, gate_up, dout, N, F);
}

template <typename T>
Status GPT2<T>::Norm(int l, int which, LayerActs& a, const T* inp) {
  // which 1: before attention, 2: before the MLP.
  Tensor& out = which == 1 ? a.ln1 : a.ln2;
  Tensor& mean = which == 1 ? a.ln1_mean : a.ln2_mean;
  Tensor& rstd = which == 1 ? a.ln1_rstd : a.ln2_rstd;
  return NormForwardOp(out.template data<T>(), mean.template data<T>(), rstd.template data<T>(),
                       inp, l, which);
}

template <typename T>
Status GPT2<T>::NormBackward(int l, int which, LayerActs& a, const T* inp, T* dinp, const T* dout,
                             T* dweight, T* dbias) {
  const Tensor& mean = which == 1 ? a.ln1_mean : a.ln2_mean;
  const Tensor& rstd = which == 1 ? a.ln1_rstd : a.ln2_rstd;
  return NormBackwardOp(dinp, dout, inp, mean.template data<T>(), rstd.template data<T>(), l, which,
                        dweight, dbias);
}

template <typename T>
Status GPT2<T>::BlockForward(int l, const T* residual) {
  const Device dev = cfg_.device;
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model, Cl = AttnWidth(),
                Fl = cfg_.ff() / cfg_.tp_size;
  const T* none = nullptr;
  using R = ParamRole;
  LayerActs& a = acts_[l];
  // Attention block: qkv is column parallel (this rank's heads), the output projection row
  // parallel.
  MESHRUN_RETURN_IF_ERROR(Norm(l, 1, a, residual));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulForward(dev, qkv_.template data<T>(), a.ln1.template data<T>(),
                                             W(l, R::kQkvWeight), W(l, R::kQkvBias), N, C,
                                             QkvWidth()));
  MESHRUN_RETURN_IF_ERROR(AttentionForward(a));
  T* attproj = dln_.template data<T>();  // scratch: attproj is not needed for backward
  MESHRUN_RETURN_IF_ERROR(ops::MatmulForward(dev, attproj, a.atty.template data<T>(),
                                             W(l, R::kOutWeight), none, N, Cl, C));
  MESHRUN_RETURN_IF_ERROR(TpAfterMatmul(R::kOutWeight, attproj, N * C));
  if (const T* bias = W(l, R::kOutBias); bias != nullptr) {
    MESHRUN_RETURN_IF_ERROR(ops::AddBias(dev, attproj, bias, N, C));
  }
  MESHRUN_RETURN_IF_ERROR(
      ops::ResidualForward(dev, a.res2.template data<T>(), residual, attproj, N * C));
  // MLP block: fc (gate|up) column parallel, proj (down) row parallel.
  MESHRUN_RETURN_IF_ERROR(Norm(l, 2, a, a.res2.template data<T>()));
  T* fcproj = dln_.template data<T>();
  // fc is gate|up (2·Fl rows, no bias) under a gated MLP, else Fl rows and GPT-2's bias (a role
  // the architecture lacks reads null); the row-parallel proj's bias is added after the sum.
  const bool gated = cfg_.gated_mlp();
  MESHRUN_RETURN_IF_ERROR(ops::MatmulForward(dev, a.fch.template data<T>(),
                                             a.ln2.template data<T>(), W(l, R::kUpWeight),
                                             W(l, R::kUpBias), N, C, gated ? 2 * Fl : Fl));
  if (gated) {
    MESHRUN_RETURN_IF_ERROR(
        GatedForward(a.fch_gelu.template data<T>(), a.fch.template data<T>(), N, Fl));
  } else {
    MESHRUN_RETURN_IF_ERROR(
        ops::GeluForward(dev, a.fch_gelu.template data<T>(), a.fch.template data<T>(), N * Fl));
  }
  MESHRUN_RETURN_IF_ERROR(ops::MatmulForward(dev, fcproj, a.fch_gelu.template data<T>(),
                                             W(l, R::kDownWeight), none, N, Fl, C));
  MESHRUN_RETURN_IF_ERROR(TpAfterMatmul(R::kDownWeight, fcproj, N * C));
  if (const T* bias = W(l, R::kDownBias); bias != nullptr) {
    MESHRUN_RETURN_IF_ERROR(ops::AddBias(dev, fcproj, bias, N, C));
  }
  return ops::ResidualForward(dev, a.res3.template data<T>(), a.res2.template data<T>(), fcproj,
                              N * C);
}

template <typename T>
Status GPT2<T>::RecomputeBlock(int l, const T* residual) {
  switch (cfg_.recompute) {
    case Recompute::kNone: return OkStatus();
    case Recompute::kFull: {
      // The kept output is written again with the same values (the same kernels on the same
      // inputs); the shared tensors now hold this block's activations.
      return BlockForward(l, residual);
    }
    case Recompute::kSelective: break;
  }
  const int64_t N = static_cast<int64_t>(B_) * T_, Fl = cfg_.ff() / cfg_.tp_size;
  LayerActs& a = acts_[l];
  MESHRUN_RETURN_IF_ERROR(Norm(l, 1, a, residual));
  MESHRUN_RETURN_IF_ERROR(AttentionForward(a, /*split_qkv=*/false));
  MESHRUN_RETURN_IF_ERROR(Norm(l, 2, a, a.res2.template data<T>()));
  if (cfg_.gated_mlp()) {
    return GatedForward(a.fch_gelu.template data<T>(), a.fch.template data<T>(), N, Fl);
  }
  return ops::GeluForward(cfg_.device, a.fch_gelu.template data<T>(), a.fch.template data<T>(),
                          N * Fl);
}

template <typename T>
StatusOr<double> GPT2<T>::HeadLoss(const int32_t* host_targets, bool with_grad, double grad_scale) {
  const Device dev = cfg_.device;
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model, V = cfg_.vocab_rows();
  const int64_t first = cfg_.vocab_first();
  const ParamInfo& head = HeadParam();
  const T* w = param(head);
  T* dw = with_grad ? grad(head) : nullptr;
  T* losses = losses_.template data<T>();
  T* logits = head_logits_.template data<T>();
  const T* lnf = lnf_.template data<T>();
  MESHRUN_RETURN_IF_ERROR(Upload(targets_, host_targets, N));
  const int32_t* targets = targets_.template data<int32_t>();
  if (with_grad) MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dln_.raw(), dln_.nbytes()));
  Communicator* tp = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (par_ != nullptr && par_->tp != nullptr && par_->tp->size() > 1) tp = par_->tp;
  }
  // One chunk of rows at a time: logits, cross-entropy (dlogits written over the logits), and
  // with a backward to follow, the head's two gradients right away.
  for (int64_t r0 = 0; r0 < N; r0 += head_rows_) {
    const int64_t rows = std::min(head_rows_, N - r0);
    MESHRUN_RETURN_IF_ERROR(ops::MatmulForward(dev, logits, lnf + r0 * C, w,
                                               static_cast<const T*>(nullptr), rows, C, V));
    if (tp == nullptr) {
      MESHRUN_RETURN_IF_ERROR(
          ops::SoftmaxCrossEntropy(dev, losses + r0, with_grad ? logits : static_cast<T*>(nullptr),
                                   logits, targets + r0, rows, V, grad_scale));
    } else if constexpr (std::is_same_v<T, float>) {
      // Vocab-parallel cross-entropy: every rank's {log-sum-exp, target logit} per row, gathered
      // (one all-gather of 2 floats per row), give the loss over the whole vocabulary.
      const int n = tp->size();
      {
        MemoryKindScope kind(MemoryKind::kOther);  // 2 floats a row (see Upload)
        if (!head_stats_.defined() || head_stats_.numel() < 2 * rows) {
          head_stats_ = Tensor::Empty({2 * rows}, ScalarTypeOf<T>(), dev);
          head_all_stats_ = Tensor::Empty({2 * rows * n}, ScalarTypeOf<T>(), dev);
          head_lse_ = Tensor::Empty({rows}, ScalarTypeOf<T>(), dev);
        }
      }
      T* stats = head_stats_.template data<T>();
      T* all_stats = head_all_stats_.template data<T>();
      T* lse = head_lse_.template data<T>();
      MESHRUN_RETURN_IF_ERROR(
          ops::VocabShardStats(dev, stats, logits, targets + r0, first, rows, V));
      MESHRUN_RETURN_IF_ERROR(tp->AllGather(stats, all_stats, static_cast<size_t>(2 * rows),
                                            CallOptions::Axis(MeshAxis::kTp)));
      MESHRUN_RETURN_IF_ERROR(
          ops::VocabShardLoss(dev, losses + r0, lse, all_stats, targets + r0, n, rows));
      if (with_grad) {
        MESHRUN_RETURN_IF_ERROR(ops::VocabShardGrad(dev, logits, logits, lse, targets + r0, first,
                                                    rows, V, grad_scale));
      }
    }
    if (with_grad) {
      MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dln_.template data<T>() + r0 * C, dw,
                                                  static_cast<T*>(nullptr), logits, lnf + r0 * C, w,
                                                  rows, C, V));
    }
  }
  // Each rank's head saw only its vocabulary rows: the input gradient is their sum.
  if (with_grad) {
    MESHRUN_RETURN_IF_ERROR(
        TpAfterMatmulInputGrad(cfg_.tie_embeddings ? ParamRole::kTokenEmbedding : ParamRole::kHead,
                               dln_.template data<T>(), N * C));
  }
  return ops::Sum(dev, losses, N);
}

template <typename T>
StatusOr<double> GPT2<T>::ForwardLoss(const int32_t* inputs, const int32_t* targets, int B, int Tn,
                                      const int32_t* positions) {
  MESHRUN_RETURN_IF_ERROR(ForwardTrunk(inputs, B, Tn, positions));
  return HeadLoss(targets, /*with_grad=*/false, 0.0);
}

template <typename T>
StatusOr<double> GPT2<T>::ForwardBackward(const int32_t* inputs, const int32_t* targets, int B,
                                          int Tn, double grad_scale, const int32_t* positions) {
  return StageForwardBackward(inputs, nullptr, targets, nullptr, B, Tn, grad_scale, positions);
}

template <typename T>
Status GPT2<T>::StageForward(const int32_t* inputs, const T* stage_input, int B, int Tn,
                             const int32_t* positions, int keep_key) {
  if (keep_key >= 0) {
    if (cfg_.recompute != Recompute::kNone) {
      return FailedPreconditionError(
          "a kept forward under activation checkpointing (its backward recomputes)");
    }
    if (ChunkLast()) return FailedPreconditionError("the last chunk's forward is its backward's");
    for (const KeptForward& k : kept_) {
      if (k.key == keep_key) {
        return FailedPreconditionError("forward " + std::to_string(keep_key) +
                                       " kept twice before its backward");
      }
    }
  }
  MESHRUN_RETURN_IF_ERROR(ForwardTrunk(inputs, B, Tn, positions, stage_input));
  if (keep_key < 0) return OkStatus();
  // The forward's tensors go to the kept set. The chunk's layers are left without activations
  // until its next forward or backward needs them (EnsureChunkActivations, or the backward's
  // set swapped in), so a stage holds as many layer sets as forwards kept at once; the input
  // (encoded_, shared by the chunks) is replaced at once by a free one.
  KeptForward k;
  k.key = keep_key;
  k.chunk = chunk_;
  const auto [lb, le] = ChunkLayers();
  k.layers.resize(static_cast<size_t>(le - lb));
  for (int l = lb; l < le; ++l) std::swap(k.layers[static_cast<size_t>(l - lb)], acts_[l]);
  k.encoded = encoded_;
  if (!encoded_free_.empty()) {
    encoded_ = encoded_free_.back();
    encoded_free_.pop_back();
  } else {
    MemoryKindScope kind(MemoryKind::kActivations);
    encoded_ = Tensor::Empty(k.encoded.shape(), k.encoded.dtype(), k.encoded.device());
  }
  kept_output_ = le > lb ? k.layers.back().res3.template data<T>() : k.encoded.template data<T>();
  kept_.push_back(std::move(k));
  return OkStatus();
}

template <typename T>
Status GPT2<T>::EnsureChunkActivations() {
  const auto [lb, le] = ChunkLayers();
  if (le <= lb || acts_[lb].res3.defined()) return OkStatus();
  if (layers_free_.size() < static_cast<size_t>(cfg_.num_chunks())) {
    layers_free_.resize(static_cast<size_t>(cfg_.num_chunks()));
  }
  std::vector<std::vector<LayerActs>>& pool = layers_free_[static_cast<size_t>(chunk_)];
  if (!pool.empty()) {
    for (int l = lb; l < le; ++l) std::swap(acts_[l], pool.back()[static_cast<size_t>(l - lb)]);
    pool.pop_back();
    return OkStatus();
  }
  // A new set, shaped as one the chunk keeps (its layers are empty only while one is kept).
  auto kept = std::find_if(kept_.begin(), kept_.end(),
                           [&](const KeptForward& k) { return k.chunk == chunk_; });
  if (kept == kept_.end()) {
    return InternalError("chunk " + std::to_string(chunk_) +
                         " has no activations and keeps no forward");
  }
  MemoryKindScope kind(MemoryKind::kActivations);
  auto like = [](const Tensor& t) {
    return t.defined() ? Tensor::Empty(t.shape(), t.dtype(), t.device()) : Tensor();
  };
  for (int l = lb; l < le; ++l) {
    const LayerActs& a = kept->layers[static_cast<size_t>(l - lb)];
    LayerActs& b = acts_[l];
    for (auto [to, from] : {std::pair{&b.ln1, &a.ln1},
                            {&b.ln1_mean, &a.ln1_mean},
                            {&b.ln1_rstd, &a.ln1_rstd},
                            {&b.q, &a.q},
                            {&b.k, &a.k},
                            {&b.v, &a.v},
                            {&b.att, &a.att},
                            {&b.lse, &a.lse},
                            {&b.atty, &a.atty},
                            {&b.res2, &a.res2},
                            {&b.ln2, &a.ln2},
                            {&b.ln2_mean, &a.ln2_mean},
                            {&b.ln2_rstd, &a.ln2_rstd},
                            {&b.fch, &a.fch},
                            {&b.fch_gelu, &a.fch_gelu},
                            {&b.res3, &a.res3},
                            {&b.k_all, &a.k_all},
                            {&b.v_all, &a.v_all}}) {
      *to = like(*from);
    }
  }
  return OkStatus();
}

template <typename T>
const T* GPT2<T>::stage_output() const {
  if (kept_output_ != nullptr) return kept_output_;
  const auto [lb, le] = ChunkLayers();
  return le > lb ? acts_[le - 1].res3.template data<T>() : encoded_.template data<T>();
}

template <typename T>
StatusOr<double> GPT2<T>::StageForwardLoss(const int32_t* inputs, const T* stage_input,
                                           const int32_t* targets, int B, int Tn,
                                           const int32_t* positions) {
  MESHRUN_RETURN_IF_ERROR(ForwardTrunk(inputs, B, Tn, positions, stage_input));
  return HeadLoss(targets, /*with_grad=*/false, 0.0);
}

template <typename T>
StatusOr<double> GPT2<T>::StageForwardBackward(const int32_t* inputs, const T* stage_input,
                                               const int32_t* targets, const T* output_grad, int B,
                                               int Tn, double grad_scale, const int32_t* positions,
                                               int kept_key) {
  if (kept_key < 0) {
    MESHRUN_RETURN_IF_ERROR(ForwardTrunk(inputs, B, Tn, positions, stage_input));
  } else {
    // The kept forward's activations back in place, and what PrepareBatch leaves on the device
    // (positions, masks, token ids) for this micro-batch again; its set is then free.
    auto it = std::find_if(kept_.begin(), kept_.end(),
                           [&](const KeptForward& k) { return k.key == kept_key; });
    if (it == kept_.end() || it->chunk != chunk_) {
      return FailedPreconditionError("the backward of forward " + std::to_string(kept_key) +
                                     " of chunk " + std::to_string(chunk_) +
                                     ", which was not kept");
    }
    MESHRUN_RETURN_IF_ERROR(PrepareBatch(inputs, B, Tn, positions));
    kept_output_ = nullptr;
    const auto [lb, le] = ChunkLayers();
    if (le > lb && acts_[lb].res3.defined()) {  // the chunk's current set is free now
      if (layers_free_.size() < static_cast<size_t>(cfg_.num_chunks())) {
        layers_free_.resize(static_cast<size_t>(cfg_.num_chunks()));
      }
      std::vector<LayerActs> free(static_cast<size_t>(le - lb));
      for (int l = lb; l < le; ++l) std::swap(free[static_cast<size_t>(l - lb)], acts_[l]);
      layers_free_[static_cast<size_t>(chunk_)].push_back(std::move(free));
    }
    for (int l = lb; l < le; ++l) std::swap(acts_[l], it->layers[static_cast<size_t>(l - lb)]);
    encoded_free_.push_back(encoded_);
    encoded_ = it->encoded;
    kept_.erase(it);
  }
  // The head's backward runs with its forward, chunk by chunk: units 0 and L+1 (still gathered
  // from the forward) get their gradient buffers first.
  if (ChunkUsesEmbedding()) MESHRUN_RETURN_IF_ERROR(Hook(kBeforeBackward, 0));
  double loss = 0;
  if (ChunkLast()) {
    MESHRUN_RETURN_IF_ERROR(Hook(kBeforeBackward, cfg_.stage_layers() + 1));
    MESHRUN_ASSIGN_OR_RETURN(loss, HeadLoss(targets, /*with_grad=*/true, grad_scale));
  } else if (output_grad == nullptr) {
    return InvalidArgumentError("pipeline stage without the gradient of its output");
  }
  MESHRUN_RETURN_IF_ERROR(Backward(ChunkLast() ? nullptr : output_grad));
  return loss;
}

template <typename T>
Status GPT2<T>::Backward(const T* output_grad) {
  const Device dev = cfg_.device;
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model;
  const int L = cfg_.stage_layers();
  const auto [lb, le] = ChunkLayers();
  const bool last_chunk = ChunkLast();
  T* dres = dres_.template data<T>();
  T* dln = dln_.template data<T>();

  // The head's backward is done (HeadLoss left the gradient of lnf in dln_); final norm. A
  // stage before the last starts from the gradient of its output instead.
  const T* last = le > lb ? acts_[le - 1].res3.template data<T>() : encoded_.template data<T>();
  MESHRUN_RETURN_IF_ERROR(ops::Zero(dev, dres_.raw(), dres_.nbytes()));
  if (!last_chunk) {
    MESHRUN_RETURN_IF_ERROR(ops::Copy(dev, dres, output_grad, sizeof(T) * N * C));
  } else {
    MESHRUN_RETURN_IF_ERROR(NormBackwardOp(dres, dln, last, lnf_mean_.template data<T>(),
                                           lnf_rstd_.template data<T>(), -1, 0));
  }
  if (last_chunk) MESHRUN_RETURN_IF_ERROR(Hook(kAfterBackward, L + 1));

  for (int l = le - 1; l >= lb; --l) {
    if (stash_ != nullptr) {
      // Zero-bubble's B (decision 0059): the block's parameters, none of its gradients; what
      // its weight gradients need goes to the stash for its W.
      const T* residual =
          l == lb ? encoded_.template data<T>() : acts_[l - 1].res3.template data<T>();
      MESHRUN_RETURN_IF_ERROR(Hook(kBeforeInputGrad, 1 + l));
      MESHRUN_RETURN_IF_ERROR(RecomputeBlock(l, residual));
      MESHRUN_RETURN_IF_ERROR(
          BlockBackwardInput(l, residual, stash_ + (l - lb) * LayerStashLayout(N).numel));
      MESHRUN_RETURN_IF_ERROR(Hook(kAfterInputGrad, 1 + l));
      continue;
    }
    MESHRUN_RETURN_IF_ERROR(Hook(kBeforeBackward, 1 + l));
    const T* residual =
        l == lb ? encoded_.template data<T>() : acts_[l - 1].res3.template data<T>();
    MESHRUN_RETURN_IF_ERROR(RecomputeBlock(l, residual));
    MESHRUN_RETURN_IF_ERROR(BlockBackward(l, residual));
    MESHRUN_RETURN_IF_ERROR(Hook(kAfterBackward, 1 + l));
  }
  // A later pipeline stage ends here: dres is the gradient of its input, sent upstream.
  if (ChunkFirst()) {
    // dres is the same on every tp rank: each adds it to its own vocabulary rows.
    if (cfg_.family().embedding_scale) {  // the forward's × √d_model
      MESHRUN_RETURN_IF_ERROR(
          ops::Scale(dev, dres, N * C,
                     static_cast<double>(static_cast<T>(std::sqrt(static_cast<double>(C))))));
    }
    MESHRUN_RETURN_IF_ERROR(ops::EmbeddingRowsBackward(dev, Grad(-1, ParamRole::kTokenEmbedding),
                                                       dres, tokens_data(), cfg_.vocab_first(),
                                                       cfg_.vocab_rows(), N, C));
    if (cfg_.family().learned_positions) {
      MESHRUN_RETURN_IF_ERROR(
          ops::EmbeddingRowsBackward(dev, Grad(-1, ParamRole::kPositionEmbedding), dres,
                                     positions_data(), 0, cfg_.max_seq_len, N, C));
    }
  }
  return ChunkUsesEmbedding() ? Hook(kAfterBackward, 0) : OkStatus();
}

template <typename T>
Status GPT2<T>::BlockBackward(int l, const T* residual) {
  const Device dev = cfg_.device;
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model, Cl = AttnWidth(),
                Fl = cfg_.ff() / cfg_.tp_size;
  T* const no_grad = nullptr;
  using R = ParamRole;
  auto zero = [&](const Tensor& t) { return ops::Zero(dev, t.raw(), t.nbytes()); };
  T* dres = dres_.template data<T>();
  T* dln = dln_.template data<T>();
  LayerActs& a = acts_[l];
  // MLP block: res3 = res2 + proj(act(fc(norm2(res2)))); dres flows to res2 unchanged. Each
  // input gradient's first write overwrites its buffer (no zeroing pass); the gated MLPs'
  // backward accumulates, so dfch_ starts from zero there.
  const bool overwrite = false;  // the ops' accumulate flag
  if (cfg_.gated_mlp()) MESHRUN_RETURN_IF_ERROR(zero(dfch_));
  if (cfg_.gated_mlp()) {
    MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(
        dev, dfch_gelu_.template data<T>(), Grad(l, R::kDownWeight), no_grad, dres,
        a.fch_gelu.template data<T>(), W(l, R::kDownWeight), N, Fl, C, overwrite));
    MESHRUN_RETURN_IF_ERROR(GatedBackward(dfch_.template data<T>(), a.fch.template data<T>(),
                                          dfch_gelu_.template data<T>(), N, Fl));
    MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(dev, dln, Grad(l, R::kUpWeight), no_grad,
                                                dfch_.template data<T>(), a.ln2.template data<T>(),
                                                W(l, R::kUpWeight), N, C, 2 * Fl, overwrite));
  } else {
    MESHRUN_RETURN_IF_ERROR(ops::BiasBackward(dev, Grad(l, R::kDownBias), dres, N, C));
    MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(
        dev, dfch_gelu_.template data<T>(), Grad(l, R::kDownWeight), no_grad, dres,
        a.fch_gelu.template data<T>(), W(l, R::kDownWeight), N, Fl, C, overwrite));
    MESHRUN_RETURN_IF_ERROR(ops::GeluBackward(dev, dfch_.template data<T>(),
                                              a.fch.template data<T>(),
                                              dfch_gelu_.template data<T>(), N * Fl, overwrite));
    MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(
        dev, dln, Grad(l, R::kUpWeight), Grad(l, R::kUpBias), dfch_.template data<T>(),
        a.ln2.template data<T>(), W(l, R::kUpWeight), N, C, Fl, overwrite));
  }
  MESHRUN_RETURN_IF_ERROR(TpAfterMatmulInputGrad(R::kUpWeight, dln, N * C));
  MESHRUN_RETURN_IF_ERROR(NormBackward(l, 2, a, a.res2.template data<T>(), dres, dln));
  // Attention block: res2 = residual + proj(attn(qkv(norm1(residual)))).
  if (cfg_.family().linear_biases)
    MESHRUN_RETURN_IF_ERROR(ops::BiasBackward(dev, Grad(l, R::kOutBias), dres, N, C));
  MESHRUN_RETURN_IF_ERROR(
      ops::MatmulBackward(dev, datty_.template data<T>(), Grad(l, R::kOutWeight), no_grad, dres,
                          a.atty.template data<T>(), W(l, R::kOutWeight), N, Cl, C, overwrite));
  MESHRUN_RETURN_IF_ERROR(AttentionBackward(a, dqkv_.template data<T>()));
  MESHRUN_RETURN_IF_ERROR(ops::MatmulBackward(
      dev, dln, Grad(l, R::kQkvWeight), Grad(l, R::kQkvBias), dqkv_.template data<T>(),
      a.ln1.template data<T>(), W(l, R::kQkvWeight), N, C, QkvWidth(), overwrite));
  MESHRUN_RETURN_IF_ERROR(TpAfterMatmulInputGrad(R::kQkvWeight, dln, N * C));
  return NormBackward(l, 1, a, residual, dres, dln);
}

template class GPT2<MESHRUN_ELEMENT_TYPE>;  // float; double in the float64 twin

}  // namespace meshrun
