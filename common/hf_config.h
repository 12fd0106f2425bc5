// The one mapping of a Hugging Face config.json to the job spec's `model:` fields (decision
// 0048): read by the rank for the sizes a submitted spec leaves out under model.init_from, by
// the YAML reader for those a spec file leaves out (where the client can read the folder), and
// by the engine's loader to check the weights against (ReadHuggingFaceConfig is built on it).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "common/job_spec.h"
#include "common/status.h"

namespace meshrun {

// DIR/config.json as the spec's model fields: GPT-2 (n_embd, n_layer, n_head, n_positions,
// vocab_size, layer_norm_epsilon, tie_word_embeddings) or the Llama family (hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, rms_norm_eps,
// rope_theta/rope_scaling or rope_parameters, tie_word_embeddings, attention_bias; seq_len is
// max_position_embeddings, or the spec's default without it). init_from is left empty.
// INVALID_ARGUMENT naming the key when one is missing or not a number, and for what the engine
// does not build (a sliding window on some layers only, o_proj/MLP biases, other rope scalings,
// another head_dim).
// Reads through the rank's confined opens (common/confined_file.h).
StatusOr<ModelSpec> ReadInitFromConfig(const std::string& dir);

// Copies into `out` each field of `file` (ReadInitFromConfig's) that config.json decides and
// `given(field)` says the spec left out: arch, n_layer, n_head, d_model, vocab_size, norm_eps,
// tie_embeddings; for gpt2 seq_len (n_positions); for the Llama family n_kv_head, d_ff,
// attention_bias, rope_theta, sliding_window and rope_scaling (the field name "rope_scaling" stands
// for its five rope_scaling_* fields). Field names are the YAML keys of `model:`.
void FillModelFromConfig(const ModelSpec& file, const std::function<bool(std::string_view)>& given,
                         ModelSpec* out);

}  // namespace meshrun
