// `meshrun demo`: the whole system in one command — a local cluster (2 workers x 2 CPU slots),
// the bundled job (examples/demo.yaml: dp_shard 2 x tp 2 on the fortune cookies) followed with
// a live progress bar, `meshrun export` of its last checkpoint, and a summary; then the cluster
// is shut down. Exit 0 only when the job SUCCEEDED.
#pragma once

#include "client/command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterDemoCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
