// `meshrun workers [-o json]`: the registered workers, their state and slots (docs/cli.md).
#pragma once

#include "client/command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterWorkersCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
