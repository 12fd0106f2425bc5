// Gemma's config.json (transformers' GemmaConfig) as the spec's model fields: the keys of the
// Llama layout, head_dim (GemmaConfig's default 256), the tanh GELU, a tied head by default.
#include "common/hf_config_family.h"

namespace meshrun {

Status ReadGemmaConfig(const HfConfigKeys& k, ModelSpec* out) {
  const nlohmann::json& j = k.j;
  MESHRUN_RETURN_IF_ERROR(ReadLlamaLayoutKeys(k, out));
  out->head_dim = 256;  // GemmaConfig's default
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "head_dim", &out->head_dim, false));
  out->tie_embeddings = k.Flag("tie_word_embeddings", true);
  // transformers 5 reads hidden_act; earlier releases hidden_activation first. Both "gelu"
  // (the original releases' value) and "gelu_pytorch_tanh" mean the tanh approximation.
  std::string act = j.value("hidden_act", std::string("gelu_pytorch_tanh"));
  if (j.contains("hidden_activation") && j["hidden_activation"].is_string()) {
    act = j["hidden_activation"].get<std::string>();
  }
  if (act != "gelu_pytorch_tanh" && act != "gelu" && act != "gelu_new") {
    return k.Refuse("hidden_act '" + act + "' is not the tanh GELU",
                    "meshrun's gemma MLP is GeGLU with gelu_pytorch_tanh");
  }
  if (k.Flag("attention_bias", false)) {
    return k.Refuse("attention_bias is true, which in gemma also biases o_proj",
                    "meshrun's gemma has no attention biases");
  }
  if (k.Flag("use_bidirectional_attention", false)) {
    return k.Refuse("use_bidirectional_attention is true",
                    "meshrun trains causal decoders; use a causal gemma");
  }
  return OkStatus();
}

}  // namespace meshrun
