// What a family's config.json mapping is written with (hf_config.cc holds the table of mappings,
// one per registered family in ModelArch order; a family's own mapping may live in its own file).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/job_spec.h"
#include "common/status.h"

namespace meshrun {

// One config.json: its object, its path (for messages) and its model_type.
struct HfConfigKeys {
  const nlohmann::json& j;
  std::string path;
  std::string type;

  // obj[key] into *out; absent or null: OK when !required (out untouched), else the error that
  // names the key; not a number: the error that says so.
  template <typename V>
  Status Number(const nlohmann::json& obj, const char* key, V* out, bool required) const {
    if (!obj.contains(key) || obj[key].is_null()) return required ? Missing(key) : OkStatus();
    if (!obj[key].is_number()) return NotANumber(key);
    *out = obj[key].get<V>();
    return OkStatus();
  }
  bool Flag(const char* key, bool fallback) const;
  // INVALID_ARGUMENT "model.init_from: PATH: WHAT (hint: HINT)".
  Status Refuse(const std::string& what, const std::string& hint) const;
  Status Missing(const char* key) const;
  Status NotANumber(const char* key) const;
};

// The keys every family of the Llama layout shares: hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, rms_norm_eps,
// max_position_embeddings (seq_len), no mlp_bias, and the rotary keys (ReadRotaryKeys).
Status ReadLlamaLayoutKeys(const HfConfigKeys& keys, ModelSpec* out);
// rope_theta and rope_scaling (transformers 4) or rope_parameters (5).
Status ReadRotaryKeys(const HfConfigKeys& keys, ModelSpec* out);

// The families' mappings that live in their own files.
Status ReadGemmaConfig(const HfConfigKeys& keys, ModelSpec* out);  // hf_config_gemma.cc

}  // namespace meshrun
