// GPT-2 forward, backward and update on one CUDA device, in execution order. The same steps as
// engine/model/gpt2.cc with the CUDA kernels of engine/cuda/kernels.h; the differences are the
// activation type T (float or bf16), a low-precision weight copy with the token embedding padded to
// a multiple of 128 rows (aligned LM-head GEMMs), and q/k/v read in place from the fused qkv rows.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/gpt2_cuda.h"
#include "engine/cuda/kernels.h"
#include "engine/train/schedule.h"

namespace meshrun::gpu {

StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  return InvalidArgumentError("train.precision: \"" + name +
                              "\" is not a precision (hint: use fp32 or bf16)");
}

const char* PrecisionName(Precision p) {
  return p == Precision::kFloat32 ? "fp32" : "bf16";
}

// The precision-independent face of the model; ModelImpl<T> implements it.
class GPT2Cuda::Impl {
 public:
  virtual ~Impl() = default;
  virtual const GPT2Config& config() const = 0;
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual int64_t num_params() const = 0;
  virtual Precision precision() const = 0;
  virtual Status SetParams(const float* host) = 0;
  virtual Status GetParams(float* host) = 0;
  virtual Status GetGrads(float* host) = 0;
  virtual Status ZeroGrad() = 0;
  virtual Status Forward(const int32_t* inputs, int B, int seq_len) = 0;
  virtual Status GetLogits(float* host) = 0;
  virtual StatusOr<double> Loss(const int32_t* targets, bool with_grad, double grad_scale) = 0;
  virtual Status Backward() = 0;
  virtual StatusOr<UpdateResult> ClipAndAdamW(const TrainSpec& train, int64_t step) = 0;
  virtual MemoryStats memory_stats() const = 0;
  virtual Status Synchronize() = 0;
};

namespace {

constexpr int64_t kVocabPad = 128;

// The activations one layer saves for its backward (type T, statistics float).
struct LayerActs {
  DeviceBuffer ln1, ln1_mean, ln1_rstd, qkv, att, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
      res3;
};

template <typename T>
class ModelImpl final : public GPT2Cuda::Impl {
 public:
  ModelImpl(GPT2Config cfg, GPT2CudaOptions options, std::unique_ptr<CudaContext> ctx)
      : cfg_(cfg), options_(options), ctx_(std::move(ctx)), layout_(GPT2ParamLayout(cfg)) {
    num_params_ = layout_.back().offset + layout_.back().numel;
    Vp_ = (cfg_.vocab_size + kVocabPad - 1) / kVocabPad * kVocabPad;
    pad_elems_ = (Vp_ - cfg_.vocab_size) * static_cast<int64_t>(cfg_.d_model);
    for (const ParamInfo& p : layout_) index_[p.name] = &p;
  }

  Status Init() {
    if (layout_.front().name != "wte" || layout_.front().offset != 0) {
      return InternalError("GPT2ParamLayout must start with wte (the padded LM head relies on it)");
    }
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(master_, num_params_));
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(grads_, num_params_));
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(exp_avg_, num_params_));
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(exp_avg_sq_, num_params_));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(weights_, num_params_ + pad_elems_));
    cudaStream_t s = ctx_->stream();
    MESHRUN_GPU_TRY(cudaMemsetAsync(master_.get(), 0, master_.bytes(), s));
    MESHRUN_GPU_TRY(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), s));
    MESHRUN_GPU_TRY(cudaMemsetAsync(exp_avg_.get(), 0, exp_avg_.bytes(), s));
    MESHRUN_GPU_TRY(cudaMemsetAsync(exp_avg_sq_.get(), 0, exp_avg_sq_.bytes(), s));
    MESHRUN_GPU_TRY(cudaMemsetAsync(weights_.get(), 0, weights_.bytes(), s));  // pad rows stay 0
    return OkStatus();
  }

  const GPT2Config& config() const override { return cfg_; }
  const std::vector<ParamInfo>& params() const override { return layout_; }
  int64_t num_params() const override { return num_params_; }
  Precision precision() const override {
    return std::is_same_v<T, float> ? Precision::kFloat32 : Precision::kBFloat16;
  }

  Status SetParams(const float* host) override {
    MESHRUN_GPU_TRY(cudaMemcpyAsync(master_.get(), host, sizeof(float) * num_params_,
                                    cudaMemcpyHostToDevice, ctx_->stream()));
    MESHRUN_RETURN_IF_ERROR(RefreshWeights());
    return ctx_->Synchronize();  // `host` may be freed once we return
  }

  Status GetParams(float* host) override { return CopyToHost(host, master_.as<float>()); }
  Status GetGrads(float* host) override { return CopyToHost(host, grads_.as<float>()); }

  Status ZeroGrad() override {
    MESHRUN_GPU_TRY(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), ctx_->stream()));
    return OkStatus();
  }

  Status Forward(const int32_t* inputs, int B, int Tn) override;
  Status GetLogits(float* host) override;
  StatusOr<double> Loss(const int32_t* targets, bool with_grad, double grad_scale) override;
  Status Backward() override;
  StatusOr<UpdateResult> ClipAndAdamW(const TrainSpec& train, int64_t step) override;

  MemoryStats memory_stats() const override { return ctx_->allocator().Stats(); }
  Status Synchronize() override { return ctx_->Synchronize(); }

 private:
  template <typename E>
  Status Alloc(DeviceBuffer& buf, int64_t n) {
    MESHRUN_ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(ctx_->allocator(), sizeof(E) * n));
    return OkStatus();
  }

  Status CopyToHost(float* host, const float* dev) {
    MESHRUN_GPU_TRY(cudaMemcpyAsync(host, dev, sizeof(float) * num_params_, cudaMemcpyDeviceToHost,
                                    ctx_->stream()));
    return ctx_->Synchronize();
  }

  const ParamInfo& Info(const std::string& name) const { return *index_.at(name); }
  // Offset of a parameter in the low-precision copy: wte (first) has Vp_ rows there.
  int64_t WeightOffset(const ParamInfo& p) const {
    return p.offset == 0 ? 0 : p.offset + pad_elems_;
  }
  const T* W(const std::string& name) const { return weights_.as<T>() + WeightOffset(Info(name)); }
  float* G(const std::string& name) const { return grads_.as<float>() + Info(name).offset; }

  // weights_ = T(master_), wte into its padded rows.
  Status RefreshWeights() {
    const int64_t wte = layout_.front().numel;
    MESHRUN_RETURN_IF_ERROR((Convert<T, float>(*ctx_, weights_.as<T>(), master_.as<float>(), wte)));
    return Convert<T, float>(*ctx_, weights_.as<T>() + wte + pad_elems_, master_.as<float>() + wte,
                             num_params_ - wte);
  }

  Status EnsureActivations(int B, int Tn);

  GPT2Config cfg_;
  GPT2CudaOptions options_;
  std::unique_ptr<CudaContext> ctx_;
  std::vector<ParamInfo> layout_;
  std::map<std::string, const ParamInfo*> index_;
  int64_t num_params_ = 0, Vp_ = 0, pad_elems_ = 0;

  DeviceBuffer master_, grads_, exp_avg_, exp_avg_sq_, weights_;

  int B_ = 0, T_ = 0;
  int64_t capacity_tokens_ = 0;
  int positions_for_ = -1;  // the seq_len positions_ was filled for
  DeviceBuffer tokens_, targets_, positions_, encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_,
      losses_;
  std::vector<LayerActs> acts_;
  DeviceBuffer dres_, dln_, dqkv_, datt_, dfch_;  // backward scratch (dln_ also forward scratch)
};

template <typename T>
Status ModelImpl<T>::EnsureActivations(int B, int Tn) {
  B_ = B;
  T_ = Tn;
  const int64_t N = static_cast<int64_t>(B) * Tn, C = cfg_.d_model, H = cfg_.n_head;
  if (N > capacity_tokens_) {
    acts_.clear();         // free before allocating the larger set
    capacity_tokens_ = 0;  // set again only once everything is allocated
    positions_for_ = -1;
    MESHRUN_RETURN_IF_ERROR(Alloc<int32_t>(tokens_, N));
    MESHRUN_RETURN_IF_ERROR(Alloc<int32_t>(targets_, N));
    MESHRUN_RETURN_IF_ERROR(Alloc<int32_t>(positions_, N));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(encoded_, N * C));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(lnf_, N * C));
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(lnf_mean_, N));
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(lnf_rstd_, N));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(logits_, N * Vp_));
    MESHRUN_RETURN_IF_ERROR(Alloc<float>(losses_, N));
    acts_.resize(cfg_.n_layer);
    for (LayerActs& a : acts_) {
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.ln1, N * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<float>(a.ln1_mean, N));
      MESHRUN_RETURN_IF_ERROR(Alloc<float>(a.ln1_rstd, N));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.qkv, N * 3 * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.att, N * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<float>(a.lse, N * H));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.res2, N * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.ln2, N * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<float>(a.ln2_mean, N));
      MESHRUN_RETURN_IF_ERROR(Alloc<float>(a.ln2_rstd, N));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.fch, N * 4 * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.fch_gelu, N * 4 * C));
      MESHRUN_RETURN_IF_ERROR(Alloc<T>(a.res3, N * C));
    }
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(dres_, N * C));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(dln_, N * C));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(dqkv_, N * 3 * C));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(datt_, N * C));
    MESHRUN_RETURN_IF_ERROR(Alloc<T>(dfch_, N * 4 * C));
    capacity_tokens_ = N;
  }
  if (positions_for_ != Tn) {
    // Global positions i % T for the embedding; the attention reads the first T (one sequence).
    std::vector<int32_t> pos(N);
    for (int64_t i = 0; i < N; ++i) pos[i] = static_cast<int32_t>(i % Tn);
    MESHRUN_GPU_TRY(cudaMemcpyAsync(positions_.get(), pos.data(), sizeof(int32_t) * N,
                                    cudaMemcpyHostToDevice, ctx_->stream()));
    MESHRUN_RETURN_IF_ERROR(ctx_->Synchronize());  // pos is a local
    positions_for_ = Tn;
  }
  return OkStatus();
}

template <typename T>
Status ModelImpl<T>::Forward(const int32_t* inputs, int B, int Tn) {
  if (B <= 0 || Tn <= 0 || Tn > cfg_.max_seq_len) {
    return InvalidArgumentError("forward of B=" + std::to_string(B) + " sequences of " +
                                std::to_string(Tn) + " tokens: need B ≥ 1 and 1 ≤ seq_len ≤ " +
                                std::to_string(cfg_.max_seq_len) + " (the position embedding)");
  }
  MESHRUN_RETURN_IF_ERROR(EnsureActivations(B, Tn));
  CudaContext& ctx = *ctx_;
  const int64_t N = static_cast<int64_t>(B) * Tn, C = cfg_.d_model, H = cfg_.n_head, D = C / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  MESHRUN_GPU_TRY(cudaMemcpyAsync(tokens_.get(), inputs, sizeof(int32_t) * N,
                                  cudaMemcpyHostToDevice, ctx.stream()));
  const int32_t* tokens = tokens_.as<int32_t>();
  const int32_t* positions = positions_.as<int32_t>();  // its first T entries: 0..T-1

  // q, k and v straight out of the fused (B,T,3,H,D) rows; the output in (B,T,H,D) rows.
  AttentionOptions attn;
  attn.q = attn.k = attn.v = HeadLayout{Tn * 3 * C, D, 3 * C};
  attn.out = HeadLayout{Tn * C, D, C};
  attn.algo = options_.tensor_core_attention ? AttentionAlgo::kAuto : AttentionAlgo::kGeneric;

  T* x = encoded_.as<T>();
  MESHRUN_RETURN_IF_ERROR(EmbeddingForward(ctx, x, tokens, positions, W("wte"), W("wpe"), N, C));
  for (int l = 0; l < cfg_.n_layer; ++l) {
    LayerActs& a = acts_[l];
    const std::string h = "h." + std::to_string(l) + ".";
    const T* residual = l == 0 ? x : acts_[l - 1].res3.as<T>();
    // Attention block.
    MESHRUN_RETURN_IF_ERROR(LayerNormForward(ctx, a.ln1.as<T>(), a.ln1_mean.as<float>(),
                                             a.ln1_rstd.as<float>(), residual, W(h + "ln_1.weight"),
                                             W(h + "ln_1.bias"), N, C, cfg_.ln_eps));
    T* qkv = a.qkv.as<T>();
    MESHRUN_RETURN_IF_ERROR(MatmulForward(ctx, qkv, static_cast<const T*>(a.ln1.as<T>()),
                                          W(h + "attn.c_attn.weight"), W(h + "attn.c_attn.bias"), N,
                                          C, 3 * C));
    MESHRUN_RETURN_IF_ERROR(
        AttentionForward(ctx, a.att.as<T>(), a.lse.as<float>(), static_cast<const T*>(qkv),
                         static_cast<const T*>(qkv + C), static_cast<const T*>(qkv + 2 * C),
                         positions, positions, B, H, Tn, Tn, D, scale, attn));
    T* attproj = dln_.as<T>();  // scratch: the projection is not needed for backward
    MESHRUN_RETURN_IF_ERROR(MatmulForward(ctx, attproj, static_cast<const T*>(a.att.as<T>()),
                                          W(h + "attn.c_proj.weight"), W(h + "attn.c_proj.bias"), N,
                                          C, C));
    MESHRUN_RETURN_IF_ERROR(
        ResidualForward(ctx, a.res2.as<T>(), residual, static_cast<const T*>(attproj), N * C));
    // MLP block.
    MESHRUN_RETURN_IF_ERROR(
        LayerNormForward(ctx, a.ln2.as<T>(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(),
                         static_cast<const T*>(a.res2.as<T>()), W(h + "ln_2.weight"),
                         W(h + "ln_2.bias"), N, C, cfg_.ln_eps));
    MESHRUN_RETURN_IF_ERROR(MatmulForward(ctx, a.fch.as<T>(), static_cast<const T*>(a.ln2.as<T>()),
                                          W(h + "mlp.c_fc.weight"), W(h + "mlp.c_fc.bias"), N, C,
                                          4 * C));
    MESHRUN_RETURN_IF_ERROR(
        GeluForward(ctx, a.fch_gelu.as<T>(), static_cast<const T*>(a.fch.as<T>()), N * 4 * C));
    T* fcproj = dln_.as<T>();
    MESHRUN_RETURN_IF_ERROR(MatmulForward(ctx, fcproj, static_cast<const T*>(a.fch_gelu.as<T>()),
                                          W(h + "mlp.c_proj.weight"), W(h + "mlp.c_proj.bias"), N,
                                          4 * C, C));
    MESHRUN_RETURN_IF_ERROR(ResidualForward(ctx, a.res3.as<T>(),
                                            static_cast<const T*>(a.res2.as<T>()),
                                            static_cast<const T*>(fcproj), N * C));
  }
  const T* last = cfg_.n_layer > 0 ? acts_.back().res3.as<T>() : x;
  MESHRUN_RETURN_IF_ERROR(LayerNormForward(ctx, lnf_.as<T>(), lnf_mean_.as<float>(),
                                           lnf_rstd_.as<float>(), last, W("ln_f.weight"),
                                           W("ln_f.bias"), N, C, cfg_.ln_eps));
  // LM head tied to the token embedding, over the padded vocabulary (pad logits are 0).
  return MatmulForward(ctx, logits_.as<T>(), static_cast<const T*>(lnf_.as<T>()), W("wte"),
                       static_cast<const T*>(nullptr), N, C, Vp_);
}

template <typename T>
Status ModelImpl<T>::GetLogits(float* host) {
  const int64_t N = static_cast<int64_t>(B_) * T_, V = cfg_.vocab_size;
  if (N == 0) return FailedPreconditionError("GetLogits before Forward");
  std::vector<T> staging(N * Vp_);
  MESHRUN_GPU_TRY(cudaMemcpyAsync(staging.data(), logits_.get(), sizeof(T) * N * Vp_,
                                  cudaMemcpyDeviceToHost, ctx_->stream()));
  MESHRUN_RETURN_IF_ERROR(ctx_->Synchronize());
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < V; ++j) host[i * V + j] = static_cast<float>(staging[i * Vp_ + j]);
  }
  return OkStatus();
}

template <typename T>
StatusOr<double> ModelImpl<T>::Loss(const int32_t* targets, bool with_grad, double grad_scale) {
  const int64_t N = static_cast<int64_t>(B_) * T_;
  MESHRUN_GPU_TRY(cudaMemcpyAsync(targets_.get(), targets, sizeof(int32_t) * N,
                                  cudaMemcpyHostToDevice, ctx_->stream()));
  T* logits = logits_.as<T>();
  // The fused kernel writes dlogits over the logits when a backward follows.
  MESHRUN_RETURN_IF_ERROR(
      SoftmaxCrossEntropy(*ctx_, losses_.as<float>(), with_grad ? logits : static_cast<T*>(nullptr),
                          static_cast<const T*>(logits), targets_.as<int32_t>(), N, cfg_.vocab_size,
                          static_cast<float>(grad_scale), Vp_));
  return Sum(*ctx_, losses_.as<float>(), N);  // synchronizes: `targets` may be freed after
}

template <typename T>
Status ModelImpl<T>::Backward() {
  CudaContext& ctx = *ctx_;
  const int64_t B = B_, Tn = T_, N = B * Tn, C = cfg_.d_model, H = cfg_.n_head, D = C / H,
                V = cfg_.vocab_size;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int32_t* positions = positions_.as<int32_t>();
  T* dres = dres_.as<T>();
  T* dln = dln_.as<T>();
  const T* dlogits = logits_.as<T>();
  AttentionOptions attn;
  attn.q = attn.k = attn.v = HeadLayout{Tn * 3 * C, D, 3 * C};
  attn.out = HeadLayout{Tn * C, D, C};
  attn.algo = options_.tensor_core_attention ? AttentionAlgo::kAuto : AttentionAlgo::kGeneric;
  attn.accumulate = false;
  MatmulBackwardOptions overwrite;
  overwrite.accumulate_dinp = false;

  // Head (tied) and final LayerNorm; dlogits has the padded row stride, V real columns.
  MatmulBackwardOptions head = overwrite;
  head.ld_dout = Vp_;
  MESHRUN_RETURN_IF_ERROR(MatmulBackward(ctx, dln, G("wte"), nullptr, dlogits,
                                         static_cast<const T*>(lnf_.as<T>()), W("wte"), N, C, V,
                                         head));
  const T* last = cfg_.n_layer > 0 ? acts_.back().res3.as<T>() : encoded_.as<T>();
  MESHRUN_RETURN_IF_ERROR(LayerNormBackward(ctx, dres, G("ln_f.weight"), G("ln_f.bias"),
                                            static_cast<const T*>(dln), last, W("ln_f.weight"),
                                            lnf_mean_.as<float>(), lnf_rstd_.as<float>(), N, C,
                                            /*accumulate=*/false));

  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    LayerActs& a = acts_[l];
    const std::string h = "h." + std::to_string(l) + ".";
    const T* residual = l == 0 ? encoded_.as<T>() : acts_[l - 1].res3.as<T>();
    // MLP block: res3 = res2 + proj(gelu(fc(ln2(res2)))); dres flows to res2 unchanged.
    T* dfch = dfch_.as<T>();
    MESHRUN_RETURN_IF_ERROR(MatmulBackward(ctx, dfch, G(h + "mlp.c_proj.weight"),
                                           G(h + "mlp.c_proj.bias"), static_cast<const T*>(dres),
                                           static_cast<const T*>(a.fch_gelu.as<T>()),
                                           W(h + "mlp.c_proj.weight"), N, 4 * C, C, overwrite));
    // In place: dfch holds d(gelu out) and becomes d(fc out).
    MESHRUN_RETURN_IF_ERROR(GeluBackward(ctx, dfch, static_cast<const T*>(a.fch.as<T>()),
                                         static_cast<const T*>(dfch), N * 4 * C,
                                         /*accumulate=*/false));
    MESHRUN_RETURN_IF_ERROR(MatmulBackward(
        ctx, dln, G(h + "mlp.c_fc.weight"), G(h + "mlp.c_fc.bias"), static_cast<const T*>(dfch),
        static_cast<const T*>(a.ln2.as<T>()), W(h + "mlp.c_fc.weight"), N, C, 4 * C, overwrite));
    MESHRUN_RETURN_IF_ERROR(LayerNormBackward(
        ctx, dres, G(h + "ln_2.weight"), G(h + "ln_2.bias"), static_cast<const T*>(dln),
        static_cast<const T*>(a.res2.as<T>()), W(h + "ln_2.weight"), a.ln2_mean.as<float>(),
        a.ln2_rstd.as<float>(), N, C));
    // Attention block: res2 = residual + proj(attn(qkv(ln1(residual)))).
    T* datt = datt_.as<T>();
    MESHRUN_RETURN_IF_ERROR(MatmulBackward(ctx, datt, G(h + "attn.c_proj.weight"),
                                           G(h + "attn.c_proj.bias"), static_cast<const T*>(dres),
                                           static_cast<const T*>(a.att.as<T>()),
                                           W(h + "attn.c_proj.weight"), N, C, C, overwrite));
    const T* qkv = a.qkv.as<T>();
    T* dqkv = dqkv_.as<T>();
    MESHRUN_RETURN_IF_ERROR(
        AttentionBackward(ctx, dqkv, dqkv + C, dqkv + 2 * C, static_cast<const T*>(datt), qkv,
                          qkv + C, qkv + 2 * C, static_cast<const T*>(a.att.as<T>()),
                          a.lse.as<float>(), positions, positions, B, H, Tn, Tn, D, scale, attn));
    MESHRUN_RETURN_IF_ERROR(MatmulBackward(ctx, dln, G(h + "attn.c_attn.weight"),
                                           G(h + "attn.c_attn.bias"), static_cast<const T*>(dqkv),
                                           static_cast<const T*>(a.ln1.as<T>()),
                                           W(h + "attn.c_attn.weight"), N, C, 3 * C, overwrite));
    MESHRUN_RETURN_IF_ERROR(LayerNormBackward(
        ctx, dres, G(h + "ln_1.weight"), G(h + "ln_1.bias"), static_cast<const T*>(dln), residual,
        W(h + "ln_1.weight"), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), N, C));
  }
  return EmbeddingBackward(ctx, G("wte"), G("wpe"), static_cast<const T*>(dres),
                           tokens_.as<int32_t>(), positions, N, C);
}

template <typename T>
StatusOr<UpdateResult> ModelImpl<T>::ClipAndAdamW(const TrainSpec& tr, int64_t step) {
  UpdateResult r;
  MESHRUN_ASSIGN_OR_RETURN(const double sq, SumOfSquares(*ctx_, grads_.as<float>(), num_params_));
  r.grad_norm = std::sqrt(sq);
  float clip = 1.0f;
  if (tr.grad_clip > 0 && r.grad_norm > tr.grad_clip) {
    clip = static_cast<float>(tr.grad_clip / (r.grad_norm + 1e-6));
  }
  r.lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
  for (const ParamInfo& p : layout_) {
    MESHRUN_RETURN_IF_ERROR(AdamW<T>(*ctx_, master_.as<float>() + p.offset,
                                     grads_.as<float>() + p.offset, exp_avg_.as<float>() + p.offset,
                                     exp_avg_sq_.as<float>() + p.offset, p.numel, r.lr, tr.beta1,
                                     tr.beta2, tr.eps, p.decay ? tr.weight_decay : 0.0, step + 1,
                                     clip, weights_.as<T>() + WeightOffset(p)));
  }
  return r;
}

}  // namespace

StatusOr<std::unique_ptr<GPT2Cuda>> GPT2Cuda::Create(const GPT2Config& cfg,
                                                     const GPT2CudaOptions& options) {
  if (cfg.n_head <= 0 || cfg.d_model % cfg.n_head != 0) {
    return InvalidArgumentError("model.d_model (" + std::to_string(cfg.d_model) +
                                ") must be a multiple of model.n_head (" +
                                std::to_string(cfg.n_head) + ")");
  }
  if (cfg.d_model / cfg.n_head > 256) {
    return InvalidArgumentError(
        "head size d_model/n_head = " + std::to_string(cfg.d_model / cfg.n_head) +
        " is above 256, the CUDA attention's limit (hint: more heads)");
  }
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<CudaContext> ctx, CudaContext::Create(options.device));
  std::unique_ptr<Impl> impl;
  if (options.precision == Precision::kFloat32) {
    auto m = std::make_unique<ModelImpl<float>>(cfg, options, std::move(ctx));
    MESHRUN_RETURN_IF_ERROR(m->Init());
    impl = std::move(m);
  } else {
    auto m = std::make_unique<ModelImpl<bf16>>(cfg, options, std::move(ctx));
    MESHRUN_RETURN_IF_ERROR(m->Init());
    impl = std::move(m);
  }
  return std::unique_ptr<GPT2Cuda>(new GPT2Cuda(std::move(impl)));
}

GPT2Cuda::GPT2Cuda(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GPT2Cuda::~GPT2Cuda() = default;

const GPT2Config& GPT2Cuda::config() const {
  return impl_->config();
}
const std::vector<ParamInfo>& GPT2Cuda::params() const {
  return impl_->params();
}
int64_t GPT2Cuda::num_params() const {
  return impl_->num_params();
}
Precision GPT2Cuda::precision() const {
  return impl_->precision();
}

Status GPT2Cuda::InitDeterministic(uint64_t seed) {
  // The CPU model's own initialisation (parallel on the host), so both start bit-identical.
  GPT2<float> host(config());
  host.InitDeterministic(seed);
  return SetParams(host.params_data());
}

Status GPT2Cuda::SetParams(const float* host) {
  return impl_->SetParams(host);
}
Status GPT2Cuda::GetParams(float* host) {
  return impl_->GetParams(host);
}
Status GPT2Cuda::GetGrads(float* host) {
  return impl_->GetGrads(host);
}
Status GPT2Cuda::ZeroGrad() {
  return impl_->ZeroGrad();
}
Status GPT2Cuda::Forward(const int32_t* inputs, int B, int seq_len) {
  return impl_->Forward(inputs, B, seq_len);
}
Status GPT2Cuda::GetLogits(float* host) {
  return impl_->GetLogits(host);
}

StatusOr<double> GPT2Cuda::ForwardLoss(const int32_t* inputs, const int32_t* targets, int B,
                                       int seq_len) {
  MESHRUN_RETURN_IF_ERROR(impl_->Forward(inputs, B, seq_len));
  return impl_->Loss(targets, /*with_grad=*/false, 0.0);
}

StatusOr<double> GPT2Cuda::ForwardBackward(const int32_t* inputs, const int32_t* targets, int B,
                                           int seq_len, double grad_scale) {
  MESHRUN_RETURN_IF_ERROR(impl_->Forward(inputs, B, seq_len));
  MESHRUN_ASSIGN_OR_RETURN(const double loss, impl_->Loss(targets, /*with_grad=*/true, grad_scale));
  MESHRUN_RETURN_IF_ERROR(impl_->Backward());
  return loss;
}

StatusOr<UpdateResult> GPT2Cuda::ClipAndAdamW(const TrainSpec& train, int64_t step) {
  return impl_->ClipAndAdamW(train, step);
}

MemoryStats GPT2Cuda::memory_stats() const {
  return impl_->memory_stats();
}
Status GPT2Cuda::Synchronize() {
  return impl_->Synchronize();
}

}  // namespace meshrun::gpu
