// A pipeline stage's memory as real processes (decision 0061): `meshrun train --nproc 4` of the
// tiny example under pp 2 × dp_shard 2 and pp 2 × tp 2 (Gloo on loopback), each rank measuring
// its own process; the summary's peak of each kind (the largest rank's) is the memory model's
// prediction for the pipeline (each kind's largest over the stages), byte for byte, as
// parallel_test holds the meshes without pp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/train/memory_model.h"
#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class PipelineMemoryNprocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_pipeline_memory_nproc_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }

  // Trains tiny.yaml with `sets` as 4 processes; checks the summary's memory against the model.
  void ExpectMeasuredAsPredicted(const std::string& name, const std::vector<std::string>& sets) {
    const fs::path binary = fs::path(std::getenv("MESHRUN_BINARY_DIR")) / "bin/meshrun";
    const fs::path tiny = fs::path(std::getenv("MESHRUN_SOURCE_DIR")) / "examples/tiny.yaml";
    std::vector<std::string> args = {"train", "-f", tiny.string(), "--nproc", "4", "-o", "json"};
    std::vector<std::string> overrides = {"train.steps=2",
                                          "checkpoint.dir=" + (temp_ / name).string()};
    for (const std::string& s : sets) overrides.push_back(s);
    for (const std::string& s : overrides) {
      args.push_back("--set");
      args.push_back(s);
    }
    const testing::CliResult r = testing::RunCli(binary, args, temp_ / (name + ".stderr"), 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json summary;
    for (const std::string& line : testing::Lines(r.out)) {
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j["event"] == "summary") summary = j;
    }
    ASSERT_TRUE(summary.contains("memory")) << r.out;
    StatusOr<JobSpec> spec = ParseJobSpecYaml(testing::ReadFile(tiny), overrides);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const MemoryPrediction want = PredictRankMemory(*spec);
    const char* kinds[] = {"parameters", "gradients", "optimizer", "activations", "communication"};
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(summary["memory"][kinds[k]].get<double>(), static_cast<double>(want.bytes[k]))
          << kinds[k];
    }
    // The stages differ (the first holds the tables, the last the head): the largest of each
    // kind is not one stage's figure for every kind here.
    const std::vector<MemoryPrediction> stages = PredictStagesMemory(*spec);
    ASSERT_EQ(stages.size(), 2u);
    EXPECT_NE(stages[0].of(MemoryKind::kActivations), stages[1].of(MemoryKind::kActivations));
  }

  fs::path temp_;
};

TEST_F(PipelineMemoryNprocTest, TwoStagesTimesFsdpPeakAsPredicted) {
  ExpectMeasuredAsPredicted("fsdp", {"parallelism.pp_size=2", "parallelism.dp_shard_size=2"});
}

TEST_F(PipelineMemoryNprocTest, TwoStagesTimesTpPeakAsPredicted) {
  ExpectMeasuredAsPredicted("tp", {"parallelism.pp_size=2", "parallelism.tp_size=2"});
}

}  // namespace
}  // namespace meshrun
