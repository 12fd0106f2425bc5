// `meshrun generate (--model DIR | --checkpoint CKPT) --prompt TEXT [sampling flags] [-o json]`:
// a continuation of the prompt from an exported model or a checkpoint (engine/model/generate.h).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

struct CommandResult;

void RegisterGenerateCommand(CLI::App& app, CommandResult& result);

// A sampled continuation (temperature 0.8, top-k 40, seed 1) of `prompt` from an exported
// model folder, printable; what the demo shows of the model it trained.
StatusOr<std::string> SampleFromModel(const std::string& model_dir, const std::string& prompt,
                                      int new_tokens);

// Bytes of a continuation made printable: control bytes other than newline and tab as \xNN.
std::string PrintableText(const std::string& bytes);

}  // namespace meshrun::client
