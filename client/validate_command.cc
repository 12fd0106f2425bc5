// `meshrun validate`: load the spec (with --set), validate it (with --nproc), print it and its
// mesh as text or JSON. Everything it checks lives in common/; this file only wires and prints.
#include "client/validate_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iomanip>
#include <memory>
#include <sstream>
#include <type_traits>
#include <vector>

#include "client/preflight.h"
#include "common/job_spec_yaml.h"

namespace meshrun::client {
namespace {

void ReportTo(std::ostream& err, const Status& status) {
  std::string message = status.message();
  std::replace(message.begin(), message.end(), '\n', ' ');
  err << "error: " << message << std::endl;
}

}  // namespace

void RegisterValidateCommand(CLI::App& app, CommandResult& result) {
  auto options = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Check a job spec; print the resolved spec and the mesh (rank -> coordinates)");
  cmd->add_option("-f,--file", options->file, "job spec (YAML)")->required();
  cmd->add_option("--set", options->overrides,
                  "override a field: dotted.path=value (repeatable), e.g. parallelism.tp_size=2")
      ->expected(1)
      ->take_all();
  cmd->add_option("--nproc", options->nproc,
                  "number of ranks the job will run on; the mesh must have that many")
      ->check(WholeNumber(1, ParallelDims::kMaxWorldSize));
  cmd->add_option("-o,--output", options->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--skip-local-checks", options->skip_local_checks,
                "do not check data, checkpoint.dir and memory on this host (paths that exist "
                "only on the workers)");
  cmd->callback([options, &result] {
    result.run = [options] { return RunValidate(*options, std::cout, std::cerr); };
  });
}

int RunValidate(const ValidateOptions& options, std::ostream& out, std::ostream& err) {
  StatusOr<JobSpec> spec = LoadJobSpecFile(options.file, options.overrides);
  if (!spec.ok()) {
    ReportTo(err, spec.status());
    return ExitCodeFor(spec.status());
  }
  if (Status status = ValidateJobSpec(*spec, options.nproc); !status.ok()) {
    ReportTo(err, status);
    return ExitCodeFor(status);
  }
  StatusOr<ParallelDims> mesh = MeshOf(*spec);
  if (!mesh.ok()) {  // ValidateJobSpec checked the sizes; kept for safety
    ReportTo(err, mesh.status());
    return ExitCodeFor(mesh.status());
  }
  // What would fail only once training starts: every check `train` makes before its first
  // step (the same function): the init_from folder, the checkpoint it would resume, the data,
  // an unwritable checkpoint.dir, a model one rank of this host cannot hold.
  if (!options.skip_local_checks) {
    PreflightOptions preflight;
    preflight.note = [&err](const std::string& line) { err << "note: " << line << std::endl; };
    if (Status status = CheckBeforeTraining(*spec, *mesh, preflight); !status.ok()) {
      ReportTo(err, status);
      return ExitCodeFor(status);
    }
  }
  for (const std::string& note : SpecNotes(*spec)) err << note << std::endl;

  if (options.output == "json") {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (int rank = 0; rank < mesh->world_size(); ++rank) {
      ranks.push_back(
          {{"rank", rank}, {"coords", CoordsToJson(mesh->CoordsOf(rank), mesh->pp() > 1)}});
    }
    const nlohmann::ordered_json report = {
        {"spec", JobSpecToJson(*spec)}, {"mesh", MeshToJson(*mesh)}, {"ranks", ranks}};
    out << report.dump(2) << std::endl;
  } else {
    out << "# job spec, resolved (defaults and --set applied)\n"
        << JobSpecToYaml(*spec) << "\n# mesh: " << mesh->ToString() << "\n"
        << FormatMeshTable(*mesh) << std::flush;
  }
  return kExitOk;
}

std::string FormatMeshTable(const ParallelDims& mesh) {
  // The pp column only for a pipeline (pp_size > 1).
  const bool pp = mesh.pp() > 1;
  std::vector<std::string> headers = {"rank"};
  if (pp) headers.push_back("pp");
  for (const char* h : {"dp_replicate", "dp_shard", "cp", "tp"}) headers.push_back(h);
  std::vector<int> max_values = {mesh.world_size() - 1};
  if (pp) max_values.push_back(mesh.pp() - 1);
  for (int v : {mesh.dp_replicate(), mesh.dp_shard(), mesh.cp(), mesh.tp()}) {
    max_values.push_back(v - 1);
  }
  const size_t n = headers.size();
  std::vector<int> widths(n);
  for (size_t i = 0; i < n; ++i) {
    widths[i] = std::max<int>(headers[i].size(), std::to_string(max_values[i]).size());
  }
  std::ostringstream table;
  for (size_t i = 0; i < n; ++i) {
    table << (i ? "  " : "") << std::setw(widths[i]) << (i ? std::right : std::left) << headers[i];
  }
  table << "\n";
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    const MeshCoords c = mesh.CoordsOf(rank);
    std::vector<int> values = {rank};
    if (pp) values.push_back(c.pp);
    for (int v : {c.dp_replicate, c.dp_shard, c.cp, c.tp}) values.push_back(v);
    for (size_t i = 0; i < n; ++i) {
      table << (i ? "  " : "") << std::right << std::setw(widths[i]) << values[i];
    }
    table << "\n";
  }
  return table.str();
}

nlohmann::ordered_json MeshToJson(const ParallelDims& mesh) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (mesh.pp() > 1) json["pp"] = mesh.pp();
  json["dp_replicate"] = mesh.dp_replicate();
  json["dp_shard"] = mesh.dp_shard();
  json["cp"] = mesh.cp();
  json["tp"] = mesh.tp();
  json["world_size"] = mesh.world_size();
  return json;
}

nlohmann::ordered_json CoordsToJson(const MeshCoords& coords, bool with_pp) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (with_pp) json["pp"] = coords.pp;
  json["dp_replicate"] = coords.dp_replicate;
  json["dp_shard"] = coords.dp_shard;
  json["cp"] = coords.cp;
  json["tp"] = coords.tp;
  return json;
}

nlohmann::ordered_json JobSpecToJson(const JobSpec& spec) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  ForEachJobSpecField(spec, [&](std::string_view section, std::string_view key, const auto& value) {
    if (section.empty()) {
      json[std::string(key)] = value;
    } else {
      json[std::string(section)][std::string(key)] = value;
    }
  });
  // parallelism.pp_layers: null when empty (split by the engine's cost).
  if (spec.parallelism.pp_layers.empty()) json["parallelism"]["pp_layers"] = nullptr;
  // data.train as a list: [{"path","weight"}, ...] in place of the empty string.
  if (!spec.data.train_sources.empty()) {
    nlohmann::ordered_json sources = nlohmann::ordered_json::array();
    for (const DataSource& s : spec.data.train_sources) {
      sources.push_back({{"path", s.path}, {"weight", s.weight}});
    }
    json["data"]["train"] = std::move(sources);
  }
  return json;
}

}  // namespace meshrun::client
