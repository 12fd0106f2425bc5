// `meshrun plan` through the binary: the JSON shape of the contract, best first, and exit 2 for
// a device it does not know.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

using json = nlohmann::json;

class PlanCommandTest : public testing::MeshrunBinaryTest {
 protected:
  testing::CliResult Run(const std::vector<std::string>& args) {
    return testing::RunCli(binary_, args, temp_ / "stderr.txt", 60);
  }
  std::filesystem::path Source() const { return source_; }
};

TEST_F(PlanCommandTest, ListsEveryMeshOfTheClusterBestFirstAsJson) {
  testing::CliResult r = Run({"plan", "-f", (Source() / "examples/tiny.yaml").string(), "--nodes",
                              "2", "--per-node", "2", "--device", "h100", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rows = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << r.out;
  ASSERT_GT(rows.size(), 20u);
  double previous = 1e300;
  for (const json& row : rows) {
    for (const char* key : {"mesh", "cp_comm_strategy", "activation_checkpointing",
                            "fsdp_reshard_after_forward", "fits", "reason", "peak_memory_bytes",
                            "memory", "step_seconds", "tokens_per_second", "mfu", "comm_seconds"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    const json& m = row["mesh"];
    EXPECT_EQ(m["pp"].get<int>() * m["dp_replicate"].get<int>() * m["dp_shard"].get<int>() *
                  m["cp"].get<int>() * m["tp"].get<int>(),
              4);
    EXPECT_TRUE(row["fits"].get<bool>()) << "tiny fits an h100";
    EXPECT_LE(row["tokens_per_second"].get<double>(), previous);
    previous = row["tokens_per_second"];
  }
}

TEST_F(PlanCommandTest, TheTableExplainsTheBestAndUnknownDevicesExitTwo) {
  testing::CliResult r = Run({"plan", "-f", (Source() / "examples/tiny.yaml").string(),
                              "--per-node", "2", "--device", "a100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DP_REPLICATE DP_SHARD  CP  TP"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Best: dp_replicate"), std::string::npos) << r.out;
  testing::CliResult bad =
      Run({"plan", "-f", (Source() / "examples/tiny.yaml").string(), "--device", "tpu"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--device: 'tpu' is not a known device"), std::string::npos) << bad.err;
}

// The plan's pick, counted on the engine's own step (decision 0074): the same figure as its row,
// on a pipelined pick too (tiny with 8 layers over 8 ranks of a 1 GiB device leaves pp rows).
TEST_F(PlanCommandTest, ThePicksMemoryIsCountedOnTheEnginesOwnStep) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--per-node", "2"},
        std::vector<std::string>{"--per-node", "8", "--set", "model.n_layer=16", "--set",
                                 "model.d_model=256", "--set", "train.global_batch_size=64",
                                 "--memory-gib", "0.05"}}) {
    std::vector<std::string> args = {"plan", "-f", (Source() / "examples/tiny.yaml").string(),
                                     "--device", "a100"};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::CliResult r = Run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.out.find("Counted: the engine's own step for #");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    const size_t bytes = line.find(" GiB ("), of_table = line.find("(the table: ");
    ASSERT_NE(bytes, std::string::npos) << line;
    ASSERT_NE(of_table, std::string::npos) << line;
    const long long counted = std::stoll(line.substr(bytes + 6));
    const long long table = std::stoll(line.substr(of_table + 12));
    EXPECT_GT(counted, 0) << line;
    EXPECT_EQ(counted, table) << line;
    if (extra.size() > 2) {
      EXPECT_NE(line.find("(pp 8,"), std::string::npos) << "a pipelined pick: " << line;
    }
  }
}

TEST_F(PlanCommandTest, CalibrateMeasuresThisHostAndRefusesOtherDevices) {
  testing::CliResult r = Run({"plan", "-f", (Source() / "examples/tiny.yaml").string(),
                              "--per-node", "2", "--calibrate", "--top", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("of cpu (calibrated)"), std::string::npos) << r.out;
  testing::CliResult gpu = Run({"plan", "-f", (Source() / "examples/tiny.yaml").string(),
                                "--calibrate", "--device", "h100"});
  EXPECT_EQ(gpu.exit_code, 2);
  EXPECT_NE(gpu.err.find("error: --calibrate: measures this host's CPU"), std::string::npos)
      << gpu.err;
}

// `train --nproc 2` with parallelism.auto runs the first row of `meshrun plan` on the same
// (calibrated) figures among the rows with the spec's own settings, and says so first.
TEST_F(PlanCommandTest, AutoParallelismTrainsThePlannersFirstChoice) {
  if (!std::filesystem::exists("/usr/share/games/fortunes/cookie")) {
    GTEST_SKIP() << "examples/tiny.yaml's data is missing (apt-get install fortunes)";
  }
  const std::string spec = (Source() / "examples/tiny.yaml").string();
  const std::vector<std::string> sets = {"--set", "parallelism.auto=true", "--set", "train.steps=2",
                                         "--set", "checkpoint.dir=",       "--set", "data.val="};
  std::vector<std::string> args = {"train", "-f", spec, "--nproc", "2", "-o", "json"};
  args.insert(args.end(), sets.begin(), sets.end());
  testing::CliResult r = testing::RunCli(binary_, args, temp_ / "stderr.txt", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("auto: chose "), std::string::npos) << r.err;
  const json line = json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
  ASSERT_TRUE(line.is_object() && line["event"] == "auto") << r.out;
  bool summary = false;
  for (size_t at = 0; at < r.out.size();) {
    const size_t end = r.out.find('\n', at);
    const json j = json::parse(r.out.substr(at, end - at), nullptr, false);
    summary = summary || (j.is_object() && j["event"] == "summary");
    at = end == std::string::npos ? r.out.size() : end + 1;
  }
  EXPECT_TRUE(summary) << r.out;
  const json& d = line["device"];
  std::vector<std::string> plan = {
      "plan",
      "-f",
      spec,
      "--per-node",
      "2",
      "-o",
      "json",
      "--memory-gib",
      json(d["memory_bytes"].get<double>() / (1024.0 * 1024 * 1024)).dump(),
      "--tflops",
      json(d["flops"].get<double>() / 1e12).dump(),
      "--intra-gbps",
      json(d["intra_node_bw"].get<double>() / 1e9).dump(),
      "--intra-latency-us",
      json(d["intra_node_latency"].get<double>() * 1e6).dump(),
      "--latency-ranks",
      json(d["latency_ranks"].get<int>()).dump()};
  plan.insert(plan.end(), sets.begin(), sets.end());
  testing::CliResult p = Run(plan);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  for (const json& row : json::parse(p.out)) {
    const json& m = row["mesh"];
    if (row["activation_checkpointing"] != "none" ||
        (m["cp"] != 1 && row["cp_comm_strategy"] != "allgather") ||
        (m["dp_shard"].get<int>() * m["cp"].get<int>() > 1 &&
         row["fsdp_reshard_after_forward"] != true)) {
      continue;
    }
    EXPECT_EQ(line["chosen"], m) << line.dump() << "\n" << row.dump();
    break;
  }
  // Sizes beside auto: exit 2 naming them.
  std::vector<std::string> both = args;
  both.insert(both.end(), {"--set", "parallelism.dp_shard_size=2"});
  testing::CliResult bad = Run(both);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("error: parallelism.dp_shard_size: dp_shard_size(2) given with "
                         "parallelism.auto: true"),
            std::string::npos)
      << bad.err;
}

}  // namespace
}  // namespace meshrun
