// A new user's cluster, through the real binaries (`meshrun up` and the client): a job no
// registered capacity can hold is refused at submit with the numbers (exit 1) unless
// --wait-for-capacity queues it; --dry-run answers where a job would run and creates nothing;
// `status` shows the loss history; `logs` and the history survive a coordinator restart.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/integration/daemons.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

using testing::kCorpus;

class FirstDayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(testing::BinDir() / bin)) GTEST_SKIP() << bin << " is not built";
    }
    if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing (apt-get install fortunes)";
    char pattern[] = "/tmp/meshrun_first_day_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    address_ = "127.0.0.1:" + std::to_string(port_);
    spec_ = (dir_ / "job.yaml").string();
    std::ofstream(spec_) << "name: first\ndata: {train: " << kCorpus
                         << ", format: text}\ntrain: {steps: 4}\n";
  }
  void TearDown() override {
    testing::Stop(up_);
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // `meshrun up` with one worker of 2 slots on port_, its state in dir_/state; waits for READY.
  void StartCluster() {
    up_ = testing::Spawn(
        "up",
        {(testing::BinDir() / "meshrun").string(), "up", "--workers", "1", "--slots", "2", "--port",
         std::to_string(port_), "--state-dir", (dir_ / "state").string()},
        dir_ / "up.log");
    for (int i = 0; i < 300; ++i) {
      testing::CliResult r = Cli({"workers", "-o", "json"}, 5);
      if (r.exit_code == 0) {
        const json workers = json::parse(r.out, nullptr, false);
        if (workers.is_array() && workers.size() == 1 && workers[0]["state"] == "READY") return;
      }
      std::this_thread::sleep_for(100ms);
    }
    FAIL() << "the cluster did not become READY: " << testing::ReadFile(dir_ / "up.log");
  }

  testing::CliResult Cli(std::vector<std::string> args, int timeout_s = 60) {
    args.push_back("--coordinator");
    args.push_back(address_);
    return testing::RunCli(testing::BinDir() / "meshrun", args, dir_ / "cli.err", timeout_s);
  }

  int port_ = testing::FreePort();
  fs::path dir_;
  std::string address_, spec_;
  testing::Daemon up_;
};

TEST_F(FirstDayTest, CapacityDryRunLossHistoryAndLogsAcrossARestart) {
  StartCluster();
  // 4 ranks on 2 slots: refused at submit, with the numbers, and nothing created.
  testing::CliResult r = Cli({"submit", "-f", spec_, "--set", "parallelism.dp_shard_size=4"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: parallelism: dp_replicate=1 dp_shard=4 cp=1 tp=1 (world size 4) "
                        "needs 4 slots but the 1 registered cpu worker holds 2 slots in all",
                        0),
            0u)
      << r.err;
  EXPECT_NE(r.err.find("--wait-for-capacity"), std::string::npos) << r.err;
  // A dry run: validated, placed, not created.
  r = Cli(
      {"submit", "-f", spec_, "--set", "parallelism.dp_shard_size=2", "--dry-run", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json dry = json::parse(r.out);
  EXPECT_EQ(dry["placement"], "would start now: ranks 0-1 on worker-1") << r.out;
  EXPECT_EQ(dry["mesh"]["world_size"], 2);
  EXPECT_EQ(dry["spec"]["name"], "first");
  EXPECT_EQ(json::parse(Cli({"jobs", "-o", "json"}).out).size(), 0u);
  // --wait-for-capacity queues it anyway, PENDING with what it waits for.
  r = Cli({"submit", "-f", spec_, "--set", "parallelism.dp_shard_size=4", "--wait-for-capacity",
           "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string waiting = json::parse(r.out)["job_id"];
  const json pending = json::parse(Cli({"status", waiting, "-o", "json"}).out);
  EXPECT_EQ(pending["state"], "PENDING");
  EXPECT_NE(pending["message"].get<std::string>().find("needs 4 slots"), std::string::npos)
      << pending.dump();
  EXPECT_EQ(Cli({"cancel", waiting}).exit_code, 0);

  // A job that runs: its loss per step in `status`.
  r = Cli({"submit", "-f", spec_, "--follow"}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string job = testing::Lines(r.out).front();
  EXPECT_NE(r.out.find("SUCCEEDED after 4/4 steps, final loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tok/s, MFU "), std::string::npos) << r.out;
  {
    // Standalone `train` of the same spec (piped, as here) prints the step lines and the totals
    // of `submit --follow` in the same words: the same losses, learning rates and norms; only the
    // measured rates differ.
    const testing::CliResult standalone = testing::RunCli(
        testing::BinDir() / "meshrun", {"train", "-f", spec_}, dir_ / "train.err", 180);
    ASSERT_EQ(standalone.exit_code, 0) << standalone.out << standalone.err;
    const std::regex step_line(
        R"(^(step (\d)/4  loss [0-9.]+  lr [0-9.e+-]+  norm [0-9.]+)  [0-9,]+ tok/s  MFU [0-9.]+%)");
    const std::regex totals(R"((4/4 steps, final loss [0-9.]+), [0-9,]+ tok/s, MFU [0-9.]+%)");
    std::map<std::string, std::string> train_steps, submit_steps;
    for (const std::string& line : testing::Lines(standalone.out)) {
      std::smatch m;
      if (std::regex_search(line, m, step_line)) train_steps[m[2]] = m[1];
    }
    for (const std::string& line : testing::Lines(r.out)) {
      std::smatch m;
      if (std::regex_search(line, m, step_line)) submit_steps[m[2]] = m[1];
    }
    EXPECT_EQ(train_steps.size(), 4u) << standalone.out;
    ASSERT_FALSE(submit_steps.empty()) << r.out;
    for (const auto& [step, text] : submit_steps) EXPECT_EQ(train_steps[step], text) << step;
    std::smatch a, b;
    ASSERT_TRUE(std::regex_search(standalone.out, a, totals)) << standalone.out;
    ASSERT_TRUE(std::regex_search(r.out, b, totals)) << r.out;
    EXPECT_NE(standalone.out.find("\ndone: " + a[1].str()), std::string::npos) << standalone.out;
    EXPECT_EQ(a[1].str(), b[1].str());
  }
  json status = json::parse(Cli({"status", job, "-o", "json"}).out);
  ASSERT_EQ(status["loss_history"].size(), 4u) << status.dump();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(status["loss_history"][i]["step"], i + 1);
  EXPECT_DOUBLE_EQ(status["loss_history"][3]["loss"].get<double>(), status["loss"].get<double>());
  EXPECT_NE(Cli({"status", job}).out.find("loss history:"), std::string::npos);
  const std::string logs_before = Cli({"logs", job}).out;
  ASSERT_NE(logs_before.find("[rank 0] "), std::string::npos) << logs_before;
  // `logs --follow` shows the training progress beside the ranks' lines.
  const std::string followed = Cli({"logs", job, "--follow"}).out;
  EXPECT_NE(followed.find("[job] step 1/4  loss "), std::string::npos) << followed;
  EXPECT_NE(followed.find("[job] step 4/4  loss "), std::string::npos) << followed;

  // The coordinator restarts on the same state: logs and loss history are still there.
  testing::Stop(up_);
  StartCluster();
  EXPECT_EQ(Cli({"logs", job}).out, logs_before);
  status = json::parse(Cli({"status", job, "-o", "json"}).out);
  EXPECT_EQ(status["loss_history"].size(), 4u) << status.dump();
}

// `meshrun demo`: the rank table in the mesh order, and the summary's tokens/s defined as the
// run's tokens over its step time, which the progress lines' per-step rates reproduce.
TEST_F(FirstDayTest, DemoTableInMeshOrderAndOneDefinitionOfTokensPerSecond) {
  const testing::CliResult r =
      testing::RunCli(testing::BinDir() / "meshrun",
                      {"demo", "--set", "train.steps=3", "--set", "train.warmup_steps=1", "--dir",
                       (dir_ / "demo").string()},
                      dir_ / "demo.err", 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << testing::ReadFile(dir_ / "demo.err");
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(R"(RANK +WORKER +DP_REPLICATE +DP_SHARD +CP +TP +STATE\n)")))
      << r.out;
  // Each step's tokens are the same, so the run's rate is the harmonic mean of the step rates.
  const std::regex step_line(
      R"(step \d+/3 +loss [0-9.]+ +lr [0-9.e+-]+ +norm [0-9.]+ +([0-9,]+) tok/s)");
  double inverse_sum = 0;
  int steps = 0;
  for (const std::string& line : testing::Lines(r.out)) {
    std::smatch m;
    if (!std::regex_search(line, m, step_line)) continue;
    std::string digits = m[1].str();
    std::erase(digits, ',');
    inverse_sum += 1.0 / std::stod(digits);
    ++steps;
  }
  ASSERT_EQ(steps, 3) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m, std::regex(R"(throughput +(\d+) tokens/s, MFU [0-9.]+% \(over all steps)")))
      << r.out;
  EXPECT_NEAR(std::stod(m[1].str()), steps / inverse_sum, 0.01 * steps / inverse_sum) << r.out;
}

}  // namespace
}  // namespace meshrun
