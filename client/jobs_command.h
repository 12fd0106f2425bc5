// `meshrun jobs`, `meshrun status JOB`, `meshrun logs JOB [--follow] [--rank R]` and
// `meshrun cancel JOB`: reading and cancelling the coordinator's jobs (docs/cli.md).
#pragma once

#include "client/command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterJobsCommand(CLI::App& app, CommandResult& result);
void RegisterStatusCommand(CLI::App& app, CommandResult& result);
void RegisterLogsCommand(CLI::App& app, CommandResult& result);
void RegisterCancelCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
