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
    EXPECT_EQ(m["dp_replicate"].get<int>() * m["dp_shard"].get<int>() * m["cp"].get<int>() *
                  m["tp"].get<int>(),
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

}  // namespace
}  // namespace meshrun
