// The optimizer seam through real `meshrun train` processes (Gloo on loopback): a checkpoint
// written by the code before the seam (tests/integration/fixtures/adamw-checkpoint-v0) resumes
// with the losses of an uninterrupted run; resuming it with another optimizer is refused (exit 2
// naming train.optimizer); a Lion checkpoint saved under one mesh resumes under others with the
// one-rank losses; Lion's predicted memory (engine/train/memory_model.cc) equals the measured one
// on several meshes, with the one-rank losses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/io/checkpoint.h"
#include "engine/train/memory_model.h"
#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct OptimizerRun {
  testing::CliResult cli;
  std::vector<double> losses;
  json summary;
};

struct LionMesh {
  int R = 1, S = 1, C = 1, T = 1;
  std::string cp_strategy = "allgather";
  std::string recompute = "none";
  bool reshard = true;
  int world() const { return R * S * C * T; }
  std::string Name() const {
    return "R" + std::to_string(R) + "S" + std::to_string(S) + "C" + std::to_string(C) + "T" +
           std::to_string(T) + (C > 1 ? "_" + cp_strategy : "") +
           (recompute != "none" ? "_ac_" + recompute : "") + (reshard ? "" : "_keep");
  }
  std::vector<std::string> Overrides() const {
    return {"parallelism.dp_replicate_size=" + std::to_string(R),
            "parallelism.dp_shard_size=" + std::to_string(S),
            "parallelism.cp_size=" + std::to_string(C),
            "parallelism.tp_size=" + std::to_string(T),
            "parallelism.cp_comm_strategy=" + cp_strategy,
            "train.activation_checkpointing=" + recompute,
            std::string("parallelism.fsdp_reshard_after_forward=") + (reshard ? "true" : "false")};
  }
};

class OptimizerCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (temp_ != nullptr) return;
    char pattern[] = "/tmp/meshrun_optimizer_ckpt_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = new fs::path(pattern);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*temp_, ec);
    });
  }

  static fs::path Bin() { return fs::path(std::getenv("MESHRUN_BINARY_DIR")) / "bin/meshrun"; }
  static fs::path Src() { return fs::path(std::getenv("MESHRUN_SOURCE_DIR")); }
  static fs::path Fixture() { return Src() / "tests/integration/fixtures/adamw-checkpoint-v0"; }

  // `meshrun train -f spec` with `sets` (KEY=VALUE) on mesh's ranks, checkpoints in `ckpt`.
  static OptimizerRun Run(const fs::path& spec, const LionMesh& mesh, const std::string& ckpt,
                          std::vector<std::string> sets, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "train", "-f", spec.string(), "--nproc", std::to_string(mesh.world()), "-o", "json"};
    sets.push_back("checkpoint.dir=" + (*temp_ / ckpt).string());
    for (const std::string& s : mesh.Overrides()) sets.push_back(s);
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    args.insert(args.end(), extra.begin(), extra.end());
    OptimizerRun r;
    r.cli = testing::RunCli(Bin(), args, *temp_ / (ckpt + ".stderr"), 120);
    for (const std::string& line : testing::Lines(r.cli.out)) {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      if (j["event"] == "step") r.losses.push_back(j["loss"]);
      if (j["event"] == "summary") r.summary = j;
    }
    return r;
  }

  // tiny.yaml, 6 steps, a checkpoint every 3, with Lion.
  static std::vector<std::string> LionSets() {
    return {"train.steps=6", "checkpoint.every=3", "train.optimizer=lion", "train.lr=3e-4",
            "train.weight_decay=0.5"};
  }
  static fs::path Tiny() { return Src() / "examples/tiny.yaml"; }

  static const OptimizerRun& LionOneRank() {
    static OptimizerRun* base = new OptimizerRun(Run(Tiny(), {}, "lion-one-rank", LionSets()));
    return *base;
  }

  // The fixture's step-3 checkpoint copied into a fresh checkpoint.dir.
  static std::string CopyOfFixture(const std::string& name) {
    fs::create_directories(*temp_ / name);
    fs::copy(Fixture() / "step-00000003", *temp_ / name / "step-00000003",
             fs::copy_options::recursive);
    return name;
  }

  static fs::path* temp_;
};

fs::path* OptimizerCheckpointTest::temp_ = nullptr;

// The fixture was written by `meshrun train -f spec.yaml --nproc 2 --stop-after 3` of the code
// before the optimizer seam (dp_shard 2: two shard files); losses.json holds the six losses of
// that code's uninterrupted run. Resumed on one rank and on the two ranks that wrote it.
TEST_F(OptimizerCheckpointTest, AdamWCheckpointOfTheCodeBeforeTheSeamResumesWithItsLosses) {
  const json want = json::parse(testing::ReadFile(Fixture() / "losses.json"));
  ASSERT_EQ(want["losses"].size(), 6u);
  StatusOr<CheckpointReader> old = CheckpointReader::Open((Fixture() / "step-00000003").string());
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(json::parse(old->metadata().trainer_json).count("optimizer"), 0u)
      << "the fixture must predate the optimizer record";
  for (const LionMesh& mesh : {LionMesh{}, LionMesh{1, 2, 1, 1}}) {
    SCOPED_TRACE(mesh.Name());
    const std::string dir = CopyOfFixture("adamw-v0-" + mesh.Name());
    const OptimizerRun r = Run(Fixture() / "spec.yaml", mesh, dir, {});
    ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
    EXPECT_NE(r.cli.err.find("resumed from"), std::string::npos) << r.cli.err;
    ASSERT_EQ(r.losses.size(), 3u) << r.cli.out;
    for (size_t k = 0; k < 3; ++k) {
      const double loss = want["losses"][3 + k];
      EXPECT_NEAR(r.losses[k], loss, 1e-5 * loss) << "step " << k + 4;
    }
    // Its next checkpoint names the optimizer and keeps AdamW's two states.
    StatusOr<CheckpointReader> next =
        CheckpointReader::Open((*temp_ / dir / "step-00000006").string());
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(json::parse(next->metadata().trainer_json)["optimizer"], "adamw");
    EXPECT_TRUE(next->HasTensor("optim/exp_avg/wte"));
    EXPECT_TRUE(next->HasTensor("optim/exp_avg_sq/wte"));
  }
}

TEST_F(OptimizerCheckpointTest, ResumingAnAdamWCheckpointWithLionIsRefused) {
  const std::string dir = CopyOfFixture("adamw-v0-as-lion");
  const OptimizerRun r = Run(Fixture() / "spec.yaml", {}, dir, {"train.optimizer=lion"});
  EXPECT_EQ(r.cli.exit_code, 2) << r.cli.out << r.cli.err;
  EXPECT_NE(r.cli.err.find("train.optimizer: the checkpoint"), std::string::npos) << r.cli.err;
  EXPECT_NE(r.cli.err.find("'adamw'"), std::string::npos) << r.cli.err;
  EXPECT_NE(r.cli.err.find("'lion'"), std::string::npos) << r.cli.err;
  EXPECT_NE(r.cli.err.find("hint:"), std::string::npos) << r.cli.err;
  EXPECT_TRUE(r.losses.empty());
  EXPECT_FALSE(fs::exists(*temp_ / dir / "step-00000006"));
}

TEST_F(OptimizerCheckpointTest, LionCheckpointFromOneMeshResumesUnderOthers) {
  const OptimizerRun& base = LionOneRank();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  ASSERT_EQ(base.losses.size(), 6u);
  const OptimizerRun first =
      Run(Tiny(), LionMesh{1, 2, 1, 2}, "lion-source", LionSets(), {"--stop-after", "3"});
  ASSERT_EQ(first.cli.exit_code, 0) << first.cli.err;
  const fs::path step = *temp_ / "lion-source/step-00000003";
  StatusOr<CheckpointReader> saved = CheckpointReader::Open(step.string());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(json::parse(saved->metadata().trainer_json)["optimizer"], "lion");
  EXPECT_TRUE(saved->HasTensor("optim/exp_avg/h.0.attn.c_attn.weight"));
  EXPECT_FALSE(saved->HasTensor("optim/exp_avg_sq/h.0.attn.c_attn.weight"));
  for (const LionMesh& target : {LionMesh{2, 1, 2, 1}, LionMesh{}}) {
    SCOPED_TRACE(target.Name());
    const std::string dir = "lion-source-" + target.Name();
    fs::copy(*temp_ / "lion-source", *temp_ / dir, fs::copy_options::recursive);
    const OptimizerRun r = Run(Tiny(), target, dir, LionSets());
    ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
    EXPECT_NE(r.cli.err.find("resumed from"), std::string::npos) << r.cli.err;
    ASSERT_EQ(r.losses.size(), 3u) << r.cli.out;
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(r.losses[k], base.losses[3 + k], 1e-4 * base.losses[3 + k]) << "step " << k + 4;
    }
  }
}

class LionMemoryTest : public OptimizerCheckpointTest,
                       public ::testing::WithParamInterface<LionMesh> {};

TEST_P(LionMemoryTest, LossesAndPredictedMemoryMatch) {
  const OptimizerRun& base = LionOneRank();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  const LionMesh& mesh = GetParam();
  const OptimizerRun r = Run(Tiny(), mesh, "lion-memory-" + mesh.Name(), LionSets());
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
  ASSERT_EQ(r.losses.size(), 6u) << r.cli.out;
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_NEAR(r.losses[k], base.losses[k], 1e-4 * base.losses[k]) << "step " << k + 1;
  }
  std::vector<std::string> overrides = LionSets();
  for (const std::string& s : mesh.Overrides()) overrides.push_back(s);
  StatusOr<JobSpec> spec = ParseJobSpecYaml(testing::ReadFile(Tiny()), overrides);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const MemoryPrediction want = PredictRankMemory(*spec);
  const char* kinds[] = {"parameters", "gradients", "optimizer", "activations", "communication"};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(r.summary["memory"][kinds[k]].get<double>(), static_cast<double>(want.bytes[k]))
        << kinds[k];
  }
}

INSTANTIATE_TEST_SUITE_P(LionPlans, LionMemoryTest,
                         ::testing::Values(LionMesh{}, LionMesh{1, 2, 1, 2},
                                           LionMesh{1, 2, 2, 1, "ring", "selective"},
                                           LionMesh{2, 1, 1, 2, "allgather", "full"},
                                           LionMesh{1, 2, 1, 1, "allgather", "none", false}),
                         [](const ::testing::TestParamInfo<LionMesh>& info) {
                           return info.param.Name();
                         });

}  // namespace
}  // namespace meshrun
