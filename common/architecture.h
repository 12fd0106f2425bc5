// The decoder architectures meshrun builds, as data (docs/model.md "Adding an architecture"):
// each family describes its parts once here (norm, MLP, positions, biases, embedding scale, head)
// and registers in architectures.cc; the engine's one transformer (engine/model/gpt2.h) reads the
// description instead of asking which family it is, the spec accepts `model.arch` from the
// registry, and the Hugging Face mapping (common/hf_config.cc, engine/model/hf_checkpoint.cc)
// reads the family's config.json keys and tensor names through it.
#pragma once

#include <string_view>
#include <vector>

namespace meshrun {

// model.arch, one value per registered family (architectures.cc).
enum class ModelArch { kGpt2, kLlama, kGemma };

// The norm before attention, before the MLP and at the end: LayerNorm (weight and bias),
// RMSNorm x·w (Llama), or RMSNorm x·(1 + w) with w stored as is (Gemma; w starts at 0).
enum class NormKind { kLayerNorm, kRMSNorm, kRMSNormOnePlus };
// The MLP: fc → GELU (tanh) → proj (GPT-2), or a gated unit over fused gate|up rows →
// down: SwiGLU silu(g)·u (Llama), GeGLU gelu_tanh(g)·u (Gemma).
enum class MlpKind { kGelu, kSwiGLU, kGeGLU };
// Internal parameter names (docs/model.md "Name mappings"): GPT-2's (wte, h.N.attn.c_attn, ...)
// or the Llama layout's (embed_tokens, layers.N.self_attn.qkv, mlp.gate_up, norm), which map to
// Hugging Face's model.* names.
enum class ParamNames { kGpt2, kLlama };

struct Architecture {
  ModelArch arch;
  std::string_view name;  // model.arch
  NormKind norm;
  MlpKind mlp;
  ParamNames names;
  // Positions: a learned table (GPT-2's wpe, n_positions rows) or rotary (rope_theta,
  // rope_scaling) on q and k.
  bool learned_positions;
  // Biases on every linear layer (GPT-2); without, only model.attention_bias's q/k/v biases.
  bool linear_biases;
  // Grouped-query attention (model.n_kv_head) and a free MLP width (model.d_ff); without, n_head
  // key/value heads and 4·d_model units.
  bool grouped_query;
  // Token embeddings multiplied by √d_model, the factor rounded to the compute dtype (Gemma).
  bool embedding_scale;
  // model.head_dim may differ from d_model/n_head (q/k/v/o are n_head·head_dim wide).
  bool free_head_dim;
  // model.tie_embeddings when the spec leaves it out (as the family's checkpoints are).
  bool tied_by_default;
  // model.sliding_window is accepted: the family's Hugging Face class (or the one its export
  // writes, Mistral's for the Llama layout) holds a window, so init_from and export carry it.
  bool sliding_window;
  // Hugging Face: the model_type values of config.json read as this family (the first is what an
  // export writes unless the family's exporter says otherwise) and the class an export names.
  std::vector<std::string_view> hf_model_types;
  std::string_view hf_class;
};

// Every registered family, in ModelArch order.
const std::vector<Architecture>& Architectures();
const Architecture& ArchitectureOf(ModelArch arch);
// The family named `name` (model.arch), or whose hf_model_types hold `model_type`: null if none.
const Architecture* FindArchitecture(std::string_view name);
const Architecture* FindHfModelType(std::string_view model_type);

// The families' descriptions, one function per family file (architectures.cc lists them).
Architecture Gpt2Architecture();
Architecture LlamaArchitecture();
Architecture GemmaArchitecture();  // arch_gemma.cc

}  // namespace meshrun
