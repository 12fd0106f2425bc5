// The worker <-> rank protocol (see rank_protocol.h and docs/control-plane.md).
#include "worker/rank_protocol.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>

#include "proto/duration.h"

namespace meshrun {
namespace {

using json = nlohmann::json;

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.substr(0, prefix.size()) == prefix;
}

double NumberOr(const json& object, const char* key, double fallback) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return fallback;
  return it->get<double>();
}

// "tp" -> MESH_AXIS_TP, "all_reduce" -> COMM_OP_ALL_REDUCE; false for names the proto lacks
// (flattened groups such as "dp_cp", the trainer's "metrics" label).
template <typename Enum, typename Parse>
bool ParseEnumName(const json& name, const std::string& prefix, Parse parse, Enum* out) {
  if (!name.is_string()) return false;
  std::string full = prefix;
  for (char ch : name.get<std::string>()) {
    if (!(std::islower(static_cast<unsigned char>(ch)) || ch == '_')) return false;
    full.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  }
  return parse(full, out) && static_cast<int>(*out) != 0;
}

// The step line's "comm" array as CommStats entries; malformed or unknown entries are skipped.
void ParseComm(const json& object, v1::MetricsSample* s) {
  auto comm = object.find("comm");
  if (comm == object.end() || !comm->is_array()) return;
  for (const json& entry : *comm) {
    if (!entry.is_object()) continue;
    v1::MeshAxis axis;
    v1::CommOp op;
    auto parse_axis = [](const std::string& n, v1::MeshAxis* v) {
      return v1::MeshAxis_Parse(n, v);
    };
    auto parse_op = [](const std::string& n, v1::CommOp* v) { return v1::CommOp_Parse(n, v); };
    if (!ParseEnumName(entry.value("axis", json()), "MESH_AXIS_", parse_axis, &axis) ||
        !ParseEnumName(entry.value("op", json()), "COMM_OP_", parse_op, &op)) {
      continue;
    }
    v1::CommStats* c = s->add_comm();
    c->set_axis(axis);
    c->set_op(op);
    c->set_seconds(std::max(0.0, NumberOr(entry, "seconds", 0)));
    c->set_bytes(static_cast<uint64_t>(std::max(0.0, NumberOr(entry, "bytes", 0))));
    c->set_calls(static_cast<uint64_t>(std::max(0.0, NumberOr(entry, "calls", 0))));
  }
}

}  // namespace

RankCommand BuildRankCommand(const v1::RankAssignment& a, const RankLaunchConfig& config) {
  RankCommand cmd;
  cmd.argv = {config.meshrun_binary,          "train", "-f",  config.spec_path, "--nproc",
              std::to_string(a.world_size()), "-o",    "json"};
  const int local = std::max(1, a.local_world_size());
  const int threads = std::max(1, config.cores / local);
  cmd.env = {{"MESHRUN_RANK", std::to_string(a.rank())},
             {"MESHRUN_WORLD_SIZE", std::to_string(a.world_size())},
             {kEnvStoreAddress, a.store().address()},
             {kEnvJobId, a.job_id()},
             {kEnvAttempt, std::to_string(a.attempt())},
             {kEnvHost, config.host},
             {kEnvReportAllRanks, "1"},
             {kEnvLocalRank, std::to_string(a.local_rank())},
             {kEnvLocalWorldSize, std::to_string(local)},
             {"OMP_NUM_THREADS", std::to_string(threads)}};
  if (!a.resume_checkpoint().empty())
    cmd.env.emplace_back(kEnvResumeCheckpoint, a.resume_checkpoint());
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
    if (StartsWith(name, "MESHRUN_") || name == "OMP_NUM_THREADS") continue;
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

std::optional<v1::MetricsSample> ParseStepLine(std::string_view line, const std::string& job_id,
                                               int attempt, int rank) {
  // Cheap filter first: most lines a rank prints are not step lines.
  if (line.empty() || line.front() != '{' || line.find("\"step\"") == std::string_view::npos) {
    return std::nullopt;
  }
  const json object = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return std::nullopt;
  auto event = object.find("event");
  if (event == object.end() || !event->is_string() || *event != "step") return std::nullopt;
  auto step = object.find("step");
  if (step == object.end() || !step->is_number_integer()) return std::nullopt;
  v1::MetricsSample s;
  s.set_job_id(job_id);
  s.set_attempt(attempt);
  s.set_rank(rank);
  s.set_step(step->get<int64_t>());
  SetTimestamp(std::chrono::system_clock::now(), s.mutable_time());
  s.set_loss(NumberOr(object, "loss", 0));
  s.set_lr(NumberOr(object, "lr", 0));
  s.set_grad_norm(NumberOr(object, "grad_norm", 0));
  if (object.contains("val_loss")) s.set_val_loss(NumberOr(object, "val_loss", 0));
  s.set_step_seconds(NumberOr(object, "step_seconds", 0));
  s.set_tokens_per_second(NumberOr(object, "tokens_per_second", 0));
  s.set_tflops(NumberOr(object, "tflops", 0));
  s.set_mfu(NumberOr(object, "mfu", 0));
  s.set_memory_allocated_bytes(
      static_cast<uint64_t>(std::max(0.0, NumberOr(object, "allocated_memory_bytes", 0))));
  s.set_memory_peak_bytes(
      static_cast<uint64_t>(std::max(0.0, NumberOr(object, "peak_memory_bytes", 0))));
  s.set_memory_reserved_bytes(
      static_cast<uint64_t>(std::max(0.0, NumberOr(object, "reserved_memory_bytes", 0))));
  ParseComm(object, &s);
  return s;
}

std::optional<v1::CheckpointSaved> ParseCheckpointLine(std::string_view line,
                                                       const std::string& job_id, int attempt) {
  constexpr std::string_view kPrefix = "checkpoint ";
  if (!StartsWith(line, kPrefix)) return std::nullopt;
  std::string_view path = line.substr(kPrefix.size());
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  constexpr std::string_view kStep = "step-";
  if (!StartsWith(base, kStep) || base.size() == kStep.size()) return std::nullopt;
  int64_t step = 0;
  const std::string_view digits = base.substr(kStep.size());
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  v1::CheckpointSaved saved;
  saved.set_job_id(job_id);
  saved.set_attempt(attempt);
  saved.set_step(step);
  saved.set_path(std::string(path));
  return saved;
}

void LineSplitter::Feed(std::string_view data, const std::function<void(std::string)>& on_line) {
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const size_t take = newline == std::string_view::npos ? data.size() : newline;
    partial_.append(data.substr(0, take));
    while (partial_.size() > max_line_) {
      on_line(partial_.substr(0, max_line_));
      partial_.erase(0, max_line_);
    }
    if (newline == std::string_view::npos) return;
    if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
    on_line(std::move(partial_));
    partial_.clear();
    data.remove_prefix(newline + 1);
  }
}

void LineSplitter::Flush(const std::function<void(std::string)>& on_line) {
  if (partial_.empty()) return;
  on_line(std::move(partial_));
  partial_.clear();
}

}  // namespace meshrun
