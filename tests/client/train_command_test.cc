// `meshrun train|eval|export` as real processes on the tiny example: the JSON lines of
// docs/cli.md and a falling loss; resume equals an uninterrupted run bit for bit; a
// truncated or missing shard is never loaded; an exported model scores in the PyTorch
// reference exactly as `meshrun eval` does.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CliResult;
using testing::Lines;
using testing::RunCli;

class TrainCommandTest : public meshrun::testing::MeshrunBinaryTest {
 protected:
  CliResult Run(const std::vector<std::string>& args) {
    return RunCli(binary_, args, temp_ / "stderr.txt", 120);
  }

  // `meshrun train` on the tiny example, 10 steps, checkpoints every 5 under `ckpt`.
  CliResult Train(const std::string& ckpt, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"train",
                                     "-f",
                                     (source_ / "examples/tiny.yaml").string(),
                                     "--nproc",
                                     "1",
                                     "-o",
                                     "json",
                                     "--set",
                                     "train.steps=10",
                                     "--set",
                                     "checkpoint.every=5",
                                     "--set",
                                     "checkpoint.keep=3",
                                     "--set",
                                     "checkpoint.dir=" + (temp_ / ckpt).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(args);
  }

  // The step lines' losses as printed (text, so equality is bit-for-bit) and the summary.
  static std::vector<std::string> StepLosses(const std::string& out, json* summary) {
    std::vector<std::string> losses;
    for (const std::string& line : Lines(out)) {
      json j = json::parse(line);
      if (j["event"] == "step") losses.push_back(j["loss"].dump());
      if (j["event"] == "summary" && summary != nullptr) *summary = j;
    }
    return losses;
  }
};

// resources.device: cuda on a machine whose CUDA runtime sees no GPU (CI, this machine) is an
// input error before any rank starts, naming the field and the runtime's reason; a build
// without the CUDA toolkit says so instead.
TEST_F(TrainCommandTest, CudaWithoutAVisibleGpuIsAnErrorNamingTheDevice) {
  const CliResult version = Run({"--version"});
  const bool cuda_build = version.out.find("cuda=ON") != std::string::npos;
  const CliResult r = Train("cuda", {"--set", "resources.device=cuda"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  if (cuda_build) {
    if (r.err.find("CUDA device(s) are visible") != std::string::npos) {
      GTEST_SKIP() << "this machine has a GPU: " << r.err;
    }
    EXPECT_EQ(
        r.err.rfind("error: resources.device: no CUDA device is visible (cudaGetDeviceCount: ", 0),
        0u)
        << r.err;
    EXPECT_NE(r.err.find("(hint: "), std::string::npos) << r.err;
  } else {
    EXPECT_NE(r.err.find("error: resources.device: cuda needs an engine built with the CUDA"),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(r.out, "");  // -o json: nothing on stdout but JSON, and no run
}

// train.precision bf16 on cpu is refused up front instead of running in float32 in silence.
TEST_F(TrainCommandTest, Bf16OnCpuIsRefused) {
  const CliResult r = Train("bf16", {"--set", "train.precision=bf16"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("error: train.precision: 'bf16' needs resources.device: cuda"),
            std::string::npos)
      << r.err;
}

TEST_F(TrainCommandTest, JsonLinesFollowTheContractAndTheLossFalls) {
  CliResult r = Train("run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 11u) << r.out;  // 10 steps + the summary; nothing else on stdout
  for (int k = 1; k <= 10; ++k) {
    json j = json::parse(lines[k - 1]);
    EXPECT_EQ(j["event"], "step");
    EXPECT_EQ(j["step"], k);
    for (const char* key : {"loss", "lr", "step_seconds", "tokens_per_second", "tflops", "mfu",
                            "peak_memory_bytes"}) {
      ASSERT_TRUE(j.contains(key)) << key;
      EXPECT_GT(j[key].get<double>(), 0.0) << key;
    }
  }
  // Step 1's update uses lr at k = 0: lr·1/warmup_steps (1e-3 / 2).
  EXPECT_DOUBLE_EQ(json::parse(lines[0])["lr"].get<double>(), 5e-4);
  json s = json::parse(lines[10]);
  EXPECT_EQ(s["event"], "summary");
  EXPECT_EQ(s["steps"], 10);
  ASSERT_EQ(s["losses"].size(), 10u);
  for (const char* axis : {"tp", "cp", "dp_shard", "dp_replicate"}) {
    EXPECT_EQ(s["comm_bytes"][axis].get<double>(), 0.0) << axis;  // one rank: no traffic
  }
  const double first = s["losses"][0], last = s["final_loss"];
  EXPECT_LT(last, first - 0.5) << "the loss must fall";
  EXPECT_TRUE(fs::exists(temp_ / "run/step-00000005/metadata.json"));
  EXPECT_TRUE(fs::exists(temp_ / "run/step-00000010/metadata.json"));
}

TEST_F(TrainCommandTest, ResumeEqualsAnUninterruptedRunBitForBit) {
  CliResult full = Train("full");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::vector<std::string> want = StepLosses(full.out, nullptr);
  ASSERT_EQ(want.size(), 10u);

  CliResult first = Train("split", {"--stop-after", "5"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::vector<std::string> got = StepLosses(first.out, nullptr);
  ASSERT_EQ(got.size(), 5u);
  CliResult second = Train("split");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("resumed from"), std::string::npos) << second.err;
  for (const std::string& l : StepLosses(second.out, nullptr)) got.push_back(l);
  EXPECT_EQ(got, want);
  // The final parameters and optimizer state are identical too.
  EXPECT_EQ(testing::ReadFile(temp_ / "split/step-00000010/rank-00000.safetensors"),
            testing::ReadFile(temp_ / "full/step-00000010/rank-00000.safetensors"));
}

TEST_F(TrainCommandTest, TruncatedOrMissingShardFallsBackToThePreviousCheckpoint) {
  ASSERT_EQ(Train("ckpt").exit_code, 0);
  const fs::path newest = temp_ / "ckpt/step-00000010/rank-00000.safetensors";
  for (const char* damage : {"truncate", "delete"}) {
    SCOPED_TRACE(damage);
    ASSERT_EQ(Train("ckpt").exit_code, 0);  // nothing left to do: all 10 steps are done
    if (std::string(damage) == "truncate") {
      fs::resize_file(newest, fs::file_size(newest) / 2);
    } else {
      fs::remove(newest);
    }
    CliResult r = Train("ckpt");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("step-00000010 is incomplete"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("falling back to step-00000005"), std::string::npos) << r.err;
    json j = json::parse(Lines(r.out).front());
    EXPECT_EQ(j["step"], 6) << "resumed from step 5";
  }
}

TEST_F(TrainCommandTest, ExportedModelScoresLikeMeshrunEval) {
  ASSERT_EQ(Train("ckpt").exit_code, 0);
  const std::string tokens = "/usr/share/games/fortunes/wisdom";
  CliResult eval = Run({"eval", "-f", (source_ / "examples/tiny.yaml").string(), "--checkpoint",
                        (temp_ / "ckpt").string(), "--tokens", tokens, "-o", "json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const json e = json::parse(eval.out);
  EXPECT_GT(e["tokens"].get<int64_t>(), 10000);
  CliResult exp = Run({"export", (temp_ / "ckpt").string(), "-o", (temp_ / "hf").string()});
  ASSERT_EQ(exp.exit_code, 0) << exp.err;
  ASSERT_TRUE(fs::exists(temp_ / "hf/model.safetensors"));
  ASSERT_TRUE(fs::exists(temp_ / "hf/config.json"));
  std::string why;
  const fs::path python = testing::ModelVenvPython(source_, &why);
  if (python.empty()) GTEST_SKIP() << why;
  CliResult score = RunCli(python,
                           {(source_ / "tests/reference/gpt2_reference.py").string(), "score",
                            "--model", (temp_ / "hf").string(), "--tokens", tokens},
                           temp_ / "score.err", 300);
  ASSERT_EQ(score.exit_code, 0) << score.err;
  const json s = json::parse(Lines(score.out).back());
  EXPECT_EQ(s["tokens"], e["tokens"]);
  EXPECT_NEAR(s["loss"].get<double>(), e["loss"].get<double>(), 1e-6 * e["loss"].get<double>());
}

TEST_F(TrainCommandTest, InitFromAnExportedModelStartsFromItsWeights) {
  ASSERT_EQ(Train("ckpt").exit_code, 0);
  ASSERT_EQ(Run({"export", (temp_ / "ckpt").string(), "-o", (temp_ / "hf").string()}).exit_code, 0);
  const std::string tiny = (source_ / "examples/tiny.yaml").string();
  auto eval = [&](const std::string& ckpt) {
    CliResult r = Run({"eval", "-f", tiny, "--checkpoint", (temp_ / ckpt).string(), "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out)["loss"].get<double>();
  };
  // One step with lr 0 leaves the loaded weights unchanged, so both checkpoints score alike.
  CliResult r =
      Run({"train", "-f", tiny, "--nproc", "1", "-o", "json", "--set",
           "model.init_from=" + (temp_ / "hf").string(), "--set", "train.steps=1", "--set",
           "train.lr=0", "--set", "train.min_lr=0", "--set", "train.warmup_steps=0", "--set",
           "checkpoint.dir=" + (temp_ / "from_hf").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_DOUBLE_EQ(eval("from_hf"), eval("ckpt"));
  // A spec that contradicts config.json is invalid input naming the field.
  CliResult bad = Run({"train", "-f", tiny, "--nproc", "1", "--set",
                       "model.init_from=" + (temp_ / "hf").string(), "--set", "model.n_layer=3",
                       "--set", "checkpoint.dir="});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("error: model.n_layer"), std::string::npos) << bad.err;
}

TEST_F(TrainCommandTest, EvalReadsTheSpecFromTheCheckpointAndExportTakesAFolder) {
  ASSERT_EQ(Train("ckpt").exit_code, 0);
  const std::string tiny = (source_ / "examples/tiny.yaml").string();
  CliResult with_spec =
      Run({"eval", "-f", tiny, "--checkpoint", (temp_ / "ckpt").string(), "-o", "json"});
  ASSERT_EQ(with_spec.exit_code, 0) << with_spec.err;
  // `eval CKPT`: the spec (and so data.val) is the one the checkpoint was trained with.
  CliResult from_ckpt = Run({"eval", (temp_ / "ckpt").string(), "-o", "json"});
  ASSERT_EQ(from_ckpt.exit_code, 0) << from_ckpt.err;
  EXPECT_EQ(json::parse(from_ckpt.out)["loss"], json::parse(with_spec.out)["loss"]);
  // A checkpoint of a 2-rank mesh is evaluated on this one process (loading reshards).
  CliResult two = Run({"train", "-f", tiny, "--nproc", "2", "-o", "json", "--set",
                       "parallelism.dp_shard_size=2", "--set", "train.steps=2", "--set",
                       "checkpoint.dir=" + (temp_ / "two").string()});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  CliResult eval_two = Run({"eval", (temp_ / "two").string(), "-o", "json"});
  EXPECT_EQ(eval_two.exit_code, 0) << eval_two.err;
  CliResult none = Run({"eval", "-o", "json"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("error: CKPT: no checkpoint to evaluate"), std::string::npos) << none.err;
  // -o is the output format everywhere else: `export CKPT -o json` makes no folder named json.
  CliResult exp = Run({"export", (temp_ / "ckpt").string(), "-o", "json"});
  EXPECT_EQ(exp.exit_code, 2) << exp.err;
  EXPECT_NE(exp.err.find("error: --output-dir: 'json' looks like an output format"),
            std::string::npos)
      << exp.err;
  EXPECT_FALSE(fs::exists("json"));
  CliResult named =
      Run({"export", (temp_ / "ckpt").string(), "--output-dir", (temp_ / "hf").string()});
  EXPECT_EQ(named.exit_code, 0) << named.err;
  EXPECT_TRUE(fs::exists(temp_ / "hf/model.safetensors"));
}

// On a terminal (a pseudo-terminal from util-linux `script`, and a TERM that can redraw: the
// test sets it, as an empty environment has none), text output is the progress bar of
// `submit --follow`, redrawn in place, and then the summary line.
TEST_F(TrainCommandTest, OnATerminalTrainDrawsTheProgressBarOfSubmit) {
  const std::string command = "TERM=xterm " + testing::ShellQuote(binary_.string()) + " train -f " +
                              testing::ShellQuote((source_ / "examples/tiny.yaml").string()) +
                              " --set checkpoint.dir= --set train.steps=3";
  const CliResult r = RunCli("script", {"-qec", command, "/dev/null"}, temp_ / "err.txt", 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\r\x1b[K["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("] 3/3  loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tok/s  MFU "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/3"), std::string::npos) << "no per-step lines: " << r.out;
  EXPECT_NE(r.out.find("done: 3/3 steps, final loss "), std::string::npos) << r.out;
}

TEST_F(TrainCommandTest, WorldSizeMismatchIsInvalidInput) {
  CliResult mismatch =
      Run({"train", "-f", (source_ / "examples/tiny.yaml").string(), "--nproc", "2"});
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.err;
  EXPECT_EQ(mismatch.err.rfind("error: ", 0), 0u) << mismatch.err;
}

}  // namespace
}  // namespace meshrun
