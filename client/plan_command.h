// `meshrun plan -f JOB.yaml --nodes N --per-node G --device NAME [-o json]`: every valid mesh
// of the cluster for the job, with its predicted per-rank memory, step time, tokens/s and MFU,
// best first (engine/train/planner.h).
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

struct CommandResult;

void RegisterPlanCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
