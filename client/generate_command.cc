// `meshrun generate`: loads the model (a Hugging Face folder of a GPT-2 or Llama-family model,
// e.g. one `meshrun export` wrote, or a checkpoint), encodes the
// prompt with the job's tokenizer (--tokenizer, else the model folder's tokenizer.json, else the
// checkpoint spec's data.tokenizer) or else as bytes (token id = byte value, the byte-level
// vocabulary of text data), decodes the continuation the same way.
#include "client/generate_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "client/command.h"
#include "client/train_command.h"
#include "common/job_spec_yaml.h"
#include "engine/data/tokenizer.h"
#include "engine/io/checkpoint.h"
#include "engine/model/generate.h"
#include "engine/model/hf_checkpoint.h"

namespace meshrun::client {

namespace {

struct GenerateFlags {
  std::string model, checkpoint, prompt, tokenizer, output = "text";
  SamplingOptions sampling;
};

// The model; *spec_tokenizer: a checkpoint spec's data.tokenizer.
StatusOr<std::unique_ptr<GPT2<float>>> LoadModel(const GenerateFlags& o,
                                                 std::string* spec_tokenizer = nullptr) {
  if (!o.model.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(GPT2Config cfg, ReadHuggingFaceConfig(o.model));
    auto model = std::make_unique<GPT2<float>>(cfg);
    MESHRUN_RETURN_IF_ERROR(LoadHuggingFace(o.model, model.get()));
    return model;
  }
  MESHRUN_ASSIGN_OR_RETURN(std::string step_dir, ResolveCheckpoint(o.checkpoint, "--checkpoint"));
  MESHRUN_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpecYaml(reader.metadata().job_spec_yaml, {},
                                                          step_dir + "/metadata.json (job spec)"));
  if (spec_tokenizer != nullptr) *spec_tokenizer = spec.data.tokenizer;
  const GPT2Config cfg = GPT2ConfigOf(spec.model);
  auto model = std::make_unique<GPT2<float>>(cfg);
  for (const ParamInfo& p : model->params()) {
    MESHRUN_RETURN_IF_ERROR(reader.ReadTensor("model/" + p.name, model->param(p)));
  }
  return model;
}

// The tokenizer folder to use (see the file comment); empty: bytes.
std::string TokenizerDir(const GenerateFlags& o, const std::string& spec_tokenizer) {
  if (!o.tokenizer.empty()) return o.tokenizer;
  std::error_code ec;
  if (!o.model.empty() && std::filesystem::is_regular_file(o.model + "/tokenizer.json", ec)) {
    return o.model;
  }
  return spec_tokenizer;
}

// Encodes the prompt, generates, decodes: with `tokenizer`, else as bytes.
StatusOr<std::pair<std::vector<int32_t>, std::vector<int32_t>>> Continue(
    GPT2<float>& model, const Tokenizer* tokenizer, const std::string& prompt_text,
    const SamplingOptions& sampling, std::string* text) {
  std::vector<int32_t> prompt;
  if (tokenizer != nullptr) {
    StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(prompt_text);
    if (!ids.ok()) return InvalidArgumentError("--prompt: " + ids.status().message());
    prompt = std::move(ids).value();
  } else {
    for (unsigned char c : prompt_text) prompt.push_back(c);
  }
  MESHRUN_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, Generate(model, prompt, sampling));
  text->clear();
  if (tokenizer != nullptr) {
    *text = tokenizer->Decode(tokens);
  } else {
    for (int32_t t : tokens) text->push_back(t < 256 ? static_cast<char>(t) : '?');
  }
  return std::make_pair(std::move(prompt), std::move(tokens));
}

int RunGenerate(const GenerateFlags& o) {
  if (o.model.empty() == o.checkpoint.empty()) {
    return ReportError(InvalidArgumentError(
        "--model/--checkpoint: give exactly one (hint: --model DIR for an exported folder, "
        "--checkpoint CKPT for a step folder or a checkpoint.dir)"));
  }
  std::string spec_tokenizer;
  StatusOr<std::unique_ptr<GPT2<float>>> model = LoadModel(o, &spec_tokenizer);
  if (!model.ok()) return ReportError(model.status());
  const int model_vocab = (*model)->config().vocab_size;
  std::shared_ptr<const Tokenizer> tokenizer;
  if (const std::string dir = TokenizerDir(o, spec_tokenizer); !dir.empty()) {
    StatusOr<std::shared_ptr<const Tokenizer>> loaded = Tokenizer::Load(dir);
    if (!loaded.ok()) {
      return ReportError(InvalidArgumentError("--tokenizer: " + loaded.status().message()));
    }
    tokenizer = *loaded;
    if (tokenizer->vocab_size() > model_vocab) {
      return ReportError(InvalidArgumentError(
          "--tokenizer: " + dir + " has a vocabulary of " +
          std::to_string(tokenizer->vocab_size()) + " but the model's vocab_size is " +
          std::to_string(model_vocab) + " (hint: pass the tokenizer the model was trained with)"));
    }
  } else if (model_vocab < 256) {
    return ReportError(InvalidArgumentError(
        "--prompt: the model's vocabulary has " + std::to_string(model_vocab) +
        " tokens, fewer than the 256 byte values the prompt is encoded with (hint: pass "
        "--tokenizer DIR)"));
  }
  std::string text;
  auto result = Continue(**model, tokenizer.get(), o.prompt, o.sampling, &text);
  if (!result.ok()) return ReportError(result.status());
  const auto& [prompt, tokens] = *result;
  if (o.output == "json") {
    nlohmann::json out = {
        {"prompt", o.prompt}, {"prompt_tokens", prompt}, {"tokens", tokens}, {"text", text}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s%s\n", PrintableText(o.prompt).c_str(), PrintableText(text).c_str());
  }
  return kExitOk;
}

}  // namespace

StatusOr<std::string> SampleFromModel(const std::string& model_dir, const std::string& prompt,
                                      int new_tokens) {
  GenerateFlags o;
  o.model = model_dir;
  o.sampling.max_new_tokens = new_tokens;
  o.sampling.temperature = 0.8;
  o.sampling.top_k = 40;
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<GPT2<float>> model, LoadModel(o));
  std::shared_ptr<const Tokenizer> tokenizer;
  if (const std::string dir = TokenizerDir(o, ""); !dir.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(tokenizer, Tokenizer::Load(dir));
  }
  std::string text;
  MESHRUN_RETURN_IF_ERROR(Continue(*model, tokenizer.get(), prompt, o.sampling, &text).status());
  return PrintableText(prompt + text);
}

std::string PrintableText(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

void RegisterGenerateCommand(CLI::App& app, CommandResult& result) {
  auto o = std::make_shared<GenerateFlags>();
  CLI::App* cmd =
      app.add_subcommand("generate", "Continue a prompt with an exported model or a checkpoint");
  cmd->add_option("--model", o->model,
                  "a Hugging Face folder: GPT2LMHeadModel or LlamaForCausalLM (also Mistral, "
                  "Qwen2), e.g. one `meshrun export` wrote");
  cmd->add_option("--checkpoint", o->checkpoint, "a step-NNNNNNNN folder, or a checkpoint.dir");
  cmd->add_option("--prompt", o->prompt, "the text to continue")->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a tokenizer folder (default: the model folder's tokenizer.json, else the "
                  "checkpoint's data.tokenizer, else bytes)");
  cmd->add_option("--max-new-tokens", o->sampling.max_new_tokens, "tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", o->sampling.temperature, "0: greedy (default)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", o->sampling.top_k, "sample among the k most likely (0: all)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--top-p", o->sampling.top_p, "nucleus: the smallest set of probability p")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o->sampling.seed, "sampling seed");
  cmd->add_option("-o,--output", o->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([o, &result] { result.run = [o] { return RunGenerate(*o); }; });
}

}  // namespace meshrun::client
