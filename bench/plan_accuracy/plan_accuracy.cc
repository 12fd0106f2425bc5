// bench/plan_accuracy: how well the planner predicts what it is used for. For two model shapes
// and each world size, every mesh the planner lists (activation checkpointing none, cp
// allgather, reshard after forward: the settings parallelism.auto keeps) runs as a real
// `meshrun train --nproc W -o json` on this host, and its measured peak memory (max over
// ranks) and median step time stand beside the prediction on this host's calibrated figures
// (engine/calibration, measured before each world's runs). Per (shape, world) it prints the
// Spearman rank correlation of predicted and measured step time and how far the planner's
// first choice is from the fastest measured; then one JSON line.
//
//   plan_accuracy [--worlds 2,4,8] [--steps 6] [--warmup 2] [--repeats 3]
//                 [--timed-seconds 1.5] [--timing-worlds 2,4] [--shapes tiny,small]
//
// A run's step time is the median of its steps after the first --warmup (Gloo's connections,
// the allocator and the caches settle there). A mesh's later repeats run enough steps for
// about --timed-seconds of timed steps at its first run's pace (at most 40): a 20 ms step
// measured over three steps is at the mercy of one scheduler hiccup on a shared host. Timing runs
// are repeated (--repeats, interleaved over the meshes; the median of the runs counts) only for
// --timing-worlds; other worlds run once, for memory. Ranks run one OpenMP thread each
// (OMP_NUM_THREADS=1).
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
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/calibration/calibration.h"
#include "engine/train/planner.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Runs meshrun with `args`, returning its stdout (empty on failure).
std::string Run(const fs::path& meshrun, const std::vector<std::string>& args,
                const fs::path& err) {
  std::string command = "OMP_NUM_THREADS=1 timeout 600 '" + meshrun.string() + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  command += " 2>'" + err.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0) {
    std::fprintf(stderr, "meshrun failed; see %s\n", err.c_str());
    return "";
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Ranks 1…n, ties sharing their mean rank.
std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < v.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = (i + j) / 2.0 + 1;
    i = j + 1;
  }
  return r;
}

// Spearman's rho: the Pearson correlation of the ranks.
double Spearman(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() < 2) return 1;
  const std::vector<double> ra = Ranks(a), rb = Ranks(b);
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

struct Row {
  std::string shape;
  int world = 0;
  meshrun::PlanRow plan;
  double measured_peak = 0;
  double measured_step = 0;  // median over repeats of the median of the steps after the first
  std::vector<double> runs;  // each run's median step
};

std::string MeshOf(const meshrun::ParallelismSpec& p) {
  return std::to_string(p.dp_replicate_size) + "," + std::to_string(p.dp_shard_size) + "," +
         std::to_string(p.cp_size) + "," + std::to_string(p.tp_size);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds = {2, 4, 8}, timing_worlds = {2, 4};
  std::vector<std::string> shapes = {"tiny", "small"};
  int steps = 6, warmup = 2, repeats = 3;
  double timed_seconds = 1.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    auto ints = [&](std::vector<int>* out) {
      out->clear();
      for (const std::string& s : Split(next())) out->push_back(std::stoi(s));
    };
    if (a == "--worlds") {
      ints(&worlds);
    } else if (a == "--timing-worlds") {
      ints(&timing_worlds);
    } else if (a == "--steps") {
      steps = std::stoi(next());
    } else if (a == "--timed-seconds") {
      timed_seconds = std::stod(next());
    } else if (a == "--warmup") {
      warmup = std::stoi(next());
    } else if (a == "--repeats") {
      repeats = std::stoi(next());
    } else if (a == "--shapes") {
      shapes = Split(next());
    } else {
      std::fprintf(stderr,
                   "usage: plan_accuracy [--worlds 2,4,8] [--timing-worlds 2,4] [--steps N] "
                   "[--warmup N] [--repeats N] [--timed-seconds S] [--shapes tiny,small]\n");
      return 2;
    }
  }
  const fs::path meshrun = fs::canonical("/proc/self/exe").parent_path() / "meshrun";
  const fs::path spec_file = fs::path(MESHRUN_SOURCE_DIR) / "examples/tiny.yaml";
  char tmpl[] = "/tmp/meshrun_bench_plan_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const fs::path temp = tmpl;
  // Training data: seeded pseudo-random bytes (no download, no file of the host needed).
  const fs::path data = temp / "data.txt";
  {
    std::ofstream out(data, std::ios::binary);
    uint32_t x = 12345;
    for (int i = 0; i < (1 << 18); ++i) {
      x = x * 1664525u + 1013904223u;
      out.put(static_cast<char>('a' + (x >> 24) % 26));
    }
  }
  const std::string yaml = [&] {
    std::ifstream in(spec_file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  const std::map<std::string, std::vector<std::string>> shape_sets = {
      {"tiny", {"model.n_layer=2", "model.n_head=4", "model.d_model=64", "model.seq_len=64"}},
      {"small", {"model.n_layer=4", "model.n_head=8", "model.d_model=128", "model.seq_len=128"}},
  };
  const std::vector<std::string> common = {"train.global_batch_size=8",
                                           "train.micro_batch_size=1",
                                           "train.steps=" + std::to_string(steps),
                                           "resources.threads=1",
                                           "checkpoint.dir=",
                                           "data.val=",
                                           "data.format=text",
                                           "data.train=" + data.string()};

  if (warmup < 0 || steps <= warmup) {
    std::fprintf(stderr, "--steps (%d) must be more than --warmup (%d)\n", steps, warmup);
    return 2;
  }
  std::vector<Row> rows;
  json calibrations = json::array();
  std::printf(
      "plan_accuracy: predicted (calibrated host) vs measured `meshrun train --nproc W`, "
      "%d steps (the first %d dropped), micro batch 1, global batch 8, one thread per rank\n\n",
      steps, warmup);
  std::printf(
      "| shape | W | mesh (R,S,C,T) | peak MiB pred | peak MiB meas | err | step s pred "
      "| step s meas | pred rank | meas rank |\n|---|---|---|---|---|---|---|---|---|---|"
      "\n");
  std::fflush(stdout);
  json groups = json::array();
  for (const std::string& shape : shapes) {
    for (int world : worlds) {
      std::vector<std::string> sets = shape_sets.at(shape);
      sets.insert(sets.end(), common.begin(), common.end());
      meshrun::StatusOr<meshrun::JobSpec> spec = meshrun::ParseJobSpecYaml(yaml, sets);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
        return 1;
      }
      // Calibrate as ranks of this world would see the host: five times, the medians.
      std::vector<double> gemm, bw, lat;
      for (int k = 0; k < 5; ++k) {
        meshrun::CalibrationOptions options;
        options.ranks = std::clamp(world, 2, 8);
        options.bytes = size_t{1} << 20;
        meshrun::StatusOr<meshrun::HostCalibration> c = meshrun::CalibrateHost(options);
        if (!c.ok()) {
          std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
          return 1;
        }
        gemm.push_back(c->gemm_flops);
        bw.push_back(c->loopback_bus_bandwidth);
        lat.push_back(c->loopback_latency);
      }
      meshrun::ClusterShape cluster;
      cluster.nodes = 1;
      cluster.per_node = world;
      cluster.device = meshrun::CalibratedCpuProfile(Median(gemm), 0, world, Median(bw),
                                                     Median(lat), std::clamp(world, 2, 8));
      calibrations.push_back({{"shape", shape},
                              {"world", world},
                              {"host_gemm_flops", Median(gemm)},
                              {"loopback_bus_bandwidth", Median(bw)},
                              {"loopback_latency_seconds", Median(lat)}});
      meshrun::StatusOr<std::vector<meshrun::PlanRow>> plan = meshrun::Plan(*spec, cluster);
      if (!plan.ok()) return 1;
      std::vector<Row> group;
      std::set<std::string> seen;
      for (const meshrun::PlanRow& r : *plan) {
        const meshrun::ParallelismSpec& p = r.spec.parallelism;
        // Only what the engine runs (a pipeline may be planned on paper) and without stages:
        // the measured runs pass the four sizes.
        if (!r.engine_runs || p.pp_size > 1) continue;
        if (r.spec.train.activation_checkpointing != "none" || p.cp_comm_strategy != "allgather" ||
            !p.fsdp_reshard_after_forward || !seen.insert(MeshOf(p)).second) {
          continue;
        }
        Row row;
        row.shape = shape;
        row.world = world;
        row.plan = r;
        group.push_back(row);
      }
      const bool timed =
          std::find(timing_worlds.begin(), timing_worlds.end(), world) != timing_worlds.end();
      // Repeats interleave the meshes, so that a burst of load on the shared host does not
      // fall on one mesh's runs only.
      for (int rep = 0; rep < (timed ? repeats : 1); ++rep) {
        for (Row& row : group) {
          const meshrun::ParallelismSpec& p = row.plan.spec.parallelism;
          std::vector<std::string> args = {
              "train", "-f", spec_file.string(), "--nproc", std::to_string(world), "-o", "json"};
          std::vector<std::string> run_sets = sets;
          if (rep > 0 && !row.runs.empty() && row.runs.front() > 0) {
            const int timed_steps =
                std::clamp(static_cast<int>(std::ceil(timed_seconds / row.runs.front())),
                           steps - warmup, 40 - warmup);
            run_sets.push_back("train.steps=" + std::to_string(warmup + timed_steps));
          }
          run_sets.push_back("parallelism.dp_replicate_size=" +
                             std::to_string(p.dp_replicate_size));
          run_sets.push_back("parallelism.dp_shard_size=" + std::to_string(p.dp_shard_size));
          run_sets.push_back("parallelism.cp_size=" + std::to_string(p.cp_size));
          run_sets.push_back("parallelism.tp_size=" + std::to_string(p.tp_size));
          for (const std::string& x : run_sets) {
            args.push_back("--set");
            args.push_back(x);
          }
          const std::string out = Run(meshrun, args, temp / (shape + "-" + MeshOf(p) + ".err"));
          std::stringstream in(out);
          std::string line;
          std::vector<double> step_seconds;
          while (std::getline(in, line)) {
            json j = json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.is_object()) continue;
            if (j.value("event", "") == "summary") row.measured_peak = j["peak_memory_bytes"];
            if (j.value("event", "") == "step") step_seconds.push_back(j["step_seconds"]);
          }
          if (step_seconds.size() > static_cast<size_t>(warmup)) {
            step_seconds.erase(step_seconds.begin(), step_seconds.begin() + warmup);
          }
          row.runs.push_back(Median(step_seconds));
        }
      }
      std::vector<double> pred, meas;
      for (Row& row : group) {
        row.measured_step = Median(row.runs);
        pred.push_back(row.plan.step_seconds);
        meas.push_back(row.measured_step);
      }
      const std::vector<double> pred_rank = Ranks(pred), meas_rank = Ranks(meas);
      for (size_t i = 0; i < group.size(); ++i) {
        const Row& row = group[i];
        const double pp = static_cast<double>(row.plan.memory.peak_bytes);
        const double err = row.measured_peak > 0 ? (pp - row.measured_peak) / row.measured_peak : 0;
        std::printf("| %s | %d | %s | %.2f | %.2f | %+.1f%% | %.4f | %.4f | %.0f | %.0f |\n",
                    shape.c_str(), world, MeshOf(row.plan.spec.parallelism).c_str(), pp / (1 << 20),
                    row.measured_peak / (1 << 20), 100 * err, row.plan.step_seconds,
                    row.measured_step, pred_rank[i], meas_rank[i]);
      }
      // The planner's first choice is the fitting row with the best predicted tokens/s: group's
      // first (Plan's order), all of them fit on this host.
      double fastest = 1e30;
      for (const Row& row : group) fastest = std::min(fastest, row.measured_step);
      const double first = group.empty() ? 0 : group.front().measured_step;
      const double rho = Spearman(pred, meas);
      std::printf(
          "|   | %d | %s: Spearman %.2f over %zu meshes; first choice %s measured %.4f s, "
          "fastest %.4f s (%+.1f%%)%s | | | | | | | |\n",
          world, shape.c_str(), rho, group.size(),
          group.empty() ? "-" : MeshOf(group.front().plan.spec.parallelism).c_str(), first, fastest,
          100 * (first / fastest - 1), timed ? "" : " (one run: memory only)");
      std::fflush(stdout);
      groups.push_back({{"shape", shape},
                        {"world", world},
                        {"timed", timed},
                        {"meshes", group.size()},
                        {"spearman", rho},
                        {"first_choice_measured_seconds", first},
                        {"fastest_measured_seconds", fastest},
                        {"first_choice_over_fastest", first / fastest - 1}});
      rows.insert(rows.end(), group.begin(), group.end());
    }
  }
  json out_rows = json::array();
  double worst_memory = 0;
  int memory_rows = 0;
  for (const Row& row : rows) {
    const double pp = static_cast<double>(row.plan.memory.peak_bytes);
    const double err =
        row.measured_peak > 0 ? std::fabs(pp - row.measured_peak) / row.measured_peak : 1.0;
    if (row.world >= 4) {
      worst_memory = std::max(worst_memory, err);
      ++memory_rows;
    }
    const meshrun::ParallelismSpec& p = row.plan.spec.parallelism;
    out_rows.push_back({{"shape", row.shape},
                        {"world", row.world},
                        {"mesh",
                         {{"dp_replicate", p.dp_replicate_size},
                          {"dp_shard", p.dp_shard_size},
                          {"cp", p.cp_size},
                          {"tp", p.tp_size}}},
                        {"predicted_peak_memory_bytes", row.plan.memory.peak_bytes},
                        {"measured_peak_memory_bytes", row.measured_peak},
                        {"predicted_step_seconds", row.plan.step_seconds},
                        {"measured_step_seconds", row.measured_step},
                        {"measured_runs", row.runs}});
  }
  std::printf("\nworld ≥ 4: %d rows, worst peak-memory error %.2f%%\n", memory_rows,
              100 * worst_memory);
  json line = {{"bench", "plan_accuracy"},
               {"steps", steps},
               {"warmup", warmup},
               {"timed_seconds", timed_seconds},
               {"repeats", repeats},
               {"worst_memory_error_world_ge_4", worst_memory},
               {"memory_rows_world_ge_4", memory_rows},
               {"groups", groups},
               {"calibration", calibrations},
               {"rows", out_rows}};
  std::printf("%s\n", line.dump().c_str());
  fs::remove_all(temp);
  return 0;
}
