// `meshrun train|eval|export`: load and validate the spec, build the engine's Trainer, print
// one line per step (text for people, JSON objects for programs; docs/cli.md shapes).
#include "client/train_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "client/launcher.h"
#include "client/preflight.h"
#include "client/progress.h"
#include "common/confined_file.h"
#include "common/job_spec_yaml.h"
#include "engine/comm/gloo_backend.h"
#include "engine/comm/mesh_comms.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"
#include "engine/io/atomic_file.h"
#include "engine/io/checkpoint.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/train/trainer.h"
#include "worker/grpc_store.h"
#include "worker/rank_protocol.h"

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

// Peak bytes per kind, as the step line and summary carry them.
json MemoryJson(const MemoryBreakdown& m) {
  json out = json::object();
  for (int k = 0; k < kNumMemoryKinds; ++k) {
    out[MemoryKindName(static_cast<MemoryKind>(k))] = m.peak[k];
  }
  return out;
}

}  // namespace

std::string StepLineJson(const StepMetrics& m) {
  json comm = json::array();
  for (const auto& [key, c] : m.comm) {
    comm.push_back({{"axis", key.first},
                    {"op", key.second},
                    {"seconds", c.seconds},
                    {"bytes", c.bytes},
                    {"calls", c.calls}});
  }
  json line = {{"event", "step"},
               {"step", m.step},
               {"loss", m.loss},
               {"lr", m.lr},
               {"grad_norm", m.grad_norm},
               {"step_seconds", m.step_seconds},
               {"tokens_per_second", m.tokens_per_second},
               {"tflops", m.tflops},
               {"mfu", m.mfu},
               {"allocated_memory_bytes", m.allocated_memory_bytes},
               {"peak_memory_bytes", m.peak_memory_bytes},
               {"reserved_memory_bytes", m.reserved_memory_bytes},
               {"memory", MemoryJson(m.memory)},
               {"comm", std::move(comm)}};
  return line.dump();
}

namespace {

// Prints what the training loop reports: JSON lines on stdout with -o json (and nothing else
// there), a readable line per step otherwise. Logs go to stderr either way.
class PrintingObserver final : public TrainObserver {
 public:
  // quiet: a rank other than 0, which leaves stdout to rank 0.
  // terminal: text on a terminal redraws one progress bar (the one `submit --follow` shows)
  // instead of printing a line per step.
  PrintingObserver(bool json_output, int64_t steps, bool quiet = false, bool terminal = false)
      : json_(json_output), steps_(steps), quiet_(quiet), terminal_(terminal && !json_output) {
    bar_.steps = steps;
    bar_.state = v1::JOB_STATE_RUNNING;
  }
  ~PrintingObserver() override { EndBar(); }

  void OnStep(const StepMetrics& m) override {
    if (quiet_) return;
    if (json_) {
      std::cout << StepLineJson(m) << std::endl;
    } else if (terminal_) {
      bar_.step = m.step;
      bar_.loss = m.loss;
      bar_.tokens_per_second = m.tokens_per_second;
      bar_.mfu = m.mfu;
      bar_.step_seconds =
          bar_.step_seconds > 0 ? 0.8 * bar_.step_seconds + 0.2 * m.step_seconds : m.step_seconds;
      std::cout << "\r\x1b[K" << RenderProgressLine(bar_, 24) << std::flush;
      bar_shown_ = true;
    } else {
      std::printf(
          "step %5lld/%-5lld loss %.4f  lr %.3e  norm %.3f  %7.1f ms  %9.0f tok/s  "
          "%.4f TFLOP/s  MFU %5.1f%%  peak %.1f MiB\n",
          static_cast<long long>(m.step), static_cast<long long>(steps_), m.loss, m.lr, m.grad_norm,
          m.step_seconds * 1e3, m.tokens_per_second, m.tflops, 100.0 * m.mfu,
          static_cast<double>(m.peak_memory_bytes) / (1 << 20));
      std::fflush(stdout);
    }
  }
  void OnEval(const EvalMetrics& e) override {
    if (quiet_) return;
    ClearBar();
    if (json_) {
      json line = {{"event", "eval"}, {"step", e.step}, {"loss", e.loss}, {"tokens", e.tokens}};
      std::cout << line.dump() << std::endl;
    } else {
      std::printf("eval  step %lld  val loss %.4f over %lld tokens\n",
                  static_cast<long long>(e.step), e.loss, static_cast<long long>(e.tokens));
    }
  }
  void OnLog(const std::string& line) override {
    ClearBar();
    std::cerr << line << std::endl;
  }
  // Leaves the bar's last state on its own line, before the summary.
  void EndBar() {
    if (bar_shown_) std::cout << std::endl;
    bar_shown_ = false;
  }

 private:
  // Clears the bar's line for another line; the next step draws the bar again.
  void ClearBar() {
    if (bar_shown_) std::cout << "\r\x1b[K" << std::flush;
  }

  bool json_;
  int64_t steps_;
  bool quiet_;
  bool terminal_;
  ProgressState bar_;
  bool bar_shown_ = false;
};

// Set by SIGINT/SIGTERM in a rank; the trainer stops at the next step boundary (all ranks at
// the same one), checkpoints and returns. The handler is one-shot: a second signal kills.
volatile std::sig_atomic_t g_stop_requested = 0;
bool g_announce_stop = false;  // a rank of its own (no launcher): say what happens on Ctrl-C

extern "C" void OnStopSignal(int) {
  g_stop_requested = 1;
  if (g_announce_stop) {
    static const char kMessage[] =
        "\ninterrupt: stopping at the end of this step (with a checkpoint when checkpoint.dir is "
        "set); press Ctrl-C again to stop at once\n";
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
  }
}

void InstallStopHandlers(bool announce) {
  g_announce_stop = announce;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// What a user needs after a run that trained nothing new or stopped early (stderr: stdout may
// be JSON). Returns the exit code.
int ReportRunEnd(const RunSummary& s, const JobSpec& spec) {
  const int64_t steps = spec.train.steps;
  const std::string dir = spec.checkpoint.dir;
  char loss[64] = "unknown";
  if (!std::isnan(s.final_loss)) std::snprintf(loss, sizeof(loss), "%.4f", s.final_loss);
  if (s.interrupted) {
    if (!s.last_checkpoint.empty()) {
      std::cerr << "interrupted: stopped after step " << s.last_step << " of " << steps << " (loss "
                << loss << "); checkpoint " << s.last_checkpoint
                << "; run the same command again to resume from step " << s.last_step << std::endl;
    } else {
      std::cerr << "interrupted: stopped after step " << s.last_step << " of " << steps
                << "; no checkpoint.dir is set, so this run's steps are not kept (hint: set "
                   "checkpoint.dir to resume after an interrupt)"
                << std::endl;
    }
    return kExitInterrupted;
  }
  if (s.steps == 0 && s.resumed_step >= steps && s.resumed_step > 0) {
    std::cerr << "note: checkpoint.dir: " << dir << " already holds this run's last step ("
              << s.resumed_step << " of " << steps << ", final loss " << loss << ", "
              << s.last_checkpoint << "); nothing to train (hint: to train again, use another "
              << "folder with --set checkpoint.dir=ANOTHER_DIR or remove " << dir
              << "; to train further, raise train.steps)" << std::endl;
  } else if (s.resumed_step > 0) {
    std::cerr << "note: resumed from step " << s.resumed_step << " of " << steps << " (" << dir
              << ")" << std::endl;
  }
  return kExitOk;
}

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

// The launcher's side of `--nproc N`: start N copies of this command as ranks.
int LaunchRanks(const TrainFlags& o, const ParallelDims& dims) {
  LaunchOptions launch;
  launch.nproc = o.nproc;
  launch.argv = {SelfExecutable(),        "train", "-f",    o.file, "--nproc",
                 std::to_string(o.nproc), "-o",    o.output};
  for (const std::string& kv : o.overrides) {
    launch.argv.push_back("--set");
    launch.argv.push_back(kv);
  }
  if (o.stop_after > 0) {
    launch.argv.push_back("--stop-after");
    launch.argv.push_back(std::to_string(o.stop_after));
  }
  for (int r = 0; r < o.nproc; ++r) {
    const MeshCoords c = dims.CoordsOf(r);
    launch.rank_labels.push_back(
        "rank " + std::to_string(r) + " (dp_replicate=" + std::to_string(c.dp_replicate) +
        " dp_shard=" + std::to_string(c.dp_shard) + " cp=" + std::to_string(c.cp) +
        " tp=" + std::to_string(c.tp) + ")");
  }
  return Launch(launch);
}

// A rank started by the launcher or by a worker: MESHRUN_RANK and MESHRUN_WORLD_SIZE say where
// it sits; the store is the coordinator's (MESHRUN_STORE_ADDRESS, MESHRUN_JOB_ID,
// MESHRUN_ATTEMPT, set by meshrun-worker) or else a FileStore in MESHRUN_STORE_DIR (set by the
// standalone launcher). MESHRUN_HOST, when set, is the address peers reach this rank at.
StatusOr<RankContext> ConnectRank(const ParallelDims& dims, std::chrono::seconds timeout) {
  const char* rank_env = std::getenv("MESHRUN_RANK");
  const char* world_env = std::getenv("MESHRUN_WORLD_SIZE");
  const char* store_env = std::getenv("MESHRUN_STORE_DIR");
  const char* store_address = std::getenv(kEnvStoreAddress);
  if (rank_env == nullptr || world_env == nullptr ||
      (store_env == nullptr && store_address == nullptr)) {
    return FailedPreconditionError(
        "MESHRUN_RANK: a rank needs MESHRUN_RANK, MESHRUN_WORLD_SIZE and MESHRUN_STORE_DIR or "
        "MESHRUN_STORE_ADDRESS (hint: start ranks with meshrun train --nproc N, or through "
        "meshrun submit)");
  }
  RankContext ctx;
  ctx.rank = std::atoi(rank_env);
  if (std::atoi(world_env) != dims.world_size() || ctx.rank < 0 || ctx.rank >= dims.world_size()) {
    return InvalidArgumentError("MESHRUN_WORLD_SIZE: " + std::string(world_env) +
                                " ranks launched for a mesh of " + dims.ToString() +
                                " (hint: --nproc must equal the mesh's world size)");
  }
  std::shared_ptr<Store> store;
  if (store_address != nullptr) {
    const char* job_env = std::getenv(kEnvJobId);
    const char* attempt_env = std::getenv(kEnvAttempt);
    GrpcStoreOptions options;
    options.address = store_address;
    options.job_id = job_env != nullptr ? job_env : "";
    options.attempt = attempt_env != nullptr ? std::atoi(attempt_env) : 0;
    options.tls = GrpcStoreOptions::TlsFromEnvironment();
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<GrpcStore> grpc_store, GrpcStore::Create(options));
    store = std::move(grpc_store);
  } else {
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<FileStore> file_store, FileStore::Create(store_env));
    store = std::move(file_store);
  }
  ctx.store = store;
  GlooOptions gloo;
  if (const char* host = std::getenv(kEnvHost); host != nullptr && *host != '\0') {
    gloo.hostname = host;
  }
  MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<GlooBackend> backend, GlooBackend::Create(gloo));
  MeshCommsOptions comm_options;
  comm_options.timeout = timeout;  // parallelism.comm_timeout_seconds
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<MeshComms> comms,
                           MeshComms::Create(dims, ctx.rank, store, *backend,
                                             std::make_shared<CommStats>(), comm_options));
  ctx.comms = std::move(comms);
  return ctx;
}

int RunTrain(const TrainFlags& o) {
  StatusOr<JobSpec> spec = LoadSpec(o.file, o.overrides, o.nproc);
  if (!spec.ok()) return ReportError(spec.status());
  StatusOr<ParallelDims> dims = MeshOf(*spec);
  if (!dims.ok()) return ReportError(dims.status());
  const bool is_rank = std::getenv("MESHRUN_RANK") != nullptr;
  if (!is_rank) {
    // Before any rank starts: data readable, checkpoint.dir writable, the ranks fit this host
    // (a rank under a worker was checked by whoever submitted it).
    PreflightOptions preflight;
    preflight.ranks_on_host = o.nproc;
    preflight.fill_token_cache = true;
    preflight.note = [](const std::string& line) { std::cerr << "note: " << line << std::endl; };
    if (Status s = CheckBeforeTraining(*spec, *dims, preflight); !s.ok()) return ReportError(s);
  }
  if (o.nproc > 1 && !is_rank) return LaunchRanks(o, *dims);

  // Ranks on one host share its cores: without a thread count in the spec or OMP_NUM_THREADS,
  // each rank takes an equal share (OpenMP threads that outnumber cores spin against each other).
  if (spec->resources.threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    spec->resources.threads = std::max(1, cores / std::max(1, o.nproc));
  }
  RankContext ctx;
  if (is_rank) {
    if (Status roots = InstallFileRootsFromEnvironment(); !roots.ok()) return ReportError(roots);
    StatusOr<RankContext> connected =
        ConnectRank(*dims, std::chrono::seconds(spec->parallelism.comm_timeout_seconds));
    if (!connected.ok()) return ReportError(connected.status());
    ctx = std::move(connected).value();
  }
  meshrun::TrainOptions options;
  options.stop_after_step = o.stop_after;
  options.spec_yaml = JobSpecToYaml(*spec);
  InstallStopHandlers(/*announce=*/!is_rank);
  options.stop_requested = &g_stop_requested;
  StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*spec, options, ctx);
  if (!trainer.ok()) return ReportError(trainer.status());
  const bool as_json = o.output == "json";
  // Rank 0 alone prints, unless a worker asks every rank to (it reads each rank's step lines).
  const char* report_all = std::getenv(kEnvReportAllRanks);
  const bool quiet = ctx.rank != 0 && !(report_all != nullptr && std::string(report_all) == "1");
  PrintingObserver observer(as_json, spec->train.steps, quiet, StdoutIsTerminal());
  StatusOr<RunSummary> summary = (*trainer)->Run(&observer);
  observer.EndBar();
  if (!summary.ok()) return ReportError(summary.status());
  const RunSummary& s = *summary;
  if (quiet) return s.interrupted ? kExitInterrupted : kExitOk;
  if (as_json) {
    json comm = json::object();
    for (const char* axis : {"tp", "cp", "dp_shard", "dp_replicate"})
      comm[axis] = s.comm_bytes.at(axis);
    json line = {{"event", "summary"},
                 {"steps", s.steps},
                 {"final_loss", s.final_loss},
                 {"losses", s.losses},
                 {"tokens_per_second", s.tokens_per_second},
                 {"mfu", s.mfu},
                 {"peak_memory_bytes", s.peak_memory_bytes},
                 {"memory", MemoryJson(s.memory)},
                 {"max_rss_bytes", s.max_rss_bytes},
                 {"comm_bytes", comm},
                 {"checkpoint", s.last_checkpoint},
                 {"resumed_from_step", s.resumed_step},
                 {"last_step", s.last_step},
                 {"interrupted", s.interrupted}};
    if (std::isnan(s.final_loss)) line["final_loss"] = nullptr;
    std::cout << line.dump() << std::endl;
  } else if (s.steps > 0) {
    std::printf("%s: %lld steps, final loss %.4f (first %.4f), %.0f tok/s, MFU %.1f%%%s%s\n",
                s.interrupted ? "stopped" : "done", static_cast<long long>(s.steps), s.final_loss,
                s.losses.front(), s.tokens_per_second, 100.0 * s.mfu,
                s.last_checkpoint.empty() ? "" : ", checkpoint ", s.last_checkpoint.c_str());
  }
  return ReportRunEnd(s, *spec);
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

int RunExport(const std::string& checkpoint, const std::string& out_dir, int64_t max_shard_bytes) {
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
  if (Status s = ExportHuggingFace(cfg, params.data(), out_dir, max_shard_bytes); !s.ok()) {
    return ReportError(s);
  }
  std::string copied;
  if (Status s = CopyTokenizerFiles(spec->data.tokenizer, out_dir, &copied); !s.ok()) {
    return ReportError(s);
  }
  const bool sharded = fs::exists(fs::path(out_dir) / "model.safetensors.index.json");
  std::printf(
      "exported %s to %s (%s, config.json%s)\n", step_dir->c_str(), out_dir.c_str(),
      sharded ? "safetensors shards with model.safetensors.index.json" : "model.safetensors",
      copied.c_str());
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
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face folder of its architecture (GPT2LMHeadModel or "
      "LlamaForCausalLM: config.json + safetensors)");
  cmd->add_option("CKPT", o->checkpoint, "a step-NNNNNNNN folder, or a checkpoint.dir")->required();
  cmd->add_option("-o,--output-dir", o->out, "output folder")->required();
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "largest safetensors file, as transformers writes it: e.g. 5GB (default), "
                  "500MB, 2GiB; above it the weights go into shards with "
                  "model.safetensors.index.json");
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
      return RunExport(o->checkpoint, o->out, *limit);
    };
  });
}

}  // namespace meshrun::client
