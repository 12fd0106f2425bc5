// `meshrun train`, `meshrun eval` and `meshrun export`: the engine driven from the command
// line on this host, without daemons (docs/cli.md).
#pragma once

#include <string>

#include "client/command.h"
#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun {
struct StepMetrics;
}  // namespace meshrun

namespace meshrun::client {

// The `{"event":"step",…}` line of `train -o json` without its newline (docs/cli.md lists its
// fields: loss, lr, grad_norm, timings, memory and "comm":[{"axis","op","seconds","bytes",
// "calls"}], cumulative since the rank's first step), read by ParseStepLine.
std::string StepLineJson(const StepMetrics& m);

void RegisterTrainCommand(CLI::App& app, CommandResult& result);
void RegisterEvalCommand(CLI::App& app, CommandResult& result);
void RegisterExportCommand(CLI::App& app, CommandResult& result);

// A step folder (checked complete), or a checkpoint.dir whose newest complete checkpoint is
// meant; INVALID_ARGUMENT naming `flag` when there is none.
StatusOr<std::string> ResolveCheckpoint(const std::string& path, const char* flag);

}  // namespace meshrun::client
