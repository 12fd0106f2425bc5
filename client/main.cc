// meshrun: the client command line. main() only wires commands together; each command lives in
// client/<name>_command.{h,cc} and adds itself with Register<Name>Command (see command.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>

#include "client/command.h"
#include "client/completion_command.h"
#include "client/demo_command.h"
#include "client/generate_command.h"
#include "client/jobs_command.h"
#include "client/plan_command.h"
#include "client/submit_command.h"
#include "client/tokenize_command.h"
#include "client/train_command.h"
#include "client/up_command.h"
#include "client/validate_command.h"
#include "client/workers_command.h"
#include "gen/client/version.h"
#include "rank/rank_main.h"
#include "supervisor/openmp_environment.h"

int main(int argc, char** argv) {
  // A rank process (started by meshrun-worker or `train --nproc N`, never by people): its
  // input is the RankStart on stdin, not flags.
  if (argc == 2 && std::strcmp(argv[1], "__rank") == 0) return meshrun::rank::RankMain();
  // `train` runs a rank in this process (and --nproc N ranks inherit this environment), `eval`
  // and `generate` run the model, `plan` measures for ranks: they wait as every rank does
  // (supervisor/openmp_environment.h).
  // libgomp has read the variables already, so set them and start again, once.
  if (argc >= 2 && meshrun::CommandWaitsAsRanks(argv[1]) && meshrun::OpenMpWaitUnset()) {
    for (const auto& [name, value] : meshrun::RankOpenMpEnvironment()) {
      setenv(name.c_str(), value.c_str(), 1);
    }
    execv("/proc/self/exe", argv);  // on failure, train as things are
  }

  CLI::App app{"meshrun: N-D parallel GPT training (dp_replicate x dp_shard x cp x tp)", "meshrun"};
  app.require_subcommand(1);
  app.set_version_flag("--version", MESHRUN_VERSION);

  meshrun::client::CommandResult result;
  meshrun::client::RegisterValidateCommand(app, result);
  meshrun::client::RegisterTrainCommand(app, result);
  meshrun::client::RegisterEvalCommand(app, result);
  meshrun::client::RegisterExportCommand(app, result);
  meshrun::client::RegisterPlanCommand(app, result);
  meshrun::client::RegisterGenerateCommand(app, result);
  meshrun::client::RegisterTokenizeCommand(app, result);
  meshrun::client::RegisterUpCommand(app, result);
  meshrun::client::RegisterDemoCommand(app, result);
  meshrun::client::RegisterSubmitCommand(app, result);
  meshrun::client::RegisterJobsCommand(app, result);
  meshrun::client::RegisterStatusCommand(app, result);
  meshrun::client::RegisterLogsCommand(app, result);
  meshrun::client::RegisterCancelCommand(app, result);
  meshrun::client::RegisterWorkersCommand(app, result);
  meshrun::client::RegisterCompletionCommand(app, result);  // last: it lists the others
  // New commands register here, one line each.

  return meshrun::client::RunCommandLine(app, argc, argv, result);
}
