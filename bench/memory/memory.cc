// bench/memory: what FSDP and activation checkpointing save, measured through the product.
// Each row runs `meshrun train --nproc S` (one process per rank, OMP_NUM_THREADS=1) and prints,
// per memory kind, the memory model's prediction and the engine's own step counted on the
// counting device (CountRank, every rank) beside the measured peak (the maximum over ranks of the
// engine's counts), the whole peak, and the kernel's max RSS of the largest rank.
// A second table times activation checkpointing on one rank at GPT-2-small shapes.
//
//   memory [--shards 1,2,4,8] [--modes none,selective,full] [--steps N] [--no-gpt2]
//          [--gpt2-seq 1024] [--gpt2-steps N]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/train/counted_step.h"
#include "engine/train/memory_model.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using meshrun::MemoryKind;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Runs meshrun with `args`, returning its stdout (empty on failure, with stderr shown).
std::string Run(const fs::path& meshrun, const std::vector<std::string>& args,
                const fs::path& err) {
  std::string command = "OMP_NUM_THREADS=1 timeout 900 '" + meshrun.string() + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  command += " 2>'" + err.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    std::fprintf(stderr, "meshrun failed (status %d); see %s\n", status, err.c_str());
    return "";
  }
  return out;
}

json LastSummary(const std::string& out, std::vector<double>* step_seconds) {
  json summary;
  std::stringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.value("event", "") == "summary") summary = j;
    if (j.value("event", "") == "step" && step_seconds) step_seconds->push_back(j["step_seconds"]);
  }
  return summary;
}

double MiB(double bytes) {
  return bytes / (1 << 20);
}

constexpr const char* kKinds[] = {"parameters",  "gradients",     "optimizer",
                                  "activations", "communication", "other"};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> shards = {1, 2, 4, 8};
  std::vector<std::string> modes = {"none", "selective", "full"};
  int steps = 3, gpt2_seq = 1024, gpt2_steps = 3;
  bool gpt2 = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--shards") {
      shards.clear();
      for (const std::string& s : Split(next())) shards.push_back(std::stoi(s));
    } else if (a == "--modes") {
      modes = Split(next());
    } else if (a == "--steps") {
      steps = std::stoi(next());
    } else if (a == "--no-gpt2") {
      gpt2 = false;
    } else if (a == "--gpt2-seq") {
      gpt2_seq = std::stoi(next());
    } else if (a == "--gpt2-steps") {
      gpt2_steps = std::stoi(next());
    } else {
      std::fprintf(stderr,
                   "usage: memory [--shards 1,2,4,8] [--modes none,selective,full] "
                   "[--steps N] [--no-gpt2] [--gpt2-seq T] [--gpt2-steps N]\n");
      return 2;
    }
  }
  const fs::path meshrun = fs::canonical("/proc/self/exe").parent_path() / "meshrun";
  const fs::path spec_file = fs::path(MESHRUN_SOURCE_DIR) / "examples/tiny.yaml";
  char tmpl[] = "/tmp/meshrun_bench_memory_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const fs::path temp = tmpl;
  const std::string yaml = [&] {
    std::ifstream in(spec_file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();

  // The model of issue "memory that scales": state dominates (25M parameters, seq 64).
  const std::vector<std::string> model = {"model.n_layer=8",
                                          "model.d_model=512",
                                          "model.n_head=8",
                                          "model.seq_len=64",
                                          "train.micro_batch_size=1",
                                          "train.global_batch_size=8",
                                          "resources.threads=1",
                                          "checkpoint.every=0",
                                          "data.val=",
                                          "train.steps=" + std::to_string(steps)};
  json rows = json::array();
  std::printf(
      "FSDP × activation checkpointing: 8 layers, d_model 512, seq 64, micro batch 1, "
      "%d steps, one thread per rank; MiB, memory model / counted / measured (max over ranks)\n\n",
      steps);
  std::printf(
      "| dp_shard | AC | parameters | gradients | optimizer | activations | "
      "communication | peak | peak vs dp_shard 1 | max RSS | RSS vs dp_shard 1 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, std::pair<double, double>> base;  // mode → (peak, rss) at dp_shard 1
  for (const std::string& mode : modes) {
    for (int s : shards) {
      std::vector<std::string> sets = model;
      sets.push_back("parallelism.dp_shard_size=" + std::to_string(s));
      sets.push_back("train.activation_checkpointing=" + mode);
      const std::string name = "S" + std::to_string(s) + "-" + mode;
      sets.push_back("checkpoint.dir=" + (temp / name).string());
      meshrun::StatusOr<meshrun::JobSpec> spec = meshrun::ParseJobSpecYaml(yaml, sets);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
        return 1;
      }
      const meshrun::MemoryPrediction want = meshrun::PredictRankMemory(*spec);
      // The engine's own step counted on the counting device, every rank (each kind's largest,
      // as the summary reports it): engine/train/counted_step.h.
      meshrun::MemoryBreakdown counted;
      int64_t counted_peak = 0;
      for (int r = 0; r < s; ++r) {
        meshrun::StatusOr<meshrun::CountedRank> c = meshrun::CountRank(*spec, r);
        if (!c.ok()) {
          std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
          return 1;
        }
        for (int k = 0; k < meshrun::kNumMemoryKinds; ++k) {
          counted.peak[k] = std::max(counted.peak[k], c->memory.peak[k]);
        }
        counted_peak = std::max(counted_peak, c->Total(/*with_other=*/false));
      }
      std::vector<std::string> args = {
          "train", "-f", spec_file.string(), "--nproc", std::to_string(s), "-o", "json"};
      for (const std::string& x : sets) {
        args.push_back("--set");
        args.push_back(x);
      }
      const json summary = LastSummary(Run(meshrun, args, temp / (name + ".err")), nullptr);
      if (summary.is_null()) continue;
      const double peak = summary["peak_memory_bytes"], rss = summary["max_rss_bytes"];
      if (s == 1) base[mode] = {peak, rss};
      std::printf("| %d | %s |", s, mode.c_str());
      json row = {{"dp_shard", s}, {"activation_checkpointing", mode}};
      double worst = 0;
      for (int k = 0; k < 5; ++k) {
        const double got = summary["memory"][kKinds[k]];
        const double pred = static_cast<double>(want.bytes[k]);
        const double count = static_cast<double>(counted.peak[k]);
        std::printf(" %.1f / %.1f / %.1f |", MiB(pred), MiB(count), MiB(got));
        row["predicted"][kKinds[k]] = pred;
        row["counted"][kKinds[k]] = count;
        row["measured"][kKinds[k]] = got;
        if (got > 0 || pred > 0 || count > 0) {
          worst = std::max(worst, std::fabs(pred - got) / std::max(got, 1.0));
          worst = std::max(worst, std::fabs(count - got) / std::max(got, 1.0));
        }
      }
      const auto& b = base.count(mode) ? base[mode] : std::pair<double, double>{0, 0};
      std::printf(" %.1f / %.1f / %.1f | %s | %.1f | %s |\n", MiB(want.peak_bytes),
                  MiB(static_cast<double>(counted_peak)), MiB(peak),
                  b.first > 0 ? (std::to_string(peak / b.first).substr(0, 4) + "×").c_str() : "",
                  MiB(rss),
                  b.second > 0 ? (std::to_string(rss / b.second).substr(0, 4) + "×").c_str() : "");
      row["predicted_peak_bytes"] = want.peak_bytes;
      row["counted_peak_bytes"] = counted_peak;
      row["peak_memory_bytes"] = peak;
      row["max_rss_bytes"] = rss;
      row["worst_part_error"] = worst;
      rows.push_back(row);
      std::fflush(stdout);
    }
  }

  json ac_rows = json::array();
  if (gpt2) {
    std::printf(
        "\nActivation checkpointing on one rank, GPT-2-small shapes (12 layers, d_model "
        "768, 12 heads, vocab 50257), seq %d, micro batch 1, %d steps (first dropped)\n\n",
        gpt2_seq, gpt2_steps);
    std::printf("| AC | activations MiB (pred / measured) | vs none | step s | vs none |\n");
    std::printf("|---|---|---|---|---|\n");
    double none_acts = 0, none_step = 0;
    for (const std::string& mode : modes) {
      std::vector<std::string> sets = {"model.n_layer=12",
                                       "model.d_model=768",
                                       "model.n_head=12",
                                       "model.vocab_size=50257",
                                       "model.seq_len=" + std::to_string(gpt2_seq),
                                       "train.micro_batch_size=1",
                                       "train.global_batch_size=1",
                                       "data.val=",
                                       "train.steps=" + std::to_string(gpt2_steps),
                                       "checkpoint.dir=",
                                       "train.activation_checkpointing=" + mode};
      meshrun::StatusOr<meshrun::JobSpec> spec = meshrun::ParseJobSpecYaml(yaml, sets);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
        return 1;
      }
      const meshrun::MemoryPrediction want = meshrun::PredictRankMemory(*spec);
      std::vector<std::string> args = {"train", "-f", spec_file.string(), "-o", "json"};
      for (const std::string& x : sets) {
        args.push_back("--set");
        args.push_back(x);
      }
      std::vector<double> times;
      const json summary =
          LastSummary(Run(meshrun, args, temp / ("gpt2-" + mode + ".err")), &times);
      if (summary.is_null() || times.size() < 2) continue;
      double step = 1e30;
      for (size_t i = 1; i < times.size(); ++i) step = std::min(step, times[i]);
      const double acts = summary["memory"]["activations"];
      if (mode == "none") none_acts = acts, none_step = step;
      std::printf(
          "| %s | %.1f / %.1f | %s | %.2f | %s |\n", mode.c_str(),
          MiB(static_cast<double>(want.of(MemoryKind::kActivations))), MiB(acts),
          none_acts > 0 ? (std::to_string(acts / none_acts).substr(0, 4) + "×").c_str() : "", step,
          none_step > 0 ? (std::to_string(step / none_step).substr(0, 4) + "×").c_str() : "");
      ac_rows.push_back({{"activation_checkpointing", mode},
                         {"activations_bytes", acts},
                         {"predicted_activations_bytes", want.of(MemoryKind::kActivations)},
                         {"step_seconds", step}});
      std::fflush(stdout);
    }
  }
  std::error_code ec;
  fs::remove_all(temp, ec);
  std::printf("\n%s\n",
              json({{"bench", "memory"}, {"fsdp", rows}, {"recompute", ac_rows}}).dump().c_str());
  return 0;
}
