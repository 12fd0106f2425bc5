// The one mapping of config.json to the spec's model fields (see hf_config.h).
#include "common/hf_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/confined_file.h"
#include "common/hf_config_family.h"

namespace meshrun {
namespace {

StatusOr<nlohmann::json> ReadConfigJson(const std::string& path) {
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path));
  std::ifstream in(name.name());
  if (!in) {
    return InvalidArgumentError("model.init_from: " + path +
                                " cannot be read (hint: point init_from at a Hugging Face folder "
                                "with config.json and model.safetensors)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("model.init_from: " + path + " is not a JSON object");
  }
  return j;
}

}  // namespace

Status HfConfigKeys::Refuse(const std::string& what, const std::string& hint) const {
  return InvalidArgumentError("model.init_from: " + path + ": " + what + " (hint: " + hint + ")");
}

bool HfConfigKeys::Flag(const char* key, bool fallback) const {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

Status HfConfigKeys::Missing(const char* key) const {
  return InvalidArgumentError("model.init_from: " + path + " has no '" + key + "' (hint: a " +
                              "model_type '" + type +
                              "' config.json needs it; re-create the folder with "
                              "transformers' save_pretrained or `meshrun export`)");
}

Status HfConfigKeys::NotANumber(const char* key) const {
  return InvalidArgumentError("model.init_from: " + path + ": '" + key +
                              "' is not a number (hint: write it as a number)");
}

Status ReadRotaryKeys(const HfConfigKeys& k, ModelSpec* cfg) {
  const nlohmann::json& j = k.j;
  // rope_theta + rope_scaling (transformers 4) or rope_parameters holding both (transformers 5).
  const bool v5 = j.contains("rope_parameters") && j["rope_parameters"].is_object();
  const nlohmann::json& params = v5 ? j["rope_parameters"] : j;
  MESHRUN_RETURN_IF_ERROR(k.Number(params, "rope_theta", &cfg->rope_theta, false));
  const nlohmann::json scaling =
      v5 ? j["rope_parameters"] : j.value("rope_scaling", nlohmann::json());
  if (scaling.is_object()) {
    std::string kind = scaling.value("rope_type", std::string());
    if (kind.empty()) kind = scaling.value("type", std::string("default"));
    if (kind == "llama3") {
      cfg->rope_scaling_type = "llama3";
      MESHRUN_RETURN_IF_ERROR(k.Number(scaling, "factor", &cfg->rope_scaling_factor, true));
      MESHRUN_RETURN_IF_ERROR(
          k.Number(scaling, "low_freq_factor", &cfg->rope_scaling_low_freq_factor, true));
      MESHRUN_RETURN_IF_ERROR(
          k.Number(scaling, "high_freq_factor", &cfg->rope_scaling_high_freq_factor, true));
      MESHRUN_RETURN_IF_ERROR(k.Number(scaling, "original_max_position_embeddings",
                                       &cfg->rope_scaling_original_max_position_embeddings, true));
    } else if (kind != "default") {
      return k.Refuse("rope scaling of type '" + kind + "' is not built",
                      "meshrun knows rope_scaling type llama3");
    }
  }
  return OkStatus();
}

Status ReadLlamaLayoutKeys(const HfConfigKeys& k, ModelSpec* cfg) {
  const nlohmann::json& j = k.j;
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "hidden_size", &cfg->d_model, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "num_hidden_layers", &cfg->n_layer, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "num_attention_heads", &cfg->n_head, true));
  cfg->n_kv_head = cfg->n_head;
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "num_key_value_heads", &cfg->n_kv_head, false));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "intermediate_size", &cfg->d_ff, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "vocab_size", &cfg->vocab_size, true));
  cfg->norm_eps = 1e-6;  // transformers' default for these families
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "rms_norm_eps", &cfg->norm_eps, false));
  // The longest context it was made for (generation's window; training uses model.seq_len).
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "max_position_embeddings", &cfg->seq_len, false));
  if (k.Flag("mlp_bias", false)) {
    return k.Refuse("mlp_bias is true", "meshrun's gated MLPs have no biases");
  }
  return ReadRotaryKeys(k, cfg);
}

namespace {

// The Llama family: Llama, Mistral (a sliding window) and Qwen2 (q/k/v biases, a window on some
// layers).
Status ReadLlamaFamilyConfig(const HfConfigKeys& k, ModelSpec* out) {
  const nlohmann::json& j = k.j;
  const std::string& type = k.type;
  auto refuse = [&](const std::string& what, const std::string& hint) {
    return k.Refuse(what, hint);
  };
  auto number = [&](const nlohmann::json& obj, const char* key, auto* value, bool required) {
    return k.Number(obj, key, value, required);
  };
  auto flag = [&](const char* key, bool fallback) { return k.Flag(key, fallback); };
  ModelSpec& cfg = *out;
  MESHRUN_RETURN_IF_ERROR(ReadLlamaLayoutKeys(k, out));
  cfg.tie_embeddings = flag("tie_word_embeddings", false);
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") {
    return refuse("hidden_act '" + act + "' is not silu", "meshrun's llama MLP is SwiGLU");
  }
  if (j.contains("head_dim") && j["head_dim"].is_number() &&
      j["head_dim"].get<int64_t>() != cfg.d_model / std::max(1, cfg.n_head)) {
    return refuse("head_dim " + j["head_dim"].dump() + " is not hidden_size/num_attention_heads",
                  "meshrun's llama heads are d_model/n_head wide");
  }
  // Sliding windows (as transformers reads them): Mistral's sliding_window on every layer
  // (null: none); Qwen2's only with use_sliding_window, on the layers from max_window_layers on.
  const bool has_window = j.contains("sliding_window") && !j["sliding_window"].is_null();
  if (type == "mistral" && has_window) {
    MESHRUN_RETURN_IF_ERROR(number(j, "sliding_window", &cfg.sliding_window, false));
  }
  if (type == "qwen2" && flag("use_sliding_window", false) && has_window) {
    int first = 28;  // transformers' default max_window_layers
    MESHRUN_RETURN_IF_ERROR(number(j, "max_window_layers", &first, false));
    if (first == 0) {
      MESHRUN_RETURN_IF_ERROR(number(j, "sliding_window", &cfg.sliding_window, false));
    } else if (first < cfg.n_layer) {
      return refuse("use_sliding_window is true with max_window_layers " + std::to_string(first) +
                        " of " + std::to_string(cfg.n_layer) + " layers",
                    "meshrun applies a sliding window to every layer or to none; set "
                    "max_window_layers to 0 (every layer) or to num_hidden_layers (none)");
    }
  }
  if (cfg.sliding_window < 0) {
    return refuse("sliding_window " + j["sliding_window"].dump() + " is negative",
                  "use null (no window) or a positive number of keys");
  }
  if (type == "qwen2") {
    cfg.attention_bias = true;  // Qwen2: biases on q, k and v, none on o_proj
  } else if (flag("attention_bias", false)) {
    return refuse("attention_bias is true, which in " + type + " also biases o_proj",
                  "meshrun's attention_bias covers q, k and v only (as Qwen2 has)");
  }
  return OkStatus();
}

Status ReadGpt2Config(const HfConfigKeys& k, ModelSpec* out) {
  const nlohmann::json& j = k.j;
  ModelSpec& cfg = *out;
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "n_embd", &cfg.d_model, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "n_layer", &cfg.n_layer, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "n_head", &cfg.n_head, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "n_positions", &cfg.seq_len, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "vocab_size", &cfg.vocab_size, true));
  MESHRUN_RETURN_IF_ERROR(k.Number(j, "layer_norm_epsilon", &cfg.norm_eps, false));
  cfg.n_kv_head = cfg.n_head;
  cfg.d_ff = 0;  // 4·d_model
  cfg.tie_embeddings = k.Flag("tie_word_embeddings", true);
  if (j.contains("n_inner") && j["n_inner"].is_number() && j["n_inner"] != 4 * cfg.d_model) {
    return k.Refuse("n_inner " + j["n_inner"].dump() + " is not 4·n_embd",
                    "meshrun's gpt2 has an MLP of 4·d_model");
  }
  return OkStatus();
}

// Each family's config.json mapping, in ModelArch order (the registry's, architecture.h).
using HfConfigMapping = Status (*)(const HfConfigKeys&, ModelSpec*);
const HfConfigMapping kHfConfigMappings[] = {
    ReadGpt2Config, ReadLlamaFamilyConfig,
    ReadGemmaConfig,  // hf_config_gemma.cc
};
static_assert(std::size(kHfConfigMappings) == static_cast<size_t>(ModelArch::kGemma) + 1);

}  // namespace

StatusOr<ModelSpec> ReadInitFromConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  MESHRUN_ASSIGN_OR_RETURN(nlohmann::json j, ReadConfigJson(path));
  if (j.contains("model_type") && !j["model_type"].is_string()) {
    return InvalidArgumentError(
        "model.init_from: " + path +
        ": 'model_type' is not a string (hint: e.g. \"gpt2\" or \"llama\")");
  }
  const std::string type = j.value("model_type", std::string("gpt2"));
  const HfConfigKeys keys{j, path, type};
  const Architecture* family = FindHfModelType(type);
  if (family == nullptr) {
    std::string classes;
    for (const Architecture& a : Architectures()) {
      for (std::string_view t : a.hf_model_types) {
        classes += (classes.empty() ? "" : ", ") + std::string(t);
      }
    }
    return keys.Refuse("model_type '" + type + "' is not one meshrun builds",
                       "use a folder of model_type " + classes);
  }
  ModelSpec cfg;
  cfg.init_from.clear();
  cfg.arch = std::string(family->name);
  MESHRUN_RETURN_IF_ERROR(kHfConfigMappings[static_cast<size_t>(family->arch)](keys, &cfg));
  return cfg;
}

void FillModelFromConfig(const ModelSpec& file, const std::function<bool(std::string_view)>& given,
                         ModelSpec* out) {
  const bool llama = !file.family().learned_positions;
  auto fill = [&](std::string_view field, auto member) {
    if (!given(field)) out->*member = file.*member;
  };
  fill("arch", &ModelSpec::arch);
  fill("n_layer", &ModelSpec::n_layer);
  fill("n_head", &ModelSpec::n_head);
  fill("d_model", &ModelSpec::d_model);
  fill("vocab_size", &ModelSpec::vocab_size);
  fill("norm_eps", &ModelSpec::norm_eps);
  fill("tie_embeddings", &ModelSpec::tie_embeddings);
  // GPT-2's learned positions bound the sequence; the Llama family's max_position_embeddings
  // is the longest context it was made for, not a training length.
  if (!llama) {
    fill("seq_len", &ModelSpec::seq_len);
    return;
  }
  fill("n_kv_head", &ModelSpec::n_kv_head);
  fill("d_ff", &ModelSpec::d_ff);
  fill("attention_bias", &ModelSpec::attention_bias);
  fill("rope_theta", &ModelSpec::rope_theta);
  fill("sliding_window", &ModelSpec::sliding_window);
  fill("head_dim", &ModelSpec::head_dim);
  if (!given("rope_scaling")) {
    out->rope_scaling_type = file.rope_scaling_type;
    out->rope_scaling_factor = file.rope_scaling_factor;
    out->rope_scaling_low_freq_factor = file.rope_scaling_low_freq_factor;
    out->rope_scaling_high_freq_factor = file.rope_scaling_high_freq_factor;
    out->rope_scaling_original_max_position_embeddings =
        file.rope_scaling_original_max_position_embeddings;
  }
}

}  // namespace meshrun
