// The pattern every `meshrun` subcommand follows. A command lives in client/<name>_command.cc
// and exposes `void Register<Name>Command(CLI::App& app, CommandResult& result)`, which adds a
// CLI11 subcommand whose callback stores the work in `result.run`; main() registers every
// command and hands over to RunCommandLine, which parses, runs, and maps errors to exit codes.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

// Exit codes of CONVENTIONS §6.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;       // anything else
inline constexpr int kExitInvalidInput = 2;  // spec, flags, arguments

// Filled in during parsing by the chosen subcommand; run after parsing succeeded, so a
// command never starts work on half-parsed flags. Not thread-safe; owned by main().
struct CommandResult {
  std::function<int()> run;  // returns the process exit code
};

// kExitInvalidInput for INVALID_ARGUMENT (the caller's input), kExitFailure otherwise.
int ExitCodeFor(const Status& status);

// Writes `error: <message>` as one line on stderr and returns ExitCodeFor(status). Messages
// already follow `<field.path or flag>: <what> (hint: <fix>)`.
int ReportError(const Status& status);

// Parses argv with `app`, runs the chosen command and returns the exit code: 0 for --help,
// 2 with one `error: <flag>: ...` line for bad flags or arguments, 1 for an exception.
// Logging (spdlog) goes to stderr so that stdout stays clean for `-o json`.
int RunCommandLine(CLI::App& app, int argc, char** argv, CommandResult& result);

// `text` safe to print on a terminal: control characters (C0 but tab, DEL, and the UTF-8
// encoded C1 range U+0080..U+009F) become `\xNN` / `\u00NN`, so rank
// output (which any rank, or a worker, wrote) cannot move the cursor, set the title or send
// terminal escape sequences to whoever reads `meshrun logs`.
std::string EscapeControl(std::string_view text);

}  // namespace meshrun::client
