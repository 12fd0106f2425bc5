// Whole-model gradients in float64 against central finite differences, and the float32 model
// against the float64 one: GPT-2 (tied and untied head) and Llama (grouped-query attention,
// rotary embeddings with llama3 scaling, q/k/v biases, SwiGLU, untied head).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/model/gpt2.h"

namespace meshrun {
namespace {

GPT2Config TinyConfig() {
  GPT2Config cfg;
  cfg.vocab_size = 11;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.d_model = 8;
  cfg.max_seq_len = 5;
  return cfg;
}

GPT2Config TinyLlama(bool bias) {
  GPT2Config cfg = TinyConfig();
  cfg.arch = Arch::kLlama;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.d_ff = 12;
  cfg.tie_embeddings = false;
  cfg.attention_bias = bias;
  cfg.rope_theta = 500000.0;
  cfg.rope_scaling.llama3 = true;
  cfg.rope_scaling.factor = 8.0;
  cfg.rope_scaling.original_max_position_embeddings = 4;
  return cfg;
}

// Gemma: GeGLU, (1 + w) RMSNorm, embeddings × √d_model, heads 6 wide while d_model/n_head is 2,
// grouped-query attention, tied head.
GPT2Config TinyGemma() {
  GPT2Config cfg = TinyConfig();
  cfg.arch = Arch::kGemma;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.attn_head_dim = 6;
  cfg.d_ff = 12;
  cfg.tie_embeddings = true;
  return cfg;
}

GPT2Config Untied() {
  GPT2Config cfg = TinyConfig();
  cfg.tie_embeddings = false;
  return cfg;
}

class ModelGrad : public ::testing::TestWithParam<int> {
 protected:
  GPT2Config Config() const {
    switch (GetParam()) {
      case 0: return TinyConfig();
      case 1: return Untied();
      case 2: return TinyLlama(false);
      case 3: return TinyLlama(true);
      default: return TinyGemma();
    }
  }
};

// Random but non-degenerate weights (LayerNorm gains away from 1, non-zero biases) so every
// gradient path is exercised.
template <typename T>
void RandomWeights(GPT2<T>& model, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const ParamInfo& p : model.params()) {
    const bool gain = p.init_std == 0.0 && p.init_value == 1.0;
    for (int64_t i = 0; i < p.numel; ++i) {
      model.param(p)[i] = static_cast<T>(gain ? 1.0 + 0.2 * nd(rng) : 0.3 * nd(rng));
    }
  }
}

TEST_P(ModelGrad, MatchesFiniteDifferencesInFloat64) {
  const GPT2Config cfg = Config();
  GPT2<double> model(cfg);
  RandomWeights(model, 7);
  const int B = 2, T = 5;
  std::vector<int32_t> in = {1, 4, 2, 9, 0, 3, 3, 10, 7, 5};
  std::vector<int32_t> tg = {4, 2, 9, 0, 6, 3, 10, 7, 5, 1};
  const double scale = 1.0 / (B * T);
  model.ZeroGrad();
  const double loss = *model.ForwardBackward(in.data(), tg.data(), B, T, scale) * scale;
  EXPECT_GT(loss, 0.0);

  std::vector<double> analytic(model.grads_data(), model.grads_data() + model.num_params());
  const double h = 1e-6;
  int checked = 0;
  for (const ParamInfo& p : model.params()) {
    // Every element of small tensors, a strided sample of larger ones.
    const int64_t stride = std::max<int64_t>(1, p.numel / 24);
    for (int64_t i = 0; i < p.numel; i += stride) {
      double* w = model.param(p) + i;
      const double saved = *w;
      *w = saved + h;
      const double lp = *model.ForwardLoss(in.data(), tg.data(), B, T) * scale;
      *w = saved - h;
      const double lm = *model.ForwardLoss(in.data(), tg.data(), B, T) * scale;
      *w = saved;
      const double numeric = (lp - lm) / (2 * h);
      const double a = analytic[p.offset + i];
      EXPECT_NEAR(a, numeric, 1e-6 + 1e-5 * std::fabs(numeric)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 250);  // the tied Gemma has the fewest tensors: 262
}

TEST_P(ModelGrad, Float32TracksFloat64) {
  const GPT2Config cfg = Config();
  GPT2<double> m64(cfg);
  GPT2<float> m32(cfg);
  RandomWeights(m64, 3);
  for (int64_t i = 0; i < m64.num_params(); ++i) {
    m32.params_data()[i] = static_cast<float>(m64.params_data()[i]);
  }
  std::vector<int32_t> in = {1, 4, 2, 9, 0, 3, 3, 10, 7, 5};
  std::vector<int32_t> tg = {4, 2, 9, 0, 6, 3, 10, 7, 5, 1};
  m64.ZeroGrad();
  m32.ZeroGrad();
  const double l64 = *m64.ForwardBackward(in.data(), tg.data(), 2, 5, 0.1);
  const double l32 = *m32.ForwardBackward(in.data(), tg.data(), 2, 5, 0.1);
  EXPECT_NEAR(l32, l64, 1e-4 * std::fabs(l64));
  double max_diff = 0, max_abs = 0;
  for (int64_t i = 0; i < m64.num_params(); ++i) {
    max_diff = std::max(max_diff, std::fabs(m32.grads_data()[i] - m64.grads_data()[i]));
    max_abs = std::max(max_abs, std::fabs(m64.grads_data()[i]));
  }
  EXPECT_LT(max_diff, 1e-4 * max_abs);
}

std::string ArchName(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"Gpt2", "Gpt2Untied", "Llama", "LlamaBias", "Gemma"};
  return kNames[info.param];
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelGrad, ::testing::Values(0, 1, 2, 3, 4), ArchName);

TEST(GPT2Init, DependsOnlyOnSeedNameAndIndex) {
  GPT2Config cfg = TinyConfig();
  GPT2<float> a(cfg), b(cfg);
  a.InitDeterministic(1337);
  b.InitDeterministic(1337);
  for (int64_t i = 0; i < a.num_params(); ++i) ASSERT_EQ(a.params_data()[i], b.params_data()[i]);
  // The same parameter in a deeper model starts identically (name + index, not position).
  GPT2Config deeper = cfg;
  deeper.n_layer = 3;
  GPT2<float> c(deeper);
  c.InitDeterministic(1337);
  const ParamInfo* pa = a.FindParam("h.1.mlp.c_fc.weight");
  const ParamInfo* pc = c.FindParam("h.1.mlp.c_fc.weight");
  for (int64_t i = 0; i < pa->numel; ++i) ASSERT_EQ(a.param(*pa)[i], c.param(*pc)[i]);
  // Statistics: weights N(0, 0.02), projections scaled by 1/sqrt(2·n_layer), LN ones.
  const ParamInfo* wte = a.FindParam("wte");
  double sum2 = 0;
  for (int64_t i = 0; i < wte->numel; ++i) sum2 += a.param(*wte)[i] * a.param(*wte)[i];
  EXPECT_NEAR(std::sqrt(sum2 / wte->numel), 0.02, 0.006);
  EXPECT_EQ(a.param(*a.FindParam("ln_f.weight"))[0], 1.0f);
  EXPECT_EQ(a.param(*a.FindParam("h.0.attn.c_attn.bias"))[0], 0.0f);
}

TEST(GPT2Flops, FollowsConventionsFormula) {
  GPT2Config cfg;
  cfg.vocab_size = 50257;
  cfg.n_layer = 12;
  cfg.n_head = 12;
  cfg.d_model = 768;
  cfg.max_seq_len = 1024;
  // GPT-2 124M: 124,439,808 parameters, 786,432 of them in wpe.
  const double n = 124439808.0 - 786432.0;
  EXPECT_DOUBLE_EQ(GPT2FlopsPerToken(cfg, 1024), 6 * n + 12.0 * 12 * 768 * 1024);
}

}  // namespace
}  // namespace meshrun
