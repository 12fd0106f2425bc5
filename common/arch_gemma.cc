// Gemma (Hugging Face GemmaForCausalLM, model_type "gemma"): the Llama layout with a GeGLU MLP
// (the tanh GELU), RMSNorms computing x·(1 + w) with w stored as is, token embeddings scaled by
// √hidden_size, heads of head_dim independent of hidden_size/heads, and a tied head. Its
// config.json mapping is hf_config_gemma.cc; its tensor names are the Llama layout's.
#include "common/architecture.h"

namespace meshrun {

Architecture GemmaArchitecture() {
  return {.arch = ModelArch::kGemma,
          .name = "gemma",
          .norm = NormKind::kRMSNormOnePlus,
          .mlp = MlpKind::kGeGLU,
          .names = ParamNames::kLlama,
          .learned_positions = false,
          .linear_biases = false,
          .grouped_query = true,
          .embedding_scale = true,
          .free_head_dim = true,
          .tied_by_default = true,
          .sliding_window = false,
          .hf_model_types = {"gemma"},
          .hf_class = "GemmaForCausalLM"};
}

}  // namespace meshrun
