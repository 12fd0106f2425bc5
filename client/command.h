// The pattern every `meshrun` subcommand follows. A command lives in client/<name>_command.cc
// and exposes `void Register<Name>Command(CLI::App& app, CommandResult& result)`, which adds a
// CLI11 subcommand whose callback stores the work in `result.run`; main() registers every
// command and hands over to RunCommandLine, which parses, runs, and maps errors to exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/escape.h"
#include "common/exit_codes.h"
#include "common/status.h"

namespace meshrun::client {

// Exit codes of docs/cli.md and ExitCodeFor: common/exit_codes.h.

// Filled in during parsing by the chosen subcommand; run after parsing succeeded, so a
// command never starts work on half-parsed flags. Not thread-safe; owned by main().
struct CommandResult {
  std::function<int()> run;  // returns the process exit code
};

// A flag's check for a whole number in [lo, hi], with a message people read:
// `--nproc: 'abc' is not a whole number from 1 to 4096` (CLI11's own Range prints doubles with
// 309 digits and calls text "not in range").
CLI::Validator WholeNumber(int64_t lo, int64_t hi);

// Writes `error: <message>` as one line on stderr and returns ExitCodeFor(status). Messages
// already follow `<field.path or flag>: <what> (hint: <fix>)`.
int ReportError(const Status& status);

// Parses argv with `app`, runs the chosen command and returns the exit code: 0 for --help,
// 2 with one `error: <flag>: ...` line for bad flags or arguments, 1 for an exception.
// Logging (spdlog) goes to stderr so that stdout stays clean for `-o json`.
int RunCommandLine(CLI::App& app, int argc, char** argv, CommandResult& result);

// Rank output made safe for the reader's terminal: EscapeText (common/escape.h), tab kept.
inline std::string EscapeControl(std::string_view text) {
  return EscapeText(text);
}

}  // namespace meshrun::client
