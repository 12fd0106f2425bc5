// The GPT-2 model of CONVENTIONS §3 on one rank: parameter layout, deterministic
// initialisation, forward with saved activations, and backward into flat gradients.
// The step reads in execution order (llm.c style); kernels live in engine/kernels/cpu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/core/tensor.h"

namespace meshrun {

struct GPT2Config {
  int vocab_size = 256;
  int n_layer = 2;
  int n_head = 4;
  int d_model = 64;
  int max_seq_len = 64;  // rows of the position embedding (n_positions)
  double ln_eps = 1e-5;
  bool operator==(const GPT2Config&) const = default;
};

// One parameter tensor inside the flat parameter buffer.
struct ParamInfo {
  std::string name;             // e.g. "h.0.attn.c_attn.weight" (docs/model.md lists them)
  std::vector<int64_t> shape;   // PyTorch layout; Linear weights are (out, in)
  int64_t offset = 0;           // element offset in the flat buffer
  int64_t numel = 0;
  bool decay = false;           // weight decay applies (2+ dims)
  double init_std = 0.0;        // N(0, init_std); 0 → constant init_value
  double init_value = 0.0;
};

// The parameters of the model in their fixed order (the order of the reference script).
std::vector<ParamInfo> GPT2ParamLayout(const GPT2Config& cfg);

// Model FLOPs per token of CONVENTIONS §7: 6·N + 12·n_layer·d_model·seq_len, where N is the
// parameter count without the position embedding.
double GPT2FlopsPerToken(const GPT2Config& cfg, int seq_len);

// The value of element `index` of parameter `name` at initialisation: depends only on
// (seed, name, index), so every mesh starts from the same model.
double InitNormal(uint64_t seed, const std::string& name, int64_t index);

// A GPT-2 with flat parameter and gradient buffers. Owns its parameters, gradients and
// activations. Not thread-safe (one per rank; kernels are parallel inside).
template <typename T>
class GPT2 {
 public:
  explicit GPT2(GPT2Config cfg);

  const GPT2Config& config() const { return cfg_; }
  const std::vector<ParamInfo>& params() const { return layout_; }
  const ParamInfo* FindParam(const std::string& name) const;
  int64_t num_params() const { return num_params_; }
  T* params_data() { return params_.template data<T>(); }
  T* grads_data() { return grads_.template data<T>(); }
  T* param(const ParamInfo& p) { return params_data() + p.offset; }
  T* grad(const ParamInfo& p) { return grads_data() + p.offset; }

  void InitDeterministic(uint64_t seed);
  void ZeroGrad();

  // Forward of B sequences of length T (inputs: B·T token ids). Keeps the activations and the
  // logits (B·T·V) for logits() or a following Backward.
  void Forward(const int32_t* inputs, int B, int seq_len);
  const T* logits() const { return logits_.template data<T>(); }

  // Forward, loss and backward of one micro-batch. Returns the SUM of per-token losses; the
  // gradients receive grad_scale·∂(sum of losses) (grad_scale = 1/tokens of the global batch
  // gives the gradient of the mean loss). Gradients accumulate across calls.
  double ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int seq_len,
                         double grad_scale);

  // Sum of per-token losses of a batch without touching gradients.
  double ForwardLoss(const int32_t* inputs, const int32_t* targets, int B, int seq_len);

 private:
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, q, k, v, att, lse, atty, res2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu, res3;
  };
  void EnsureActivations(int B, int seq_len);
  double Loss(const int32_t* targets, bool with_grad, double grad_scale);
  void Backward();

  GPT2Config cfg_;
  std::vector<ParamInfo> layout_;
  int64_t num_params_ = 0;
  Tensor params_, grads_;

  int B_ = 0, T_ = 0, capacity_tokens_ = 0;
  std::vector<int32_t> tokens_, positions_;
  Tensor encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  std::vector<LayerActs> acts_;
  // Backward scratch.
  Tensor dres_, dln_, dqkv_, dq_, dk_, dv_, datt_, datty_, dfch_, dfch_gelu_, qkv_;
};

extern template class GPT2<float>;
extern template class GPT2<double>;

}  // namespace meshrun
