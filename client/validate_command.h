// `meshrun validate -f JOB.yaml [--set K=V]... [--nproc N] [-o text|json]`: checks a job spec
// and prints the resolved spec and the mesh (one line per rank with its coordinates).
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "client/command.h"
#include "common/job_spec.h"
#include "common/parallel_dims.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

struct ValidateOptions {
  std::string file;                    // -f: the job spec
  std::vector<std::string> overrides;  // --set K=V, in order
  int nproc = 0;                       // --nproc: the world size must match (0: not checked)
  std::string output = "text";         // -o: text | json
  // --skip-local-checks: leave out CheckBeforeTraining (data, checkpoint.dir, memory on this
  // host), for a spec whose paths exist only on a cluster's workers.
  bool skip_local_checks = false;
};

// Adds the `validate` subcommand to `app`; when chosen, `result.run` runs RunValidate.
void RegisterValidateCommand(CLI::App& app, CommandResult& result);

// The command itself: the report goes to `out`, errors (one `error:` line) to `err`.
// Returns 0, or 2 for an invalid spec or file, 1 for anything else.
int RunValidate(const ValidateOptions& options, std::ostream& out, std::ostream& err);

// Helpers other commands can print with.
// "rank  dp_replicate  dp_shard  cp  tp" and one right-aligned line per rank (with a "pp"
// column after "rank" when pp_size > 1).
std::string FormatMeshTable(const ParallelDims& mesh);
// {"dp_replicate":R,"dp_shard":S,"cp":C,"tp":T,"world_size":W}, led by "pp":P when P > 1.
nlohmann::ordered_json MeshToJson(const ParallelDims& mesh);
// {"dp_replicate":r,"dp_shard":s,"cp":c,"tp":t}, led by "pp":p with with_pp.
nlohmann::ordered_json CoordsToJson(const MeshCoords& coords, bool with_pp = false);
// The spec as JSON with the YAML's sections and keys.
nlohmann::ordered_json JobSpecToJson(const JobSpec& spec);

}  // namespace meshrun::client
