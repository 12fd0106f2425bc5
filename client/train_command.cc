// `meshrun train|eval|export`: load and validate the spec, run its ranks (rank/, in this
// process for one rank, through the launcher for N) and print their reports, one line per step
// (text for people, JSON objects for programs; docs/cli.md shapes).
#include "client/train_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "client/launcher.h"
#include "client/plan_support.h"
#include "client/preflight.h"
#include "client/report_printer.h"
#include "common/atomic_file.h"
#include "common/host_resources.h"
#include "common/job_spec_yaml.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"
#include "engine/io/checkpoint.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/train/trainer.h"
#include "proto/mesh_axis.h"
#include "proto/spec_convert.h"
#include "rank/checkpoint_lock.h"
#include "rank/rank_main.h"
#include "rank/stop_signals.h"
#include "supervisor/line_splitter.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct TrainFlags {
  std::string file;
  std::vector<std::string> overrides;
  int nproc = 1;
  std::string output = "text";
  int64_t stop_after = 0;
};

void AddSpecOptions(CLI::App* cmd, std::string* file, std::vector<std::string>* overrides) {
  cmd->add_option("-f,--file", *file, "job spec (YAML)")->required();
  cmd->add_option("--set", *overrides, "override a field: dotted.path=value (repeatable)")
      ->expected(1)
      ->take_all();
}

StatusOr<JobSpec> LoadSpec(const std::string& file, const std::vector<std::string>& overrides,
                           int nproc) {
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpecFile(file, overrides));
  MESHRUN_RETURN_IF_ERROR(ValidateJobSpec(spec, nproc));
  return spec;
}

// The RankStart of rank `rank` of a standalone run of `spec` on this host.
v1::RankStart StandaloneStart(const JobSpec& spec, const ParallelDims& dims, int rank,
                              int64_t stop_after) {
  v1::RankStart start;
  v1::RankAssignment* a = start.mutable_assignment();
  a->set_job_id("standalone");
  a->set_attempt(1);
  a->set_rank(rank);
  a->set_world_size(dims.world_size());
  const MeshCoords c = dims.CoordsOf(rank);
  // As the coordinator assigns them: the fields (pp included) and the mesh's list of axes.
  SetProtoCoords(c, a->mutable_coords());
  AddMeshAxes(dims, c, a->mutable_axes());
  a->set_local_rank(rank);
  a->set_local_world_size(dims.world_size());
  *a->mutable_spec() = JobSpecToProto(spec);
  start.set_stop_after_step(stop_after);
  return start;
}

// The launcher's side of `--nproc N`: N `meshrun __rank` processes, each told its RankStart on
// stdin; rank 0's reports are printed here, as the in-process rank's would be.
int LaunchRanks(const TrainFlags& o, const JobSpec& spec, const ParallelDims& dims) {
  LaunchOptions launch;
  launch.nproc = o.nproc;
  launch.argv = {SelfExecutable(), "__rank"};
  for (int r = 0; r < o.nproc; ++r) {
    const MeshCoords c = dims.CoordsOf(r);
    launch.rank_labels.push_back(
        "rank " + std::to_string(r) + " (dp_replicate=" + std::to_string(c.dp_replicate) +
        " dp_shard=" + std::to_string(c.dp_shard) + " cp=" + std::to_string(c.cp) +
        " tp=" + std::to_string(c.tp) + ")");
  }
  launch.rank_input = [&](int rank, const std::string& store_dir) {
    v1::RankStart start = StandaloneStart(spec, dims, rank, o.stop_after);
    start.set_store_dir(store_dir);
    return Frame(start.SerializeAsString());
  };
  // Rank 0's reports drive the same bar (or lines) as one rank's; the ranks' own output lines
  // clear the bar first.
  ReportPrinter printer(o.output == "json", spec.train.steps, StdoutIsTerminal());
  launch.before_line = [&printer] { printer.BeforeLine(); };
  launch.on_report = [&](int rank, std::string frame) {
    if (rank != 0) return;
    v1::RankReport report;
    if (report.ParseFromString(frame)) printer.Report(report);
  };
  return Launch(launch);
}

int RunTrain(const TrainFlags& o) {
  // One rank trains in this process: its stop signals go to one watcher thread, never to a
  // thread that computes (rank/stop_signals.h); before the planner or any other thread starts.
  if (o.nproc <= 1) rank::BlockStopSignals();
  // The spec's one parse and one validation on this side; the ranks validate it once more.
  StatusOr<JobSpec> spec = LoadSpec(o.file, o.overrides, o.nproc);
  if (!spec.ok()) return ReportError(spec.status());
  if (spec->parallelism.auto_mesh) {
    // The planner chooses the mesh for --nproc ranks here; the ranks get the chosen spec in
    // their RankStart.
    StatusOr<MeshChoice> choice = ChooseMeshOnHost(*spec, o.nproc, o.output == "json");
    if (!choice.ok()) return ReportError(choice.status());
    *spec = choice->spec;
  }
  StatusOr<ParallelDims> dims = MeshOf(*spec);
  if (!dims.ok()) return ReportError(dims.status());
  // Before any rank starts: the device usable here, data readable, checkpoint.dir writable,
  // the ranks fit this host.
  PreflightOptions preflight;
  preflight.ranks_on_host = o.nproc;
  preflight.check_device = true;
  preflight.fill_token_cache = true;
  preflight.note = [](const std::string& line) { std::cerr << "note: " << line << std::endl; };
  if (Status s = CheckBeforeTraining(*spec, *dims, preflight); !s.ok()) return ReportError(s);
  for (const std::string& note : SpecNotes(*spec)) std::cerr << note << std::endl;
  // Ranks on one host share its cores: without a thread count in the spec or OMP_NUM_THREADS,
  // each rank takes an equal share (OpenMP threads that outnumber cores spin against each other).
  if (spec->resources.threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = ProbeHostResources().cores;
    spec->resources.threads = std::max(1, cores / std::max(1, o.nproc));
  }
  // One run per checkpoint.dir (rank/checkpoint_lock.h), held by this process until it ends,
  // before the resume checkpoint is chosen from the folder.
  std::unique_ptr<rank::CheckpointDirLock> checkpoint_lock;
  if (!spec->checkpoint.dir.empty()) {
    StatusOr<std::unique_ptr<rank::CheckpointDirLock>> lock =
        rank::CheckpointDirLock::Acquire(spec->checkpoint.dir, "meshrun train", "", 0, nullptr);
    if (!lock.ok()) return ReportError(lock.status());
    checkpoint_lock = std::move(lock).value();
  }
  // Where it resumes is rank 0's decision, as in a cluster (Trainer::LoadLatestCheckpoint).
  if (o.nproc > 1) return LaunchRanks(o, *spec, *dims);

  // One rank: it runs in this process, reporting straight to the printer.
  ReportPrinter printer(o.output == "json", spec->train.steps, StdoutIsTerminal());
  rank::RankRunOptions options;
  options.interactive = true;
  return rank::RunRank(StandaloneStart(*spec, *dims, 0, o.stop_after), &printer, options);
}

}  // namespace

StatusOr<std::string> ResolveCheckpoint(const std::string& path, const char* flag) {
  if (fs::exists(fs::path(path) / kCheckpointMetadataFile)) {
    MESHRUN_RETURN_IF_ERROR(CheckComplete(path));
    return path;
  }
  std::vector<std::string> warnings;
  StatusOr<LatestCheckpoint> latest = FindLatestComplete(path, &warnings);
  for (const std::string& w : warnings) std::cerr << "warning: " << w << std::endl;
  if (!latest.ok()) {
    return InvalidArgumentError(std::string(flag) + ": no complete checkpoint in " + path +
                                " (hint: pass a step-NNNNNNNN folder or a checkpoint.dir)");
  }
  return latest->step_dir;
}

namespace {

// The spec a checkpoint was trained with (its metadata holds it), with --set overrides.
StatusOr<JobSpec> SpecOfCheckpoint(const std::string& step_dir,
                                   const std::vector<std::string>& overrides) {
  MESHRUN_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec,
                           ParseJobSpecYaml(reader.metadata().job_spec_yaml, overrides,
                                            step_dir + "/metadata.json (job spec)"));
  MESHRUN_RETURN_IF_ERROR(ValidateJobSpec(spec, 0));
  return spec;
}

int RunEval(const std::string& file, const std::vector<std::string>& overrides,
            const std::string& checkpoint, const std::string& tokens, const std::string& output) {
  StatusOr<std::string> step_dir = ResolveCheckpoint(checkpoint, "CKPT");
  if (!step_dir.ok()) return ReportError(step_dir.status());
  // The spec: -f when given, else the one stored in the checkpoint.
  StatusOr<JobSpec> spec =
      file.empty() ? SpecOfCheckpoint(*step_dir, overrides) : LoadSpec(file, overrides, 0);
  if (!spec.ok()) return ReportError(spec.status());
  // Evaluation runs on this one process whatever mesh trained the checkpoint: loading reshards.
  const std::string strategy = spec->parallelism.cp_comm_strategy;
  spec->parallelism = ParallelismSpec{};
  spec->parallelism.cp_comm_strategy = strategy;
  const std::string stream_path = tokens.empty() ? spec->data.val : tokens;
  if (stream_path.empty()) {
    return ReportError(InvalidArgumentError(
        "--tokens: no stream to evaluate (hint: pass --tokens FILE or set data.val)"));
  }
  StatusOr<TokenStream> stream = LoadTokens(stream_path, spec->data.format, LoadOptionsOf(*spec));
  if (!stream.ok()) return ReportError(stream.status());
  meshrun::TrainOptions options;
  options.peak_flops = 1;  // no MFU here: skip the GEMM measurement
  StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*spec, options);
  if (!trainer.ok()) return ReportError(trainer.status());
  if (Status s = (*trainer)->LoadCheckpoint(*step_dir); !s.ok()) return ReportError(s);
  StatusOr<EvalMetrics> e = (*trainer)->Evaluate(*stream, 0);
  if (!e.ok()) return ReportError(e.status());
  if (output == "json") {
    std::cout << json({{"loss", e->loss}, {"tokens", e->tokens}, {"checkpoint", *step_dir}}).dump()
              << std::endl;
  } else {
    std::printf("loss %.6f over %lld tokens (%s, %s)\n", e->loss, static_cast<long long>(e->tokens),
                step_dir->c_str(), stream_path.c_str());
  }
  return kExitOk;
}

// The job's tokenizer files (data.tokenizer: tokenizer.json and, when present,
// tokenizer_config.json and special_tokens_map.json) copied beside the exported model; *copied
// lists them (", tokenizer.json, …").
Status CopyTokenizerFiles(const std::string& tokenizer_dir, const std::string& out_dir,
                          std::string* copied) {
  if (tokenizer_dir.empty()) return OkStatus();
  for (const char* name : kTokenizerFiles) {
    const std::string from = tokenizer_dir + "/" + name;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(from, ec)) {
      if (std::string(name) != "tokenizer.json") continue;
      return InvalidArgumentError("data.tokenizer: " + from +
                                  " is missing, so the export would lack its tokenizer (hint: "
                                  "restore the tokenizer folder the job trained with)");
    }
    std::string bytes;
    MESHRUN_RETURN_IF_ERROR(ReadTextFile(from, &bytes));
    MESHRUN_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/" + name, bytes));
    *copied += std::string(", ") + name;
  }
  return OkStatus();
}

// "5GB", "500MB", "2GiB", "1000" (bytes): transformers' max_shard_size; nullopt if not a size.
std::optional<int64_t> ParseByteSize(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name && value >= 1 && value * scale < 9e18) {
      return static_cast<int64_t>(value * scale);
    }
  }
  return std::nullopt;
}

int RunExport(const std::string& checkpoint, const std::string& out_dir, int64_t max_shard_bytes,
              const std::string& dtype) {
  StatusOr<std::string> step_dir = ResolveCheckpoint(checkpoint, "CKPT");
  if (!step_dir.ok()) return ReportError(step_dir.status());
  StatusOr<CheckpointReader> reader = CheckpointReader::Open(*step_dir);
  if (!reader.ok()) return ReportError(reader.status());
  StatusOr<JobSpec> spec = ParseJobSpecYaml(reader->metadata().job_spec_yaml, {},
                                            *step_dir + "/metadata.json (job spec)");
  if (!spec.ok()) return ReportError(spec.status());
  const GPT2Config cfg = GPT2ConfigOf(spec->model);
  const std::vector<ParamInfo> layout = GPT2ParamLayout(cfg);
  std::vector<float> params(static_cast<size_t>(layout.back().offset + layout.back().numel));
  for (const ParamInfo& p : layout) {
    if (Status s = reader->ReadTensor("model/" + p.name, params.data() + p.offset); !s.ok()) {
      return ReportError(s);
    }
  }
  // The source model's identity (type, dtype, special token ids) and the job tokenizer's
  // end-of-text id (engine/model/hf_checkpoint.h).
  HuggingFaceExportOptions options;
  options.max_shard_bytes = max_shard_bytes;
  options.identity =
      CheckpointSourceIdentity(reader->metadata().trainer_json, spec->model.init_from);
  StatusOr<DType> written = ExportDType(dtype, options.identity);
  if (!written.ok()) return ReportError(written.status());
  options.dtype = *written;
  if (!spec->data.tokenizer.empty()) {
    StatusOr<std::shared_ptr<const Tokenizer>> tokenizer = Tokenizer::Load(spec->data.tokenizer);
    if (tokenizer.ok()) options.end_of_text_id = (*tokenizer)->end_of_text_id();
  }
  if (Status s = ExportHuggingFace(cfg, params.data(), out_dir, options); !s.ok()) {
    return ReportError(s);
  }
  std::string copied;
  if (Status s = CopyTokenizerFiles(spec->data.tokenizer, out_dir, &copied); !s.ok()) {
    return ReportError(s);
  }
  const bool sharded = fs::exists(fs::path(out_dir) / "model.safetensors.index.json");
  std::printf(
      "exported %s to %s (%s in %s, config.json, generation_config.json%s)\n", step_dir->c_str(),
      out_dir.c_str(),
      sharded ? "safetensors shards with model.safetensors.index.json" : "model.safetensors",
      DTypeName(options.dtype), copied.c_str());
  return kExitOk;
}

}  // namespace

void RegisterTrainCommand(CLI::App& app, CommandResult& result) {
  auto o = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train", "Train a job standalone on this host (no daemons)");
  AddSpecOptions(cmd, &o->file, &o->overrides);
  cmd->add_option("--nproc", o->nproc, "rank processes to start; must equal the mesh's world size")
      ->check(WholeNumber(1, 4096));
  cmd->add_option("-o,--output", o->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--stop-after", o->stop_after,
                  "stop after this step (with a checkpoint when checkpoint.dir is set); the "
                  "schedule still spans train.steps, so a later run resumes seamlessly")
      ->check(WholeNumber(1, INT64_MAX));
  cmd->callback([o, &result] { result.run = [o] { return RunTrain(*o); }; });
}

void RegisterEvalCommand(CLI::App& app, CommandResult& result) {
  struct Options {
    std::string file, checkpoint, tokens, output = "text";
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Mean loss of a checkpoint over every window of a token stream (default data.val)");
  cmd->add_option("CKPT", o->checkpoint, "a step-NNNNNNNN folder, or a checkpoint.dir");
  cmd->add_option("--checkpoint", o->checkpoint, "the same as CKPT");
  cmd->add_option("-f,--file", o->file,
                  "job spec (YAML); default: the spec the checkpoint was trained with");
  cmd->add_option("--set", o->overrides, "override a field: dotted.path=value (repeatable)")
      ->expected(1)
      ->take_all();
  cmd->add_option("--tokens", o->tokens, "token stream to score (default: data.val)");
  cmd->add_option("-o,--output", o->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([o, &result] {
    result.run = [o] {
      if (o->checkpoint.empty()) {
        return ReportError(InvalidArgumentError(
            "CKPT: no checkpoint to evaluate (hint: meshrun eval CKPT, where CKPT is a "
            "step-NNNNNNNN folder or a checkpoint.dir)"));
      }
      return RunEval(o->file, o->overrides, o->checkpoint, o->tokens, o->output);
    };
  });
}

void RegisterExportCommand(CLI::App& app, CommandResult& result) {
  struct Options {
    std::string checkpoint, out;
    std::string max_shard_size = "5GB";
    std::string dtype = "source";
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face folder of its architecture (GPT2LMHeadModel, or "
      "LlamaForCausalLM and its family, keeping an init_from model's class, dtype and special "
      "token ids: config.json, generation_config.json + safetensors)");
  cmd->add_option("CKPT", o->checkpoint, "a step-NNNNNNNN folder, or a checkpoint.dir")->required();
  cmd->add_option("-o,--output-dir", o->out, "output folder")->required();
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "largest safetensors file, as transformers writes it: e.g. 5GB (default), "
                  "500MB, 2GiB; above it the weights go into shards with "
                  "model.safetensors.index.json");
  cmd->add_option("--dtype", o->dtype,
                  "the weights' dtype: source (the init_from model's torch_dtype; float32 for a "
                  "model trained from scratch), float32, bfloat16 or float16")
      ->check(CLI::IsMember({"source", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"}));
  cmd->callback([o, &result] {
    result.run = [o] {
      // Everywhere else -o is the output format: `export CKPT -o json` meant that, not a folder.
      if ((o->out == "json" || o->out == "text") && !fs::exists(o->out)) {
        return ReportError(InvalidArgumentError(
            "--output-dir: '" + o->out +
            "' looks like an output format, but export writes a "
            "folder (hint: meshrun export CKPT --output-dir DIR; for a folder of that name, "
            "write ./" +
            o->out + ")"));
      }
      const std::optional<int64_t> limit = ParseByteSize(o->max_shard_size);
      if (!limit) {
        return ReportError(InvalidArgumentError(
            "--max-shard-size: '" + o->max_shard_size +
            "' is not a size (hint: a number with KB, MB, GB, KiB, MiB or GiB, e.g. 5GB)"));
      }
      return RunExport(o->checkpoint, o->out, *limit, o->dtype);
    };
  });
}

}  // namespace meshrun::client
