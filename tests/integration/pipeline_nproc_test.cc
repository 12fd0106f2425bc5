// Pipeline parallelism as real processes (decision 0054): `meshrun train --nproc 4` of the tiny
// example under pp 2 × dp_shard 2 (Gloo on loopback) trains the single-rank run's losses and grad
// norms, charges its stage-to-stage traffic to the pp axis, and its checkpoint resumes under one
// rank; zero_bubble under pp 2 × tp 2 (decision 0059) trains the same losses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/integration/tiny_train.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// tiny.yaml's run and what these tests read of it: the grad norms, and the last step line's
// bytes charged to pp (cumulative).
struct PipeRun : testing::TinyTrainRun {
  std::vector<double> grad_norms;
  double pp_bytes = 0;
};

class PipelineNprocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_pipeline_nproc_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }

  PipeRun Train(int nproc, const std::string& ckpt, const std::vector<std::string>& sets) {
    PipeRun r;
    static_cast<testing::TinyTrainRun&>(r) = testing::TrainTiny(temp_, nproc, ckpt, sets);
    for (const json& j : r.steps) {
      r.grad_norms.push_back(j["grad_norm"]);
      r.pp_bytes = 0;
      for (const json& c : j["comm"]) {
        if (c["axis"] == "pp") r.pp_bytes += c["bytes"].get<double>();
      }
    }
    return r;
  }

  fs::path temp_;
};

TEST_F(PipelineNprocTest, TwoStagesTimesFsdpTrainLikeOneRankAndResumeUnderOne) {
  const PipeRun one = Train(1, "one", {});
  ASSERT_EQ(one.cli.exit_code, 0) << one.cli.err;
  ASSERT_EQ(one.losses.size(), 6u) << one.cli.out;
  const PipeRun pp = Train(4, "pp", {"parallelism.pp_size=2", "parallelism.dp_shard_size=2"});
  ASSERT_EQ(pp.cli.exit_code, 0) << pp.cli.err;
  ASSERT_EQ(pp.losses.size(), 6u) << pp.cli.out;
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_NEAR(pp.losses[k], one.losses[k], 1e-5 * one.losses[k]) << "step " << k + 1;
    EXPECT_NEAR(pp.grad_norms[k], one.grad_norms[k], 1e-5 * one.grad_norms[k])
        << "grad norm of step " << k + 1;
  }
  // Activations and their gradients crossed stages, charged to pp (rank 0's step lines: per
  // step 2 micro-batches' activations of 2·64·64 floats sent, the tied embedding's gradient
  // shard exchanged, the grad norm and the loss summed).
  EXPECT_GE(pp.pp_bytes, 6.0 * 2 * (2 * 64 * 64 * 4)) << pp.cli.out;
  EXPECT_EQ(one.pp_bytes, 0.0);
  // The summary's bytes per axis come from the mesh's axis list: pp among them under a
  // pipeline (per rank per step: at least the 2 activations each stage sends), absent without.
  ASSERT_TRUE(pp.summary.is_object()) << pp.cli.out;
  EXPECT_GE(pp.summary["comm_bytes"].value("pp", 0.0), 2.0 * 64 * 64 * 4) << pp.summary.dump();
  EXPECT_GT(pp.summary["comm_bytes"].value("dp_shard", 0.0), 0.0) << pp.summary.dump();
  ASSERT_TRUE(one.summary.is_object()) << one.cli.out;
  EXPECT_FALSE(one.summary["comm_bytes"].contains("pp")) << one.summary.dump();
  // The step-3 pp checkpoint resumed by one rank: steps 4–6 are the single-rank run's.
  fs::remove_all(temp_ / "pp" / "step-00000006");
  const PipeRun resumed = Train(1, "pp", {});
  ASSERT_EQ(resumed.cli.exit_code, 0) << resumed.cli.err;
  EXPECT_NE(resumed.cli.err.find("resumed from"), std::string::npos) << resumed.cli.err;
  ASSERT_EQ(resumed.losses.size(), 3u) << resumed.cli.out;
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(resumed.losses[k], one.losses[3 + k], 1e-5 * one.losses[3 + k]) << "step " << k + 4;
  }
}

TEST_F(PipelineNprocTest, ZeroBubbleTwoStagesTimesTpTrainLikeOneRank) {
  // ZB-H1 (decision 0059): B and W passes as real processes, the tp all-reduces inside B.
  const PipeRun one = Train(1, "one", {});
  ASSERT_EQ(one.cli.exit_code, 0) << one.cli.err;
  ASSERT_EQ(one.losses.size(), 6u) << one.cli.out;
  const PipeRun zb = Train(
      4, "zb",
      {"parallelism.pp_size=2", "parallelism.tp_size=2", "parallelism.pp_schedule=zero_bubble"});
  ASSERT_EQ(zb.cli.exit_code, 0) << zb.cli.err;
  ASSERT_EQ(zb.losses.size(), 6u) << zb.cli.out;
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_NEAR(zb.losses[k], one.losses[k], 1e-5 * one.losses[k]) << "step " << k + 1;
    EXPECT_NEAR(zb.grad_norms[k], one.grad_norms[k], 1e-5 * one.grad_norms[k])
        << "grad norm of step " << k + 1;
  }
  EXPECT_GT(zb.pp_bytes, 0.0) << zb.cli.out;
}

TEST_F(PipelineNprocTest, ValidateShowsThePpCoordinateAndAcceptsZeroBubble) {
  const fs::path binary = fs::path(std::getenv("MESHRUN_BINARY_DIR")) / "bin/meshrun";
  const std::string tiny = (fs::path(std::getenv("MESHRUN_SOURCE_DIR")) / "examples/tiny.yaml");
  // Not the example's own folder: validate reads what a user's runs left there.
  const std::string ckpt = "checkpoint.dir=" + (temp_ / "validate-ckpt").string();
  const testing::CliResult json_out =
      testing::RunCli(binary,
                      {"validate", "-f", tiny, "-o", "json", "--set", "parallelism.pp_size=2",
                       "--set", "parallelism.tp_size=2", "--set", ckpt},
                      temp_ / "validate.stderr", 60);
  ASSERT_EQ(json_out.exit_code, 0) << json_out.err;
  const json report = json::parse(json_out.out);
  EXPECT_EQ(report["mesh"]["pp"], 2);
  EXPECT_EQ(report["mesh"]["world_size"], 4);
  EXPECT_EQ(report["spec"]["parallelism"]["pp_schedule"], "1f1b");
  EXPECT_TRUE(report["spec"]["parallelism"]["pp_layers"].is_null());
  ASSERT_EQ(report["ranks"].size(), 4u);
  EXPECT_EQ(report["ranks"][3]["coords"],
            json::parse(R"({"pp":1,"dp_replicate":0,"dp_shard":0,"cp":0,"tp":1})"));
  const testing::CliResult table = testing::RunCli(
      binary, {"validate", "-f", tiny, "--set", "parallelism.pp_size=2", "--set", ckpt},
      temp_ / "v2.stderr", 60);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("rank  pp  dp_replicate  dp_shard  cp  tp\n"
                           "   0   0             0         0   0   0\n"
                           "   1   1             0         0   0   0\n"),
            std::string::npos)
      << table.out;
  const testing::CliResult zb =
      testing::RunCli(binary,
                      {"validate", "-f", tiny, "--set", "parallelism.pp_size=2", "--set",
                       "parallelism.pp_schedule=zero_bubble", "--set", ckpt},
                      temp_ / "v3.stderr", 60);
  EXPECT_EQ(zb.exit_code, 0) << zb.err;
}

}  // namespace
}  // namespace meshrun
