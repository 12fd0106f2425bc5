// bench/count: what counting a rank's step costs (CountRank, engine/train/counted_step.h), the
// figure behind decision 0076 (why the planner's table keeps the memory model). For a spec
// (default: examples/planning/llama3-70b.yaml) and a list of meshes (default: five of the 1,024
// ranks of `meshrun plan`'s 128 × 8 example, one with 2 layers), each row counts rank 0
// `--repeats` times and prints the mean time per count, the rank's counted bytes, and the plan
// rows' cost at that rate: a row's largest rank is the largest of its stages' first and last
// ranks, 2 counts without pp and 2·pp with it. A table, then one JSON line.
//
//   count [--spec FILE] [--meshes pp:tp:dp_shard[:layers],...] [--repeats N]
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/train/counted_step.h"

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

}  // namespace

int main(int argc, char** argv) {
  std::string spec_path = std::string(MESHRUN_SOURCE_DIR) + "/examples/planning/llama3-70b.yaml";
  std::string meshes_text = "1:8:128,1:8:128:2,4:8:32,16:8:8,64:4:4";  // 1,024 ranks each
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--spec")
      spec_path = argv[i + 1];
    else if (flag == "--meshes")
      meshes_text = argv[i + 1];
    else if (flag == "--repeats")
      repeats = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "count: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  meshrun::StatusOr<meshrun::JobSpec> spec = meshrun::LoadJobSpecFile(spec_path, {});
  if (!spec.ok()) {
    std::fprintf(stderr, "count: %s\n", spec.status().ToString().c_str());
    return 2;
  }
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
    (void)meshrun::CountRank(s, 0);  // one first, untimed (the allocator's first pages)
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      meshrun::StatusOr<meshrun::CountedRank> c = meshrun::CountRank(s, 0);
      if (!c.ok()) {
        std::fprintf(stderr, "count: pp %d tp %d dp_shard %d: %s\n", m.pp, m.tp, m.dp_shard,
                     c.status().ToString().c_str());
        return 1;
      }
      bytes = c->Total();
    }
    const double ms =
        1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        repeats;
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
  std::printf("%s\n",
              json{{"bench", "count"}, {"spec", spec_path}, {"repeats", repeats}, {"rows", rows}}
                  .dump()
                  .c_str());
  return 0;
}
