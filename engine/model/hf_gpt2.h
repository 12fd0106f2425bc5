// Hugging Face GPT-2 layout (docs/checkpoints.md): `model.safetensors` + `config.json` with
// `transformer.*` names and Conv1D (in, out) weights. Loads one into a GPT2 (model.init_from)
// and writes one from a GPT2 (meshrun export).
#pragma once

#include <string>

#include "common/status.h"
#include "engine/model/gpt2.h"

namespace meshrun {

// Reads DIR/config.json into a GPT2Config (n_embd, n_layer, n_head, n_positions, vocab_size,
// layer_norm_epsilon). INVALID_ARGUMENT naming the key when one is missing or not a number.
StatusOr<GPT2Config> ReadHuggingFaceConfig(const std::string& dir);

// Loads DIR/model.safetensors (float32 or bf16) into `model`, whose config must equal the
// folder's config.json (INVALID_ARGUMENT naming the field otherwise).
Status LoadHuggingFaceGPT2(const std::string& dir, GPT2<float>* model);

// Writes DIR/model.safetensors and DIR/config.json (created if needed), atomically.
// `params` holds the model's flat parameters in GPT2ParamLayout(cfg) order; the Conv1D weights
// are transposed in place, one at a time (peak memory: the model and its largest tensor).
Status ExportHuggingFaceGPT2(const GPT2Config& cfg, float* params, const std::string& dir);

// The Hugging Face name of an internal parameter name ("h.0.attn.c_attn.weight" →
// "transformer.h.0.attn.c_attn.weight") and whether its layout is transposed (Conv1D).
std::string HuggingFaceName(const std::string& name);
bool IsConv1DWeight(const std::string& name);

}  // namespace meshrun
