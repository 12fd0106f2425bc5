// GPT-2 forward and backward on one rank, in execution order.
#include "engine/model/gpt2.h"

#include <cmath>
#include <cstring>

#include "engine/kernels/cpu/kernels.h"

namespace meshrun {

std::vector<ParamInfo> GPT2ParamLayout(const GPT2Config& cfg) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size, L = cfg.n_layer;
  const double w_std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * L);
  std::vector<ParamInfo> out;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, double std, double value) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= d;
    p.offset = offset;
    p.decay = p.shape.size() >= 2;
    p.init_std = std;
    p.init_value = value;
    offset += p.numel;
    out.push_back(std::move(p));
  };
  add("wte", {V, C}, w_std, 0);
  add("wpe", {cfg.max_seq_len, C}, w_std, 0);
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, 0, 1);
    add(h + "ln_1.bias", {C}, 0, 0);
    add(h + "attn.c_attn.weight", {3 * C, C}, w_std, 0);
    add(h + "attn.c_attn.bias", {3 * C}, 0, 0);
    add(h + "attn.c_proj.weight", {C, C}, proj_std, 0);
    add(h + "attn.c_proj.bias", {C}, 0, 0);
    add(h + "ln_2.weight", {C}, 0, 1);
    add(h + "ln_2.bias", {C}, 0, 0);
    add(h + "mlp.c_fc.weight", {4 * C, C}, w_std, 0);
    add(h + "mlp.c_fc.bias", {4 * C}, 0, 0);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, proj_std, 0);
    add(h + "mlp.c_proj.bias", {C}, 0, 0);
  }
  add("ln_f.weight", {C}, 0, 1);
  add("ln_f.bias", {C}, 0, 0);
  return out;
}

double GPT2FlopsPerToken(const GPT2Config& cfg, int seq_len) {
  double n = 0;
  for (const ParamInfo& p : GPT2ParamLayout(cfg)) {
    if (p.name != "wpe") n += static_cast<double>(p.numel);
  }
  return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * static_cast<double>(seq_len);
}

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

double InitNormal(uint64_t seed, const std::string& name, int64_t index) {
  // Counter-based: two uniforms from a hash of (seed, name, index), then Box–Muller.
  const uint64_t base = SplitMix64(seed ^ SplitMix64(Fnv1a(name)));
  const uint64_t a = SplitMix64(base + 2 * static_cast<uint64_t>(index));
  const uint64_t b = SplitMix64(base + 2 * static_cast<uint64_t>(index) + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

template <typename T>
GPT2<T>::GPT2(GPT2Config cfg) : cfg_(cfg), layout_(GPT2ParamLayout(cfg)) {
  num_params_ = layout_.back().offset + layout_.back().numel;
  params_ = Tensor::Zeros({num_params_}, ScalarTypeOf<T>());
  grads_ = Tensor::Zeros({num_params_}, ScalarTypeOf<T>());
}

template <typename T>
const ParamInfo* GPT2<T>::FindParam(const std::string& name) const {
  for (const ParamInfo& p : layout_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

template <typename T>
void GPT2<T>::InitDeterministic(uint64_t seed) {
  for (const ParamInfo& p : layout_) {
    T* dst = param(p);
    if (p.init_std == 0.0) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<T>(p.init_value);
      continue;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p.numel; ++i) {
      dst[i] = static_cast<T>(p.init_std * InitNormal(seed, p.name, i));
    }
  }
}

template <typename T>
void GPT2<T>::ZeroGrad() {
  std::memset(grads_data(), 0, sizeof(T) * num_params_);
}

template <typename T>
void GPT2<T>::EnsureActivations(int B, int Tn) {
  B_ = B;
  T_ = Tn;
  const int64_t N = static_cast<int64_t>(B) * T_;
  if (N <= capacity_tokens_) return;
  capacity_tokens_ = static_cast<int>(N);
  const int64_t C = cfg_.d_model, V = cfg_.vocab_size, H = cfg_.n_head;
  const ScalarType dt = ScalarTypeOf<T>();
  encoded_ = Tensor::Empty({N, C}, dt);
  lnf_ = Tensor::Empty({N, C}, dt);
  lnf_mean_ = Tensor::Empty({N}, dt);
  lnf_rstd_ = Tensor::Empty({N}, dt);
  logits_ = Tensor::Empty({N, V}, dt);
  losses_ = Tensor::Empty({N}, dt);
  acts_.clear();
  acts_.resize(cfg_.n_layer);
  for (LayerActs& a : acts_) {
    a.ln1 = Tensor::Empty({N, C}, dt);
    a.ln1_mean = Tensor::Empty({N}, dt);
    a.ln1_rstd = Tensor::Empty({N}, dt);
    a.q = Tensor::Empty({N, C}, dt);
    a.k = Tensor::Empty({N, C}, dt);
    a.v = Tensor::Empty({N, C}, dt);
    a.att = Tensor::Empty({N, C}, dt);
    a.lse = Tensor::Empty({N * H}, dt);
    a.atty = Tensor::Empty({N, C}, dt);
    a.res2 = Tensor::Empty({N, C}, dt);
    a.ln2 = Tensor::Empty({N, C}, dt);
    a.ln2_mean = Tensor::Empty({N}, dt);
    a.ln2_rstd = Tensor::Empty({N}, dt);
    a.fch = Tensor::Empty({N, 4 * C}, dt);
    a.fch_gelu = Tensor::Empty({N, 4 * C}, dt);
    a.res3 = Tensor::Empty({N, C}, dt);
  }
  qkv_ = Tensor::Empty({N, 3 * C}, dt);
  dres_ = Tensor::Empty({N, C}, dt);
  dln_ = Tensor::Empty({N, C}, dt);
  dqkv_ = Tensor::Empty({N, 3 * C}, dt);
  dq_ = Tensor::Empty({N, C}, dt);
  dk_ = Tensor::Empty({N, C}, dt);
  dv_ = Tensor::Empty({N, C}, dt);
  datt_ = Tensor::Empty({N, C}, dt);
  datty_ = Tensor::Empty({N, C}, dt);
  dfch_ = Tensor::Empty({N, 4 * C}, dt);
  dfch_gelu_ = Tensor::Empty({N, 4 * C}, dt);
}

namespace {

// qkv (B,T,3,H,D) → q, k, v each (B,H,T,D).
template <typename T>
void SplitHeads(T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D) {
  const int64_t C = H * D;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      const T* row = qkv + (b * Tn + t) * 3 * C;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t dst = ((b * H + h) * Tn + t) * D;
        std::memcpy(q + dst, row + h * D, sizeof(T) * D);
        std::memcpy(k + dst, row + C + h * D, sizeof(T) * D);
        std::memcpy(v + dst, row + 2 * C + h * D, sizeof(T) * D);
      }
    }
  }
}

// The inverse of SplitHeads.
template <typename T>
void MergeQkvGrads(T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B, int64_t Tn,
                   int64_t H, int64_t D) {
  const int64_t C = H * D;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      T* row = dqkv + (b * Tn + t) * 3 * C;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t src = ((b * H + h) * Tn + t) * D;
        std::memcpy(row + h * D, dq + src, sizeof(T) * D);
        std::memcpy(row + C + h * D, dk + src, sizeof(T) * D);
        std::memcpy(row + 2 * C + h * D, dv + src, sizeof(T) * D);
      }
    }
  }
}

// (B,H,T,D) ↔ (B,T,H·D).
template <typename T>
void HeadsToRows(T* rows, const T* heads, int64_t B, int64_t Tn, int64_t H, int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(rows + (b * Tn + t) * H * D + h * D, heads + ((b * H + h) * Tn + t) * D,
                    sizeof(T) * D);
      }
    }
  }
}

template <typename T>
void RowsToHeads(T* heads, const T* rows, int64_t B, int64_t Tn, int64_t H, int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(heads + ((b * H + h) * Tn + t) * D, rows + (b * Tn + t) * H * D + h * D,
                    sizeof(T) * D);
      }
    }
  }
}

template <typename T>
void Zero(const Tensor& t) {
  std::memset(t.raw(), 0, t.nbytes());
}

}  // namespace

template <typename T>
void GPT2<T>::Forward(const int32_t* inputs, int B, int Tn) {
  EnsureActivations(B, Tn);
  const int64_t N = static_cast<int64_t>(B) * Tn, C = cfg_.d_model, H = cfg_.n_head,
                D = C / H, V = cfg_.vocab_size;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  tokens_.assign(inputs, inputs + N);
  positions_.resize(N);
  for (int64_t i = 0; i < N; ++i) positions_[i] = static_cast<int32_t>(i % Tn);
  const int32_t* seq_pos = positions_.data();  // positions of one sequence: 0..T-1

  auto P = [&](const std::string& name) { return param(*FindParam(name)); };
  T* x = encoded_.template data<T>();
  cpu::EmbeddingForward(x, tokens_.data(), positions_.data(), P("wte"), P("wpe"), N, C);

  for (int l = 0; l < cfg_.n_layer; ++l) {
    LayerActs& a = acts_[l];
    const std::string h = "h." + std::to_string(l) + ".";
    const T* residual = l == 0 ? x : acts_[l - 1].res3.template data<T>();
    // Attention block.
    cpu::LayerNormForward(a.ln1.template data<T>(), a.ln1_mean.template data<T>(),
                          a.ln1_rstd.template data<T>(), residual, P(h + "ln_1.weight"),
                          P(h + "ln_1.bias"), N, C, cfg_.ln_eps);
    cpu::MatmulForward(qkv_.template data<T>(), a.ln1.template data<T>(),
                       P(h + "attn.c_attn.weight"), P(h + "attn.c_attn.bias"), N, C, 3 * C);
    SplitHeads(a.q.template data<T>(), a.k.template data<T>(), a.v.template data<T>(),
               qkv_.template data<T>(), B, Tn, H, D);
    cpu::AttentionForward(a.att.template data<T>(), a.lse.template data<T>(),
                          a.q.template data<T>(), a.k.template data<T>(), a.v.template data<T>(),
                          seq_pos, seq_pos, B, H, Tn, Tn, D, scale);
    HeadsToRows(a.atty.template data<T>(), a.att.template data<T>(), B, Tn, H, D);
    T* attproj = dln_.template data<T>();  // scratch: attproj is not needed for backward
    cpu::MatmulForward(attproj, a.atty.template data<T>(), P(h + "attn.c_proj.weight"),
                       P(h + "attn.c_proj.bias"), N, C, C);
    cpu::ResidualForward(a.res2.template data<T>(), residual, attproj, N * C);
    // MLP block.
    cpu::LayerNormForward(a.ln2.template data<T>(), a.ln2_mean.template data<T>(),
                          a.ln2_rstd.template data<T>(), a.res2.template data<T>(),
                          P(h + "ln_2.weight"), P(h + "ln_2.bias"), N, C, cfg_.ln_eps);
    cpu::MatmulForward(a.fch.template data<T>(), a.ln2.template data<T>(),
                       P(h + "mlp.c_fc.weight"), P(h + "mlp.c_fc.bias"), N, C, 4 * C);
    cpu::GeluForward(a.fch_gelu.template data<T>(), a.fch.template data<T>(), N * 4 * C);
    T* fcproj = dln_.template data<T>();
    cpu::MatmulForward(fcproj, a.fch_gelu.template data<T>(), P(h + "mlp.c_proj.weight"),
                       P(h + "mlp.c_proj.bias"), N, 4 * C, C);
    cpu::ResidualForward(a.res3.template data<T>(), a.res2.template data<T>(), fcproj, N * C);
  }
  const T* last = cfg_.n_layer > 0 ? acts_.back().res3.template data<T>() : x;
  cpu::LayerNormForward(lnf_.template data<T>(), lnf_mean_.template data<T>(),
                        lnf_rstd_.template data<T>(), last, P("ln_f.weight"), P("ln_f.bias"), N,
                        C, cfg_.ln_eps);
  // LM head tied to the token embedding.
  cpu::MatmulForward(logits_.template data<T>(), lnf_.template data<T>(), P("wte"),
                     static_cast<const T*>(nullptr), N, C, V);
}

template <typename T>
double GPT2<T>::Loss(const int32_t* targets, bool with_grad, double grad_scale) {
  const int64_t N = static_cast<int64_t>(B_) * T_;
  T* logits = logits_.template data<T>();
  T* losses = losses_.template data<T>();
  // The fused kernel writes dlogits over the logits when a backward follows.
  cpu::SoftmaxCrossEntropy(losses, with_grad ? logits : static_cast<T*>(nullptr), logits,
                           targets, N, cfg_.vocab_size, static_cast<T>(grad_scale));
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) sum += static_cast<double>(losses[i]);
  return sum;
}

template <typename T>
double GPT2<T>::ForwardLoss(const int32_t* inputs, const int32_t* targets, int B, int Tn) {
  Forward(inputs, B, Tn);
  return Loss(targets, /*with_grad=*/false, 0.0);
}

template <typename T>
double GPT2<T>::ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int Tn,
                                double grad_scale) {
  Forward(inputs, B, Tn);
  const double loss = Loss(targets, /*with_grad=*/true, grad_scale);
  Backward();
  return loss;
}

template <typename T>
void GPT2<T>::Backward() {
  const int64_t B = B_, Tn = T_, N = B * Tn, C = cfg_.d_model, H = cfg_.n_head, D = C / H,
                V = cfg_.vocab_size;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int32_t* seq_pos = positions_.data();
  auto P = [&](const std::string& name) { return param(*FindParam(name)); };
  auto G = [&](const std::string& name) { return grad(*FindParam(name)); };
  T* dres = dres_.template data<T>();
  T* dln = dln_.template data<T>();
  const T* dlogits = logits_.template data<T>();

  // Head (tied) and final LayerNorm.
  Zero<T>(dln_);
  cpu::MatmulBackward(dln, G("wte"), static_cast<T*>(nullptr), dlogits, lnf_.template data<T>(),
                      P("wte"), N, C, V);
  const T* last = cfg_.n_layer > 0 ? acts_.back().res3.template data<T>()
                                   : encoded_.template data<T>();
  Zero<T>(dres_);
  cpu::LayerNormBackward(dres, G("ln_f.weight"), G("ln_f.bias"), dln, last, P("ln_f.weight"),
                         lnf_mean_.template data<T>(), lnf_rstd_.template data<T>(), N, C);

  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    LayerActs& a = acts_[l];
    const std::string h = "h." + std::to_string(l) + ".";
    const T* residual = l == 0 ? encoded_.template data<T>() : acts_[l - 1].res3.template data<T>();
    // MLP block: res3 = res2 + proj(gelu(fc(ln2(res2)))); dres flows to res2 unchanged.
    Zero<T>(dfch_gelu_);
    cpu::MatmulBackward(dfch_gelu_.template data<T>(), G(h + "mlp.c_proj.weight"),
                        G(h + "mlp.c_proj.bias"), dres, a.fch_gelu.template data<T>(),
                        P(h + "mlp.c_proj.weight"), N, 4 * C, C);
    Zero<T>(dfch_);
    cpu::GeluBackward(dfch_.template data<T>(), a.fch.template data<T>(),
                      dfch_gelu_.template data<T>(), N * 4 * C);
    Zero<T>(dln_);
    cpu::MatmulBackward(dln, G(h + "mlp.c_fc.weight"), G(h + "mlp.c_fc.bias"),
                        dfch_.template data<T>(), a.ln2.template data<T>(),
                        P(h + "mlp.c_fc.weight"), N, C, 4 * C);
    cpu::LayerNormBackward(dres, G(h + "ln_2.weight"), G(h + "ln_2.bias"), dln,
                           a.res2.template data<T>(), P(h + "ln_2.weight"),
                           a.ln2_mean.template data<T>(), a.ln2_rstd.template data<T>(), N, C);
    // Attention block: res2 = residual + proj(attn(qkv(ln1(residual)))).
    Zero<T>(datty_);
    cpu::MatmulBackward(datty_.template data<T>(), G(h + "attn.c_proj.weight"),
                        G(h + "attn.c_proj.bias"), dres, a.atty.template data<T>(),
                        P(h + "attn.c_proj.weight"), N, C, C);
    RowsToHeads(datt_.template data<T>(), datty_.template data<T>(), B, Tn, H, D);
    Zero<T>(dq_);
    Zero<T>(dk_);
    Zero<T>(dv_);
    cpu::AttentionBackward(dq_.template data<T>(), dk_.template data<T>(), dv_.template data<T>(),
                           datt_.template data<T>(), a.q.template data<T>(),
                           a.k.template data<T>(), a.v.template data<T>(),
                           a.att.template data<T>(), a.lse.template data<T>(), seq_pos, seq_pos,
                           B, H, Tn, Tn, D, scale);
    MergeQkvGrads(dqkv_.template data<T>(), dq_.template data<T>(), dk_.template data<T>(),
                  dv_.template data<T>(), B, Tn, H, D);
    Zero<T>(dln_);
    cpu::MatmulBackward(dln, G(h + "attn.c_attn.weight"), G(h + "attn.c_attn.bias"),
                        dqkv_.template data<T>(), a.ln1.template data<T>(),
                        P(h + "attn.c_attn.weight"), N, C, 3 * C);
    cpu::LayerNormBackward(dres, G(h + "ln_1.weight"), G(h + "ln_1.bias"), dln, residual,
                           P(h + "ln_1.weight"), a.ln1_mean.template data<T>(),
                           a.ln1_rstd.template data<T>(), N, C);
  }
  cpu::EmbeddingBackward(G("wte"), G("wpe"), dres, tokens_.data(), positions_.data(), N, C);
}

template class GPT2<float>;
template class GPT2<double>;

}  // namespace meshrun
