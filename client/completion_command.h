// `meshrun completion bash|zsh`: a shell completion script for meshrun's commands and their
// flags, generated from the command line definitions themselves (so it never falls behind).
#pragma once

#include "client/command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

// Adds `completion` to `app`; the script lists every other subcommand of `app` and its flags.
void RegisterCompletionCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
