// Hugging Face checkpoints in and out (docs/checkpoints.md, docs/model.md "Name mappings"):
// `config.json` plus `model.safetensors` or shards listed by `model.safetensors.index.json`,
// in the layout of GPT2LMHeadModel (prefixed `transformer.*` or unprefixed names, Conv1D
// (in, out) weights) or LlamaForCausalLM (also Mistral and Qwen2 of the same shape).
// Reading goes by boxes of the internal tensors, so every rank reads only the byte ranges of
// the slices it holds (its tp shard, and under FSDP its piece of that).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/io/safetensors.h"
#include "engine/model/gpt2.h"

namespace meshrun {

// Reads DIR/config.json into a model config: GPT-2 (n_embd, n_layer, n_head, n_positions,
// vocab_size, layer_norm_epsilon, tie_word_embeddings) or the Llama family (hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, rms_norm_eps,
// rope_theta/rope_scaling or rope_parameters, tie_word_embeddings, attention_bias).
// INVALID_ARGUMENT naming the key when one is missing or not a number, and for what the engine
// does not build (sliding windows, o_proj/MLP biases, other rope scalings, another head_dim).
StatusOr<GPT2Config> ReadHuggingFaceConfig(const std::string& dir);

// INVALID_ARGUMENT naming the spec field when `model` (the spec's) contradicts `file`
// (config.json's), e.g. "model.n_head: the spec says 8 but DIR/config.json has n_head = 12".
Status CheckConfigMatches(const GPT2Config& model, const GPT2Config& file, const std::string& dir);

// The weights of a Hugging Face folder: one safetensors file or the shards of its index, each
// opened once; tensors are read by element ranges (pread).
class HuggingFaceWeights {
 public:
  static StatusOr<HuggingFaceWeights> Open(const std::string& dir, const GPT2Config& cfg);

  // Box `box` (global coordinates of the internal tensor) of parameter `p`, row-major into
  // `out` (product(box.shape) floats), from the tensors it maps to (q|k|v and gate|up are
  // fused inside, Conv1D weights transposed).
  Status ReadBox(const ParamInfo& p, const Box& box, float* out) const;
  // Every box of p (its tp-local tensor) into out (p.numel floats).
  Status ReadParam(const ParamInfo& p, float* out) const;
  // That every file tensor p maps to is present with the shape p.global_shape needs; reads
  // nothing but the headers read at Open.
  Status CheckParam(const ParamInfo& p) const;

 private:
  struct Source;  // a run of internal rows from one file tensor
  std::vector<Source> SourcesOf(const ParamInfo& p) const;
  StatusOr<const SafetensorsFile*> CheckSource(const ParamInfo& p, const Source& s) const;
  StatusOr<const SafetensorsFile*> FileOf(const std::string& name) const;

  std::string dir_;
  GPT2Config cfg_;
  std::string prefix_;  // gpt2: "transformer." or ""; llama: "model."
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor name → files_ index
};

// The one check of a model.init_from folder, run by `meshrun validate` and `train` before any
// data is read, and by every rank before it loads its slices: config.json of a model_type
// meshrun builds with every key it needs (ReadHuggingFaceConfig), agreeing with `cfg`
// (CheckConfigMatches), model.safetensors or every shard its index lists present and complete
// (headers whose data lies inside the file), and every tensor of the model there with its
// shape. INVALID_ARGUMENT naming model.init_from (or the contradicting model field).
StatusOr<HuggingFaceWeights> OpenHuggingFaceChecked(const std::string& dir, const GPT2Config& cfg);

// Loads DIR into `model` (which owns its storage), after OpenHuggingFaceChecked.
Status LoadHuggingFace(const std::string& dir, GPT2<float>* model);

// What a Hugging Face folder says of itself beyond the shapes, which an export of a model
// trained from it keeps: a JSON object with (each only when the folder gives it) "model_type",
// "architectures", "dtype" (torch_dtype or dtype of config.json), "dtype_key" (which of the two
// it used), "bos_token_id", "eos_token_id", "pad_token_id" (config.json's, as written: a number,
// a list or null), "max_position_embeddings" and "generation_config" (generation_config.json's
// object). Empty object when
// DIR/config.json cannot be read. The trainer records it in each checkpoint's metadata
// (trainer_json "source") when the job has model.init_from.
nlohmann::json ReadHuggingFaceIdentity(const std::string& dir);

// The identity an export of a checkpoint keeps: its metadata's trainer_json "source" (recorded
// while training), else that of `init_from` read now (checkpoints written before the trainer
// recorded it), else an empty object (trained from scratch).
nlohmann::json CheckpointSourceIdentity(const std::string& trainer_json,
                                        const std::string& init_from);

// How ExportHuggingFace writes: the file size cap, the weights' dtype (F32, BF16 or F16), the
// source's identity (ReadHuggingFaceIdentity; empty: meshrun's own names and ids) and the job
// tokenizer's end-of-text id (-1: none), the eos id when the identity gives none.
struct HuggingFaceExportOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;
  DType dtype = DType::kF32;
  nlohmann::json identity = nlohmann::json::object();
  int32_t end_of_text_id = -1;
};

// The dtype an export writes: `requested` is "source" (the identity's dtype, float32 when it
// names none), "float32"/"fp32", "bfloat16"/"bf16" or "float16"/"fp16". INVALID_ARGUMENT
// naming --dtype for anything else.
StatusOr<DType> ExportDType(const std::string& requested, const nlohmann::json& identity);

// Writes DIR/config.json, DIR/generation_config.json and the weights in the layout of the
// config's architecture (GPT2LMHeadModel, or LlamaForCausalLM and the classes of its family:
// the identity's MistralForCausalLM, Qwen2ForCausalLM), atomically: one model.safetensors, or
// shards model-0000K-of-0000N.safetensors with model.safetensors.index.json when the weights
// exceed `max_shard_bytes`. `params` holds the flat parameters of GPT2ParamLayout(cfg) (tp 1);
// they are rearranged in place (Conv1D transposes, q/k/v and gate/up split), one tensor at a
// time. The special token ids are the identity's; without one, eos (and GPT-2's bos) is the
// tokenizer's end-of-text id, else vocab_size − 1, and Llama's bos 0.
Status ExportHuggingFace(const GPT2Config& cfg, float* params, const std::string& dir,
                         const HuggingFaceExportOptions& options);
inline Status ExportHuggingFace(const GPT2Config& cfg, float* params, const std::string& dir,
                                int64_t max_shard_bytes = int64_t{5} << 30) {
  HuggingFaceExportOptions options;
  options.max_shard_bytes = max_shard_bytes;
  return ExportHuggingFace(cfg, params, dir, options);
}

}  // namespace meshrun
