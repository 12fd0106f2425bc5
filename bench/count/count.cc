// bench/count: what counting a rank's step costs (CountRank, engine/train/counted_step.h), the
// figures behind decision 0076 (why the planner's table keeps the memory model). For a spec
// (default: examples/planning/llama3-70b.yaml) and a list of meshes (default: of the 1,024 ranks
// of `meshrun plan`'s 128 × 8 example, pp 1 to 64, one with 2 layers), each row counts rank 0
// `--repeats` times and prints the mean time per count, the rank's counted bytes, and a plan
// row's cost at that rate: a row's largest rank is the largest of its stages' first and last
// ranks, 2 counts without pp and 2·pp with it. Then the plan itself (`meshrun plan` of the spec
// on --nodes × --per-node of --device): its rows per pp, each pp's first row counted the same
// way, and what counting every row would take on one core. Tables, then one JSON line.
//
//   count [--spec FILE] [--meshes pp:tp:dp_shard[:layers],...] [--repeats N]
//         [--nodes 128] [--per-node 8] [--device h100]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/train/counted_step.h"
#include "engine/train/planner.h"

namespace {

using json = nlohmann::json;

struct Mesh {
  int pp = 1, tp = 1, dp_shard = 1, layers = 0;  // layers 0: the spec's
};

std::vector<Mesh> ParseMeshes(const std::string& text) {
  std::vector<Mesh> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    Mesh m;
    if (std::sscanf(item.c_str(), "%d:%d:%d:%d", &m.pp, &m.tp, &m.dp_shard, &m.layers) >= 3) {
      out.push_back(m);
    }
  }
  return out;
}

// Mean milliseconds of CountRank(spec, 0) over `repeats`, after one untimed (the allocator's
// first pages); -1 (and the error on stderr) when the spec cannot be counted.
double MsPerCount(const meshrun::JobSpec& spec, int repeats, int64_t* bytes) {
  (void)meshrun::CountRank(spec, 0);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) {
    meshrun::StatusOr<meshrun::CountedRank> c = meshrun::CountRank(spec, 0);
    if (!c.ok()) {
      std::fprintf(stderr, "count: %s\n", c.status().ToString().c_str());
      return -1;
    }
    *bytes = c->Total();
  }
  return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         repeats;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_path = std::string(MESHRUN_SOURCE_DIR) + "/examples/planning/llama3-70b.yaml";
  std::string meshes_text = "1:8:128,1:8:128:2,2:8:64,4:8:32,8:8:16,16:8:8,32:8:4,64:4:4";
  int repeats = 5;
  int nodes = 128, per_node = 8;
  std::string device = "h100";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--spec") {
      spec_path = value;
    } else if (flag == "--meshes") {
      meshes_text = value;
    } else if (flag == "--repeats") {
      repeats = std::max(1, std::atoi(value));
    } else if (flag == "--nodes") {
      nodes = std::atoi(value);
    } else if (flag == "--per-node") {
      per_node = std::atoi(value);
    } else if (flag == "--device") {
      device = value;
    } else {
      std::fprintf(stderr, "count: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  meshrun::StatusOr<meshrun::JobSpec> spec = meshrun::LoadJobSpecFile(spec_path, {});
  if (!spec.ok()) {
    std::fprintf(stderr, "count: %s\n", spec.status().ToString().c_str());
    return 2;
  }

  // The meshes asked for.
  std::printf("%s, %d counts per row\n\n", spec_path.c_str(), repeats);
  std::printf("%-5s %-4s %-9s %-7s %-8s %12s %14s %16s\n", "pp", "tp", "dp_shard", "layers",
              "ranks", "ms / count", "counted GiB", "ms / plan row");
  json rows = json::array();
  for (const Mesh& m : ParseMeshes(meshes_text)) {
    meshrun::JobSpec s = *spec;
    s.parallelism.pp_size = m.pp;
    s.parallelism.tp_size = m.tp;
    s.parallelism.dp_shard_size = m.dp_shard;
    if (m.layers > 0) s.model.n_layer = m.layers;
    int64_t bytes = 0;
    const double ms = MsPerCount(s, repeats, &bytes);
    if (ms < 0) return 1;
    const double per_row = ms * 2 * m.pp;
    const int ranks = m.pp * m.tp * m.dp_shard;
    std::printf("%-5d %-4d %-9d %-7d %-8d %12.2f %14.3f %16.1f\n", m.pp, m.tp, m.dp_shard,
                s.model.n_layer, ranks, ms, bytes / 1073741824.0, per_row);
    rows.push_back({{"pp", m.pp},
                    {"tp", m.tp},
                    {"dp_shard", m.dp_shard},
                    {"n_layer", s.model.n_layer},
                    {"ranks", ranks},
                    {"ms_per_count", ms},
                    {"counted_bytes", bytes},
                    {"ms_per_plan_row", per_row}});
  }

  // The plan: its rows per pp, each pp's first row counted, the whole table's cost at that rate.
  meshrun::ClusterShape cluster;
  cluster.nodes = nodes;
  cluster.per_node = per_node;
  meshrun::StatusOr<meshrun::DeviceProfile> profile = meshrun::DeviceProfileNamed(device);
  if (!profile.ok()) {
    std::fprintf(stderr, "count: %s\n", profile.status().ToString().c_str());
    return 2;
  }
  cluster.device = *profile;
  const auto plan_start = std::chrono::steady_clock::now();
  meshrun::StatusOr<std::vector<meshrun::PlanRow>> plan = meshrun::Plan(*spec, cluster);
  const double plan_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - plan_start).count();
  if (!plan.ok()) {
    std::fprintf(stderr, "count: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  std::map<int, std::pair<int, const meshrun::JobSpec*>> by_pp;  // rows, the first row's spec
  for (const meshrun::PlanRow& r : *plan) {
    auto& e = by_pp[r.spec.parallelism.pp_size];
    if (e.first++ == 0) e.second = &r.spec;
  }
  std::printf("\nthe plan on %d × %d %s: %zu rows from the memory model in %.2f s\n\n", nodes,
              per_node, device.c_str(), plan->size(), plan_s);
  std::printf("%-5s %8s %12s %16s %14s\n", "pp", "rows", "ms / count", "ms / plan row",
              "s, all rows");
  double total_s = 0;
  json plan_rows = json::array();
  for (const auto& [pp, e] : by_pp) {
    int64_t bytes = 0;
    const double ms = MsPerCount(*e.second, repeats, &bytes);
    if (ms < 0) return 1;
    const double per_row = ms * 2 * pp;
    const double all_s = per_row * e.first / 1e3;
    total_s += all_s;
    std::printf("%-5d %8d %12.2f %16.1f %14.1f\n", pp, e.first, ms, per_row, all_s);
    plan_rows.push_back({{"pp", pp},
                         {"rows", e.first},
                         {"ms_per_count", ms},
                         {"ms_per_plan_row", per_row},
                         {"seconds", all_s}});
  }
  std::printf("counting every row: %.0f s of one core (the memory model's table: %.2f s)\n",
              total_s, plan_s);
  const json plan_json = {{"nodes", nodes},          {"per_node", per_node},
                          {"device", device},        {"rows", plan->size()},
                          {"model_seconds", plan_s}, {"count_seconds", total_s},
                          {"by_pp", plan_rows}};
  std::printf("%s\n", json{{"bench", "count"},
                           {"spec", spec_path},
                           {"repeats", repeats},
                           {"rows", rows},
                           {"plan", plan_json}}
                          .dump()
                          .c_str());
  return 0;
}
