// `meshrun generate`: loads the model (a Hugging Face GPT-2 folder or a checkpoint), encodes the
// prompt as bytes (token id = byte value, the byte-level vocabulary of text data), decodes the
// continuation the same way.
#include "client/generate_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "client/command.h"
#include "client/train_command.h"
#include "common/job_spec_yaml.h"
#include "engine/io/checkpoint.h"
#include "engine/model/generate.h"
#include "engine/model/hf_checkpoint.h"

namespace meshrun::client {

namespace {

struct GenerateFlags {
  std::string model, checkpoint, prompt, output = "text";
  SamplingOptions sampling;
};

StatusOr<std::unique_ptr<GPT2<float>>> LoadModel(const GenerateFlags& o) {
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
  const GPT2Config cfg = GPT2ConfigOf(spec.model);
  auto model = std::make_unique<GPT2<float>>(cfg);
  for (const ParamInfo& p : model->params()) {
    MESHRUN_RETURN_IF_ERROR(reader.ReadTensor("model/" + p.name, model->param(p)));
  }
  return model;
}

int RunGenerate(const GenerateFlags& o) {
  if (o.model.empty() == o.checkpoint.empty()) {
    return ReportError(InvalidArgumentError(
        "--model/--checkpoint: give exactly one (hint: --model DIR for an exported folder, "
        "--checkpoint CKPT for a step folder or a checkpoint.dir)"));
  }
  StatusOr<std::unique_ptr<GPT2<float>>> model = LoadModel(o);
  if (!model.ok()) return ReportError(model.status());
  if ((*model)->config().vocab_size < 256) {
    return ReportError(InvalidArgumentError(
        "--prompt: the model's vocabulary has " + std::to_string((*model)->config().vocab_size) +
        " tokens, fewer than the 256 byte values the prompt is encoded with"));
  }
  std::vector<int32_t> prompt;
  for (unsigned char c : o.prompt) prompt.push_back(c);
  StatusOr<std::vector<int32_t>> tokens = Generate(**model, prompt, o.sampling);
  if (!tokens.ok()) return ReportError(tokens.status());
  std::string text;
  for (int32_t t : *tokens) text.push_back(t < 256 ? static_cast<char>(t) : '?');
  if (o.output == "json") {
    nlohmann::json out = {{"prompt", o.prompt}, {"tokens", *tokens}, {"text", text}};
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
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  MESHRUN_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, Generate(*model, ids, o.sampling));
  std::string text;
  for (int32_t t : tokens) text.push_back(t < 256 ? static_cast<char>(t) : '?');
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
  CLI::App* cmd = app.add_subcommand(
      "generate", "Continue a prompt with an exported model or a checkpoint (byte-level text)");
  cmd->add_option("--model", o->model, "a Hugging Face GPT-2 folder (meshrun export)");
  cmd->add_option("--checkpoint", o->checkpoint, "a step-NNNNNNNN folder, or a checkpoint.dir");
  cmd->add_option("--prompt", o->prompt, "the text to continue")->required();
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
