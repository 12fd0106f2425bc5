// `meshrun train`, `meshrun eval` and `meshrun export`: the engine driven from the command
// line on this host, without daemons (docs/cli.md).
#pragma once

#include <string>

#include "client/command.h"
#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterTrainCommand(CLI::App& app, CommandResult& result);
void RegisterEvalCommand(CLI::App& app, CommandResult& result);
void RegisterExportCommand(CLI::App& app, CommandResult& result);

// A step folder (checked complete), or a checkpoint.dir whose newest complete checkpoint is
// meant; INVALID_ARGUMENT naming `flag` when there is none.
StatusOr<std::string> ResolveCheckpoint(const std::string& path, const char* flag);

}  // namespace meshrun::client
