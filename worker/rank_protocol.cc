// The worker <-> rank protocol (see rank_protocol.h and docs/control-plane.md).
#include "worker/rank_protocol.h"

#include <algorithm>
#include <chrono>

#include "proto/duration.h"
#include "proto/mesh_axis.h"
#include "supervisor/line_splitter.h"
#include "supervisor/openmp_environment.h"

namespace meshrun {
namespace {

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.substr(0, prefix.size()) == prefix;
}

}  // namespace

RankCommand BuildRankCommand(const v1::RankAssignment& a, const RankLaunchConfig& config) {
  RankCommand cmd;
  cmd.argv = {config.meshrun_binary, "__rank"};
  const int local = std::max(1, a.local_world_size());
  const int threads = std::max(1, config.cores / local);
  cmd.env = {{"OMP_NUM_THREADS", std::to_string(threads)}};
  for (auto& var : RankOpenMpEnvironment()) cmd.env.push_back(std::move(var));
  v1::RankStart start;
  *start.mutable_assignment() = a;
  start.set_host(config.host);
  start.set_echo_reports(true);  // eval and summary lines stay in the job's logs
  start.set_threads(config.threads);
  start.set_memory_bytes(config.memory_bytes);
  start.mutable_tls()->set_cert(config.tls.cert);
  start.mutable_tls()->set_key(config.tls.key);
  start.mutable_tls()->set_ca(config.tls.ca);
  start.mutable_tls()->set_server_name(config.tls.server_name);
  if (!config.data_roots.empty() || !config.checkpoint_roots.empty()) {
    v1::RankFileRoots* roots = start.mutable_file_roots();
    for (const std::string& r : config.data_roots) roots->add_data(r);
    for (const std::string& r : config.checkpoint_roots) roots->add_checkpoint(r);
  }
  cmd.input = Frame(start.SerializeAsString());
  return cmd;
}

bool IsInheritedByRanks(std::string_view name) {
  // clang-format off
  static constexpr std::string_view kNames[] = {
      "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "LANG", "LANGUAGE", "TZ", "TMPDIR",
      "TERM", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
      "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"};
  // clang-format on
  static constexpr std::string_view kPrefixes[] = {"LC_", "NCCL_", "GLOO_", "OPENBLAS_"};
  for (std::string_view n : kNames) {
    if (name == n) return true;
  }
  for (std::string_view p : kPrefixes) {
    if (StartsWith(name, p)) return true;
  }
  return false;
}

std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& vars,
    const std::vector<std::string>& pass) {
  std::vector<std::string> env;
  for (const std::string& entry : base) {
    const std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    if (StartsWith(name, "MESHRUN_") || name == "OMP_NUM_THREADS" || name == "OMP_WAIT_POLICY" ||
        name == "GOMP_SPINCOUNT") {
      continue;  // set by BuildRankCommand
    }
    // What the worker sets for this rank wins over its own value (CUDA_VISIBLE_DEVICES).
    if (std::any_of(vars.begin(), vars.end(), [&](const auto& v) { return v.first == name; })) {
      continue;
    }
    if (!IsInheritedByRanks(name) && std::find(pass.begin(), pass.end(), name) == pass.end()) {
      continue;
    }
    env.push_back(entry);
  }
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

bool IsSafeJobId(std::string_view id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  return std::all_of(id.begin(), id.end(),
                     [](char ch) { return ch > ' ' && ch < 127 && ch != '/' && ch != '\\'; });
}

v1::MetricsSample SampleOfStep(const v1::RankStep& step, const std::string& job_id, int attempt,
                               int rank) {
  v1::MetricsSample s;
  s.set_job_id(job_id);
  s.set_attempt(attempt);
  s.set_rank(rank);
  s.set_step(step.step());
  SetTimestamp(std::chrono::system_clock::now(), s.mutable_time());
  s.set_loss(step.loss());
  s.set_lr(step.lr());
  s.set_grad_norm(step.grad_norm());
  s.set_step_seconds(step.step_seconds());
  s.set_tokens_per_second(step.tokens_per_second());
  s.set_tflops(step.tflops());
  s.set_mfu(step.mfu());
  s.set_memory_allocated_bytes(
      static_cast<uint64_t>(std::max<int64_t>(0, step.allocated_memory_bytes())));
  s.set_memory_peak_bytes(static_cast<uint64_t>(std::max<int64_t>(0, step.peak_memory_bytes())));
  s.set_memory_reserved_bytes(
      static_cast<uint64_t>(std::max<int64_t>(0, step.reserved_memory_bytes())));
  if (step.has_pipeline_bubble_ratio()) {
    // A ratio of the step's time: outside 0 … 1 (or NaN) is a rank's bug, not a measurement.
    const double bubble = step.pipeline_bubble_ratio();
    if (bubble >= 0 && bubble <= 1) s.set_pipeline_bubble_ratio(bubble);
  }
  if (step.has_pipeline_bubble_theory()) {
    const double theory = step.pipeline_bubble_theory();
    if (theory >= 0 && theory <= 1) s.set_pipeline_bubble_theory(theory);
  }
  for (const v1::RankCommCounter& c : step.comm()) {
    // Only parallelism traffic of the mesh's own four axes has a metric series (docs/metrics.md).
    if (c.kind() != v1::COMM_KIND_AXIS || c.op() == v1::COMM_OP_UNSPECIFIED) continue;
    const std::optional<MeshAxis> axis = MeshAxisFromProto(c.axis());
    if (!axis || IsFlattenedAxis(*axis)) continue;
    v1::CommStats* out = s.add_comm();
    out->set_axis(c.axis());
    out->set_op(c.op());
    out->set_seconds(std::max(0.0, c.seconds()));
    out->set_overlapped_seconds(
        std::clamp(c.overlapped_seconds(), 0.0, std::max(0.0, c.seconds())));
    out->set_bytes(static_cast<uint64_t>(std::max(0.0, c.bytes())));
    out->set_calls(c.calls());
  }
  return s;
}

}  // namespace meshrun
