// The rank's entry point (see rank_main.h): RankStart → spec (converted and validated once) →
// store and communicators → Trainer::Run, with every step, eval, checkpoint and the summary
// sent to the supervisor as RankReport messages.
#include "rank/rank_main.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <memory>

#include "common/confined_file.h"
#include "common/exit_codes.h"
#include "common/job_spec.h"
#include "common/job_spec_yaml.h"
#include "engine/comm/backend_factory.h"
#include "engine/comm/mesh_comms.h"
#include "engine/comm/store.h"
#include "engine/train/device.h"
#include "engine/train/rank_device.h"
#include "proto/spec_convert.h"
#include "rank/checkpoint_lock.h"
#include "rank/spec_intake.h"
#include "rank/stop_signals.h"
#include "rpc/grpc_store.h"

namespace meshrun::rank {
namespace {

constexpr int kReportFd = 3;

int ReportError(const Status& status) {
  std::string message(status.message());
  for (char& ch : message) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  std::cerr << "error: " << message << std::endl;
  return ExitCodeFor(status);
}

// Set by the first SIGINT/SIGTERM (rank/stop_signals.h); the trainer stops at the next step
// boundary (all ranks at the same one), checkpoints and returns. A second signal ends the process.
volatile std::sig_atomic_t g_stop_requested = 0;

// The trainer's reports as RankReport messages.
class ReportingObserver final : public TrainObserver {
 public:
  explicit ReportingObserver(ReportSink* sink) : sink_(sink) {}
  void OnStep(const StepMetrics& m) override {
    v1::RankReport r;
    *r.mutable_step() = StepReport(m);
    sink_->Report(r);
  }
  void OnEval(const EvalMetrics& e) override {
    v1::RankReport r;
    r.mutable_eval()->set_step(e.step);
    r.mutable_eval()->set_loss(e.loss);
    r.mutable_eval()->set_tokens(e.tokens);
    sink_->Report(r);
  }
  void OnLog(const std::string& line) override { sink_->Log(line); }
  void OnCheckpoint(int64_t step, const std::string& step_dir) override {
    v1::RankReport r;
    r.mutable_checkpoint_saved()->set_step(step);
    r.mutable_checkpoint_saved()->set_path(step_dir);
    sink_->Report(r);
  }
  void OnResumed(int64_t step, const std::string& step_dir) override {
    v1::RankReport r;
    r.mutable_checkpoint_saved()->set_step(step);
    r.mutable_checkpoint_saved()->set_path(step_dir);
    r.mutable_checkpoint_saved()->set_resumed(true);
    sink_->Report(r);
  }

 private:
  ReportSink* sink_;
};

// The store every rank of the attempt meets in (the coordinator's, or a FileStore folder of a
// standalone run) and the communicators of every axis.
StatusOr<RankContext> ConnectRank(const v1::RankStart& start, const ParallelDims& dims,
                                  const std::string& device, std::chrono::seconds timeout) {
  const v1::RankAssignment& a = start.assignment();
  RankContext ctx;
  ctx.rank = a.rank();
  std::shared_ptr<Store> store;
  if (!a.store().address().empty()) {
    GrpcStoreOptions options;
    options.address = a.store().address();
    options.job_id = a.job_id();
    options.attempt = a.attempt();
    options.tls.cert = start.tls().cert();
    options.tls.key = start.tls().key();
    options.tls.ca = start.tls().ca();
    options.tls.server_name = start.tls().server_name();
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<GrpcStore> grpc_store, GrpcStore::Create(options));
    store = std::move(grpc_store);
  } else if (!start.store_dir().empty()) {
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<FileStore> file_store,
                             FileStore::Create(start.store_dir()));
    store = std::move(file_store);
  } else {
    return FailedPreconditionError(
        "assignment.store: a rank of " + std::to_string(a.world_size()) +
        " needs a store address or a store folder (hint: start ranks with meshrun train --nproc "
        "N, or through meshrun submit)");
  }
  ctx.store = store;
  // The backend follows resources.device (Gloo on cpu, NCCL on cuda;
  // engine/comm/backend_factory.h).
  CommBackendOptions backend;
  backend.hostname = start.host();
  if (device == "cuda") backend.cuda_device = ctx.cuda_device = RankCudaDevice(a.local_rank());
  MeshCommsOptions comm_options;
  comm_options.timeout = timeout;  // parallelism.comm_timeout_seconds
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<MeshComms> comms,
                           ConnectMesh(device, dims, ctx.rank, store, std::make_shared<CommStats>(),
                                       comm_options, backend));
  ctx.comms = std::move(comms);
  return ctx;
}

// What a user needs after a run that trained nothing new or stopped early (stderr: stdout may
// be JSON). Returns the exit code.
int ReportRunEnd(const RunSummary& s, const JobSpec& spec, bool notes) {
  const int64_t steps = spec.train.steps;
  const std::string dir = spec.checkpoint.dir;
  char loss[64] = "unknown";
  if (!std::isnan(s.final_loss)) std::snprintf(loss, sizeof(loss), "%.4f", s.final_loss);
  if (s.interrupted) {
    if (!notes) return kExitInterrupted;
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
  if (!notes) return 0;
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
  return 0;
}

}  // namespace

void InstallRankFileRoots(const v1::RankStart& start) {
  if (!start.has_file_roots()) return;
  FileRoots roots;
  roots.confined = true;
  roots.data.assign(start.file_roots().data().begin(), start.file_roots().data().end());
  roots.checkpoint.assign(start.file_roots().checkpoint().begin(),
                          start.file_roots().checkpoint().end());
  InstallFileRoots(std::move(roots));
}

int RunRank(const v1::RankStart& start, ReportSink* sink, const RankRunOptions& options) {
  const v1::RankAssignment& a = start.assignment();
  // The roots first: the spec's intake already reads (init_from's config.json).
  InstallRankFileRoots(start);
  // The spec's one conversion and one validation in the rank (rank/spec_intake.h).
  StatusOr<JobSpec> spec = SpecOfRankStart(start);
  if (!spec.ok()) return ReportError(spec.status());
  StatusOr<ParallelDims> dims = MeshOf(*spec);
  if (!dims.ok()) return ReportError(dims.status());
  if (a.rank() < 0 || a.rank() >= dims->world_size()) {
    return ReportError(InvalidArgumentError("assignment.rank: " + std::to_string(a.rank()) +
                                            " is outside the mesh " + dims->ToString() +
                                            " (hint: ranks are numbered 0 … world size − 1)"));
  }
  // Rank 0 of a cluster job holds checkpoint.dir while it runs (rank/checkpoint_lock.h); a
  // standalone run ("standalone", `meshrun train`) holds it in the launching process already.
  std::unique_ptr<CheckpointDirLock> checkpoint_lock;
  if (a.rank() == 0 && !spec->checkpoint.dir.empty() && a.job_id() != "standalone") {
    StatusOr<std::unique_ptr<CheckpointDirLock>> lock = CheckpointDirLock::Acquire(
        spec->checkpoint.dir, "rank 0", a.job_id(), a.attempt(),
        [](const std::string& line) { std::cerr << "note: " << line << std::endl; });
    if (!lock.ok()) return ReportError(lock.status());
    checkpoint_lock = std::move(lock).value();
  }
  RankContext ctx;
  if (dims->world_size() > 1) {
    StatusOr<RankContext> connected =
        ConnectRank(start, *dims, spec->resources.device,
                    std::chrono::seconds(spec->parallelism.comm_timeout_seconds));
    if (!connected.ok()) return ReportError(connected.status());
    ctx = std::move(connected).value();
  }
  if (spec->resources.device == "cuda") ctx.cuda_device = RankCudaDevice(a.local_rank());
  TrainOptions train;
  // MFU's peak: MESHRUN_PEAK_TFLOPS, else the GPU's dense bf16 peak by name on cuda (0 on cpu:
  // the trainer measures a float32 GEMM). engine/train/gpu_peak.h.
  std::string peak_note;
  StatusOr<double> peak = RankPeakFlops(
      spec->resources.device, spec->resources.device == "cuda" ? RankCudaDevice(a.local_rank()) : 0,
      &peak_note);
  if (!peak.ok()) return ReportError(peak.status());
  if (!peak_note.empty() && a.rank() == 0) std::cerr << peak_note << std::endl;
  train.peak_flops = *peak;
  train.stop_after_step = start.stop_after_step();
  train.spec_yaml = JobSpecToYaml(*spec);
  // The resume checkpoint is chosen once, by rank 0, where checkpoint.dir is readable, and
  // every rank loads it (Trainer::Run; decision 0048).
  // A coordinator's job marks its checkpoints with its id; a standalone run (no store
  // address) leaves them unmarked, as it owns its folder.
  if (!a.store().address().empty()) train.checkpoint_owner = a.job_id();
  ArmStopSignals(&g_stop_requested, options.interactive);
  train.stop_requested = &g_stop_requested;
  StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*spec, train, ctx);
  if (!trainer.ok()) return ReportError(trainer.status());
  ReportingObserver observer(sink);
  StatusOr<RunSummary> summary = (*trainer)->Run(&observer);
  if (!summary.ok()) return ReportError(summary.status());
  v1::RankReport report;
  *report.mutable_summary() = SummaryReport(*summary);
  sink->Report(report);
  return ReportRunEnd(*summary, *spec, /*notes=*/a.rank() == 0);
}

namespace {

// The report channel, and with RankStart.echo_reports the eval and summary lines on stdout too.
class SupervisedSink final : public ReportSink {
 public:
  SupervisedSink(int fd, bool echo) : channel_(fd), echo_(echo) {}
  void Report(const v1::RankReport& report) override {
    channel_.Report(report);
    if (!echo_) return;
    if (report.has_eval()) std::cout << EvalLineJson(report.eval()) << std::endl;
    if (report.has_summary()) std::cout << SummaryLineJson(report.summary()) << std::endl;
  }

 private:
  FdReportSink channel_;
  bool echo_;
};

}  // namespace

int RankMain() {
  BlockStopSignals();  // before any thread starts (rank/stop_signals.h)
  StatusOr<v1::RankStart> start = ReadRankStart(STDIN_FILENO);
  if (!start.ok()) return ReportError(start.status());
  SupervisedSink sink(kReportFd, start->echo_reports());
  return RunRank(*start, &sink);
}

}  // namespace meshrun::rank
