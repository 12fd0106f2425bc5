// The registry of decoder families (architecture.h): one line per family. A new family adds
// its description file and a line here (docs/model.md "Adding an architecture").
#include "common/architecture.h"

namespace meshrun {

const std::vector<Architecture>& Architectures() {
  // In ModelArch order.
  static const std::vector<Architecture> all = {
      Gpt2Architecture(),
      LlamaArchitecture(),
      GemmaArchitecture(),
  };
  return all;
}

const Architecture& ArchitectureOf(ModelArch arch) {
  return Architectures()[static_cast<size_t>(arch)];
}

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture& a : Architectures()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

const Architecture* FindHfModelType(std::string_view model_type) {
  for (const Architecture& a : Architectures()) {
    for (std::string_view t : a.hf_model_types) {
      if (t == model_type) return &a;
    }
  }
  return nullptr;
}

// GPT-2: LayerNorm, learned positions, GELU MLP, biases everywhere, tied head.
Architecture Gpt2Architecture() {
  return {.arch = ModelArch::kGpt2,
          .name = "gpt2",
          .norm = NormKind::kLayerNorm,
          .mlp = MlpKind::kGelu,
          .names = ParamNames::kGpt2,
          .learned_positions = true,
          .linear_biases = true,
          .grouped_query = false,
          .embedding_scale = false,
          .free_head_dim = false,
          .tied_by_default = true,
          .sliding_window = false,
          .hf_model_types = {"gpt2"},
          .hf_class = "GPT2LMHeadModel"};
}

// The Llama family (Llama, Mistral, Qwen2: one shape, their config.json differences in
// hf_config.cc): RMSNorm, rotary positions, SwiGLU, grouped-query attention, untied head.
Architecture LlamaArchitecture() {
  return {.arch = ModelArch::kLlama,
          .name = "llama",
          .norm = NormKind::kRMSNorm,
          .mlp = MlpKind::kSwiGLU,
          .names = ParamNames::kLlama,
          .learned_positions = false,
          .linear_biases = false,
          .grouped_query = true,
          .embedding_scale = false,
          .free_head_dim = false,
          .tied_by_default = false,
          .sliding_window = true,
          .hf_model_types = {"llama", "mistral", "qwen2"},
          .hf_class = "LlamaForCausalLM"};
}

}  // namespace meshrun
