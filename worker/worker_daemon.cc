// WorkerDaemon (see worker_daemon.h): assignment → RankStart + rank process; rank reports,
// output and exits → session reports.
#include "worker/worker_daemon.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/confined_file.h"
#include "common/escape.h"
#include "common/memory_estimate.h"
#include "common/parallel_dims.h"
#include "engine/train/counted_step.h"
#include "proto/duration.h"
#include "proto/spec_convert.h"
#include "worker/worker_metrics.h"

extern char** environ;

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// Saturating, and a StopOrder's grace is at most an hour: a huge one must not keep a rank
// alive for ever, nor overflow the supervisor's deadline arithmetic.
milliseconds FromDuration(const google::protobuf::Duration& d) {
  return std::clamp(DurationToMillis(d), milliseconds(0), milliseconds(3'600'000));
}

std::vector<std::string> OwnEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerConfig config,
                           std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                           WorkerMetrics* metrics)
    : config_(std::move(config)), metrics_(metrics) {
  SessionOptions session = config_.session;
  v1::RegisterWorkerRequest& r = session.registration;
  r.set_name(config_.name);
  r.set_slots(config_.slots);
  r.set_device(config_.device);
  r.set_address(config_.address);
  r.set_metrics_address(config_.metrics_address);
  if (!config_.gpus.empty() && r.device_name().empty()) r.set_device_name(config_.gpus[0].name);
  if (r.version().empty()) r.set_version(MESHRUN_VERSION);
  session_ = std::make_unique<SessionClient>(std::move(stub), std::move(session), this);
  RankSupervisor::Callbacks callbacks;
  callbacks.on_started = [this](const RankKey& key, pid_t pid) { OnRankStarted(key, pid); };
  callbacks.on_line = [this](const RankKey& key, bool is_stderr, std::string line) {
    OnRankLine(key, is_stderr, std::move(line));
  };
  callbacks.on_frame = [this](const RankKey& key, std::string frame) { OnRankReport(key, frame); };
  callbacks.on_exited = [this](const RankKey& key, const RankExit& exit) {
    OnRankExited(key, exit);
  };
  supervisor_ = std::make_unique<RankSupervisor>(std::move(callbacks));
}

WorkerDaemon::~WorkerDaemon() {
  Shutdown(config_.default_grace);
}

void WorkerDaemon::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  UpdateSlotMetrics();
  session_->Start();
}

void WorkerDaemon::Shutdown(milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  const int n = supervisor_->StopAll(grace);
  if (n > 0) spdlog::info("stopping {} rank processes", n);
  // Wait for their exits and their RankExited reports, bounded: a process the supervisor no
  // longer counts may still be on its way through OnRankExited, which queues the report and
  // leaves active_ under one lock.
  const auto give_up = std::chrono::steady_clock::now() + grace + milliseconds(12000);
  while ((supervisor_->running_count() > 0 || active_ranks() > 0) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (session_->connected()) session_->Flush(milliseconds(2000));
  session_->Stop();
  supervisor_->Shutdown(milliseconds(0));
}

Status WorkerDaemon::fatal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_;
}

size_t WorkerDaemon::active_ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_.size();
}

StatusOr<WorkerDaemon::Prepared> WorkerDaemon::PrepareAttempt(const v1::RankAssignment& a) {
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromProto(a.spec()));
  // Confined paths, checked again here whatever the coordinator checked (symlinks followed);
  // the rank checks each object it really opens against the same roots (common/confined_file.h).
  JobSpec checked = spec;
  MESHRUN_RETURN_IF_ERROR(config_.paths.ConfineJobSpec(&checked, PathPolicy::Rewrite::kReal));
  // The operator's limits win over the spec's: no rank runs more threads than this worker's
  // share of --cores, and none starts whose model cannot fit in its memory.
  const int local = std::max(1, a.local_world_size());
  const int share = std::max(1, config_.cores / local);
  if (spec.resources.threads == 0 || spec.resources.threads > share) {
    if (spec.resources.threads > share) {
      spdlog::warn(
          "{}/{} rank {}: resources.threads {} clamped to {} (--cores {} over {} local "
          "ranks)",
          a.job_id(), a.attempt(), a.rank(), spec.resources.threads, share, config_.cores, local);
    }
    spec.resources.threads = share;
  }
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
  if (mesh.world_size() != a.world_size()) {
    return InvalidArgumentError("assignment.world_size: " + std::to_string(a.world_size()) +
                                " ranks for the mesh " + mesh.ToString() + " of " +
                                std::to_string(mesh.world_size()) +
                                " (hint: a coordinator of another version sent it)");
  }
  // With model.init_from and sizes left out, the sizes are the rank's to read: a count here
  // would be of placeholders, so the rank checks its memory once it knows them.
  const bool sizes_known = ModelSizesSent(a.spec());
  // The rank's own step counted on the counting device (engine/train/counted_step.h): every
  // buffer the rank would allocate, so a rank that cannot fit is refused before it starts: on
  // cpu against this worker's --memory-bytes shared by its local ranks, on cuda against the
  // largest of its GPUs (NVML's memory; the CUDA context and cuBLAS's workspace come on top).
  const bool cpu = spec.resources.device == "cpu";
  uint64_t gpu_bytes = 0;
  const GpuDevice* largest = nullptr;
  for (const GpuDevice& g : config_.gpus) {
    if (g.memory_bytes > gpu_bytes) {
      gpu_bytes = g.memory_bytes;
      largest = &g;
    }
  }
  if (sizes_known && ((cpu && config_.memory_bytes > 0) || (!cpu && largest != nullptr))) {
    MESHRUN_ASSIGN_OR_RETURN(const double rank_bytes, CountedRankBytes(spec, a.rank()));
    if (cpu) {
      MESHRUN_RETURN_IF_ERROR(CheckRankMemory(spec, mesh, local,
                                              static_cast<double>(config_.memory_bytes),
                                              "--memory-bytes", rank_bytes));
    } else {
      MESHRUN_RETURN_IF_ERROR(
          CheckRankMemory(spec, mesh, 1, static_cast<double>(gpu_bytes),
                          "largest GPU (" + largest->name + ", " + largest->id + ")", rank_bytes));
    }
  }
  const fs::path dir = fs::path(config_.work_dir) / a.job_id() / std::to_string(a.attempt());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create " + dir.string() + ": " + ec.message());
  return Prepared{dir.string(), spec.resources.threads};
}

void WorkerDaemon::ReportNotStarted(const v1::RankAssignment& a, const std::string& error) {
  spdlog::error("cannot start {}/{} rank {}: {}", a.job_id(), a.attempt(), a.rank(), error);
  v1::WorkerSessionRequest m;
  v1::RankExited* e = m.mutable_rank_exited();
  e->set_job_id(a.job_id());
  e->set_attempt(a.attempt());
  e->set_rank(a.rank());
  e->set_exit_code(-1);
  e->set_error(ValidUtf8(error));
  session_->Send(std::move(m));
}

void WorkerDaemon::OnAssign(const v1::RankAssignment& a) {
  const RankKey key{a.job_id(), a.attempt(), a.rank()};
  if (!IsSafeJobId(a.job_id()) || a.attempt() < 1 || a.world_size() < 1 || a.rank() < 0 ||
      a.rank() >= a.world_size()) {
    ReportNotStarted(a, "malformed assignment (job id '" + a.job_id() + "', attempt " +
                            std::to_string(a.attempt()) + ", rank " + std::to_string(a.rank()) +
                            " of " + std::to_string(a.world_size()) + ")");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) {
      ReportNotStarted(a, "worker " + config_.name + " is shutting down");
      return;
    }
    if (active_.count(key) > 0) {
      spdlog::warn("{} is assigned again while it runs; ignoring the repeat", key.ToString());
      return;
    }
    if (static_cast<int>(active_.size()) >= config_.slots) {
      ReportNotStarted(a, "no free slot on worker " + config_.name + ": " +
                              std::to_string(active_.size()) + " of " +
                              std::to_string(config_.slots) + " in use");
      return;
    }
  }
  StatusOr<Prepared> prepared = PrepareAttempt(a);
  if (!prepared.ok()) {
    ReportNotStarted(a, prepared.status().message());
    return;
  }
  RankLaunchConfig launch;
  launch.meshrun_binary = config_.meshrun_binary;
  launch.working_dir = prepared->dir;
  launch.host = config_.address;
  launch.cores = config_.cores;
  launch.tls = config_.rank_tls;
  // The rank re-checks what it really opens against the same roots (common/confined_file.h).
  launch.data_roots = config_.paths.data_roots();
  launch.checkpoint_roots = config_.paths.checkpoint_roots();
  launch.threads = prepared->threads;
  launch.memory_bytes = static_cast<int64_t>(config_.memory_bytes);
  // The assignment as the coordinator sent it: the spec is forwarded unchanged (decision 0048).
  RankCommand command = BuildRankCommand(a, launch);
  int gpu = -1;
  if (config_.device == "cuda" && !config_.gpus.empty()) {
    std::optional<int> picked;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<bool> in_use(config_.gpus.size(), false);
      for (const auto& [k, act] : active_) {
        if (act.gpu >= 0 && act.gpu < static_cast<int>(in_use.size())) in_use[act.gpu] = true;
      }
      picked = PickGpu(a.local_rank(), in_use);
    }
    if (!picked) {
      ReportNotStarted(a, "no free GPU on worker " + config_.name + ": all " +
                              std::to_string(config_.gpus.size()) + " run ranks");
      return;
    }
    gpu = *picked;
    if (gpu != a.local_rank()) {
      spdlog::warn("{}: GPU {} of local rank {} is busy; the rank gets GPU {}", key.ToString(),
                   a.local_rank(), a.local_rank(), gpu);
    }
    for (auto& kv : GpuRankEnv(config_.gpus[gpu], config_.nccl_ifname, config_.peak_tflops)) {
      command.env.push_back(std::move(kv));
    }
  }
  RankSpawn spawn;
  spawn.key = key;
  spawn.argv = std::move(command.argv);
  spawn.env = MergeEnvironment(OwnEnvironment(), command.env, config_.rank_env_pass);
  spawn.input = std::move(command.input);
  spawn.report_channel = true;
  spawn.working_dir = prepared->dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_[key] = Active{a.coords(), 0, gpu};
    UpdateSlotMetrics();
  }
  spdlog::info("starting {} (coords dp_replicate={} dp_shard={} cp={} tp={})", key.ToString(),
               a.coords().dp_replicate(), a.coords().dp_shard(), a.coords().cp(), a.coords().tp());
  if (Status s = supervisor_->Start(std::move(spawn)); !s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_.erase(key);
      UpdateSlotMetrics();
    }
    ReportNotStarted(a, s.message());
  }
}

void WorkerDaemon::OnStop(const v1::StopOrder& order) {
  milliseconds grace = config_.default_grace;
  if (order.has_grace_period()) grace = FromDuration(order.grace_period());
  const int n = supervisor_->Stop(order.job_id(), order.attempt(), grace);
  spdlog::info("stop {}/{} ({}): {} rank processes, grace {} ms", order.job_id(), order.attempt(),
               v1::StopReason_Name(order.reason()), n, grace.count());
}

std::vector<v1::RunningRank> WorkerDaemon::RunningRanks() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::RunningRank> out;
  for (const auto& [key, active] : active_) {
    v1::RunningRank r;
    r.set_job_id(key.job_id);
    r.set_attempt(key.attempt);
    r.set_rank(key.rank);
    r.set_pid(active.pid);
    out.push_back(std::move(r));
  }
  return out;
}

int WorkerDaemon::FreeSlots() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::max(0, config_.slots - static_cast<int>(active_.size()));
}

void WorkerDaemon::OnConnected(bool connected) {
  if (metrics_ != nullptr) metrics_->SetConnected(connected);
}

void WorkerDaemon::OnFatal(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  fatal_ = status;
}

void WorkerDaemon::UpdateSlotMetrics() {
  if (metrics_ != nullptr) metrics_->SetSlots(static_cast<int>(active_.size()));
}

void WorkerDaemon::OnRankStarted(const RankKey& key, pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(key);
  if (it != active_.end()) it->second.pid = pid;
  v1::WorkerSessionRequest m;
  v1::RankStarted* s = m.mutable_rank_started();
  s->set_job_id(key.job_id);
  s->set_attempt(key.attempt);
  s->set_rank(key.rank);
  s->set_pid(pid);
  session_->Send(std::move(m));
}

void WorkerDaemon::OnRankLine(const RankKey& key, bool is_stderr, std::string line) {
  v1::WorkerSessionRequest m;
  v1::LogLine* l = m.mutable_logs()->add_lines();
  l->set_job_id(key.job_id);
  l->set_attempt(key.attempt);
  l->set_rank(key.rank);
  l->set_stream(is_stderr ? v1::LOG_STREAM_STDERR : v1::LOG_STREAM_STDOUT);
  SetTimestamp(std::chrono::system_clock::now(), l->mutable_time());
  // Rank output is any bytes; a proto3 string must be UTF-8 (else the coordinator cannot parse
  // the session's message): bytes that are not become \xNN. Controls stay, for clients to escape.
  l->set_text(ValidUtf8(line));
  session_->Send(std::move(m));
}

// A rank's typed report: every rank's steps go up as metrics, rank 0's checkpoints as
// CheckpointSaved; the rest (eval, summary) are for the standalone launcher's printer.
void WorkerDaemon::OnRankReport(const RankKey& key, const std::string& frame) {
  v1::RankReport report;
  if (!report.ParseFromString(frame)) {
    spdlog::warn("{}: a report that does not parse ({} bytes); ignored", key.ToString(),
                 frame.size());
    return;
  }
  v1::WorkerSessionRequest m;
  if (report.has_step()) {
    *m.mutable_metrics()->mutable_sample() =
        SampleOfStep(report.step(), key.job_id, key.attempt, key.rank);
  } else if (report.has_checkpoint_saved() && key.rank == 0) {
    v1::CheckpointSaved* saved = m.mutable_checkpoint_saved();
    saved->set_job_id(key.job_id);
    saved->set_attempt(key.attempt);
    saved->set_step(report.checkpoint_saved().step());
    saved->set_path(report.checkpoint_saved().path());
    saved->set_resumed(report.checkpoint_saved().resumed());
  } else {
    return;
  }
  session_->Send(std::move(m));
}

void WorkerDaemon::OnRankExited(const RankKey& key, const RankExit& exit) {
  if (exit.exit_code == 0) {
    spdlog::info("{} exited 0", key.ToString());
  } else {
    spdlog::warn("{} ended: exit code {}, signal {}{}: {}", key.ToString(), exit.exit_code,
                 exit.signal, exit.stopped ? " (stopped)" : "", exit.error);
  }
  // Removal and report under one lock: a heartbeat that no longer lists the rank is built
  // after its RankExited was queued (see SessionClient::WriterLoop).
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(key);
  UpdateSlotMetrics();
  v1::WorkerSessionRequest m;
  v1::RankExited* e = m.mutable_rank_exited();
  e->set_job_id(key.job_id);
  e->set_attempt(key.attempt);
  e->set_rank(key.rank);
  e->set_exit_code(exit.exit_code);
  e->set_signal(exit.signal);
  e->set_error(ValidUtf8(exit.error));
  e->set_stopped(exit.stopped);
  session_->Send(std::move(m));
}

}  // namespace meshrun
