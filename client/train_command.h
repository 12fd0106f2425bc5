// `meshrun train`, `meshrun eval` and `meshrun export`: the engine driven from the command
// line on this host, without daemons (CONVENTIONS §6).
#pragma once

#include "client/command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterTrainCommand(CLI::App& app, CommandResult& result);
void RegisterEvalCommand(CLI::App& app, CommandResult& result);
void RegisterExportCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
