// Hugging Face models through the product, against an independent reference built on
// transformers and torch.optim.AdamW (tests/reference/hf_reference.py, in the model venv that
// tests/python/make-venv makes from tests/python/requirements-models.txt):
//  - a tiny Llama saved by transformers (grouped-query attention, rope_theta 5e5 with llama3
//    scaling, untied head): `meshrun train` from `init_from` gives the reference's per-step
//    losses on one rank and on tp 2, cp 2 (ring), dp_shard 2 and dp_shard 2 × cp 2 × tp 2;
//  - a tiny GPT-2 in both name layouts (GPT2LMHeadModel's transformer.* and the bare model's
//    unprefixed names of the published checkpoint) loads under tp 1 and tp 2 with the
//    reference's first-step loss;
//  - `meshrun export` of both is read by transformers with the loss `meshrun eval` reports, and
//    `meshrun generate` continues a prompt greedily with transformers' generate's tokens.
// Skips, saying why, only when the venv cannot be made (no python3-venv, PyPI unreachable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path SourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::current_path();
}

fs::path BuildDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path("build");
}

class HfModelsTest : public ::testing::Test {
 protected:
  // The venv and the reference folders are made once for the suite.
  static void SetUpTestSuite() {
    python_ = testing::ModelVenvPython(SourceDir(), &error_);
    if (python_.empty()) return;
    char pattern[] = "/tmp/meshrun_hf_models_XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = pattern;
    testing::CliResult r = testing::RunCli(python_, {Reference(), "prepare", dir_.string()},
                                           dir_ / "prepare.err", 600);
    if (r.exit_code != 0) {
      error_ = "hf_reference.py prepare failed: " + r.err;  // a failure, not a skip (below)
      return;
    }
    reference_ = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  static void TearDownTestSuite() {
    if (!dir_.empty() && !kept_) fs::remove_all(dir_);
  }

  static std::string Reference() {
    return (SourceDir() / "tests" / "reference" / "hf_reference.py").string();
  }

  void SetUp() override {
    if (python_.empty()) GTEST_SKIP() << error_;
    ASSERT_TRUE(error_.empty()) << error_;
    ASSERT_TRUE(reference_.is_object()) << "the reference printed no JSON";
    meshrun_ = BuildDir() / "bin" / "meshrun";
    ASSERT_TRUE(fs::exists(meshrun_)) << meshrun_;
  }

  void TearDown() override {
    if (HasFailure()) {
      kept_ = true;
      std::cerr << "files kept in " << dir_ << std::endl;
    }
  }

  // The spec of these runs: the reference's schedule (lr 3e-3, warmup 2, 4 steps, batch 8 of
  // 32 tokens), sequential windows of data.bin.
  fs::path WriteSpec(const std::string& name, const std::string& model_dir, int steps) {
    const fs::path spec = dir_ / (name + ".yaml");
    std::ofstream out(spec);
    out << "name: " << name << "\n"
        << "model: {init_from: " << (dir_ / model_dir).string() << ", seq_len: 32}\n"
        << "train: {steps: " << steps << ", global_batch_size: 8, micro_batch_size: 1, "
        << "lr: 3.0e-3, min_lr: 3.0e-5, warmup_steps: 2}\n"
        << "data: {train: " << (dir_ / "data.bin").string() << "}\n"
        << "checkpoint: {dir: " << (dir_ / ("ckpt-" + name)).string() << ", resume: never}\n";
    return spec;
  }

  // `meshrun train -o json` losses, with --set overrides; empty on failure (reported).
  std::vector<double> Train(const fs::path& spec, int nproc, const std::vector<std::string>& sets) {
    std::vector<std::string> args = {
        "train", "-f", spec.string(), "--nproc", std::to_string(nproc), "-o", "json"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const testing::CliResult r = testing::RunCli(meshrun_, args, dir_ / "train.err", 300);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const std::string& line : testing::Lines(r.out)) {
      const json j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "summary") {
        return j["losses"].get<std::vector<double>>();
      }
    }
    ADD_FAILURE() << "no summary in: " << r.out << r.err;
    return {};
  }

  static void ExpectLosses(const std::vector<double>& got, const std::vector<double>& want,
                           const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::fabs(got[k] / want[k] - 1));
    std::cout << what << ": largest relative difference " << worst << std::endl;
    for (size_t k = 0; k < got.size(); ++k) {
      // The first step is a pure forward of the loaded weights; later ones also carry the
      // updates' float32 rounding.
      const double tol = k == 0 ? 5e-6 : 1e-4;
      EXPECT_LE(std::fabs(got[k] - want[k]), tol * std::fabs(want[k]))
          << what << " step " << k + 1 << ": meshrun " << got[k] << ", transformers " << want[k];
    }
  }

  static inline fs::path python_, dir_;
  static inline std::string error_;
  static inline json reference_;
  static inline bool kept_ = false;
  fs::path meshrun_;
};

TEST_F(HfModelsTest, LlamaLossesMatchTransformersOnEveryMesh) {
  const std::vector<double> want = reference_["llama"].get<std::vector<double>>();
  const fs::path spec = WriteSpec("llama", "llama", 4);
  ExpectLosses(Train(spec, 1, {}), want, "1 rank");
  ExpectLosses(Train(spec, 2, {"parallelism.tp_size=2"}), want, "tp 2");
  ExpectLosses(Train(spec, 2, {"parallelism.cp_size=2", "parallelism.cp_comm_strategy=ring"}), want,
               "cp 2 ring");
  ExpectLosses(Train(spec, 2, {"parallelism.dp_shard_size=2"}), want, "dp_shard 2");
  ExpectLosses(
      Train(spec, 8,
            {"parallelism.dp_shard_size=2", "parallelism.cp_size=2", "parallelism.tp_size=2"}),
      want, "dp_shard 2 x cp 2 x tp 2");
}

TEST_F(HfModelsTest, BothGpt2NameLayoutsLoadUnderTp1AndTp2) {
  for (const std::string layout : {"gpt2-prefixed", "gpt2-unprefixed"}) {
    const std::vector<double> want = reference_[layout].get<std::vector<double>>();
    const fs::path spec = WriteSpec(layout, layout, 2);  // steps ≥ warmup; the first compared
    auto first = [](std::vector<double> losses) {
      losses.resize(std::min<size_t>(losses.size(), 1));
      return losses;
    };
    ExpectLosses(first(Train(spec, 1, {})), want, layout + " tp 1");
    ExpectLosses(first(Train(spec, 2, {"parallelism.tp_size=2"})), want, layout + " tp 2");
  }
}

TEST_F(HfModelsTest, ExportsAreReadByTransformersWithTheLossMeshrunEvalReports) {
  std::vector<std::string> exported;
  std::vector<double> meshrun_loss;
  std::vector<std::vector<int>> generated;  // meshrun generate's greedy continuations
  for (const std::string model : {"llama", "gpt2-prefixed"}) {
    const fs::path spec = WriteSpec("export-" + model, model, 2);
    ASSERT_EQ(Train(spec, 2, {"parallelism.tp_size=2"}).size(), 2u);
    const std::string ckpt = (dir_ / ("ckpt-export-" + model)).string();
    const std::string out = (dir_ / ("exported-" + model)).string();
    // The Llama export in shards of at most 200 KB (its 400 KB of weights make several), with
    // the index transformers reads; GPT-2 in one file.
    std::vector<std::string> args = {"export", ckpt, "--output-dir", out};
    if (model == "llama") args.insert(args.end(), {"--max-shard-size", "200KB"});
    testing::CliResult r = testing::RunCli(meshrun_, args, dir_ / "export.err", 60);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(fs::exists(fs::path(out) / "model.safetensors.index.json"), model == "llama") << out;
    r = testing::RunCli(meshrun_,
                        {"eval", ckpt, "--tokens", (dir_ / "data.bin").string(), "-o", "json"},
                        dir_ / "eval.err", 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json e = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.out;
    meshrun_loss.push_back(e["loss"].get<double>());
    exported.push_back(out);
    r = testing::RunCli(
        meshrun_,
        {"generate", "--model", out, "--prompt", "hello", "--max-new-tokens", "8", "-o", "json"},
        dir_ / "generate.err", 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json g = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(g.is_object() && g.contains("tokens")) << r.out;
    generated.push_back(g["tokens"].get<std::vector<int>>());
  }
  std::vector<std::string> args = {Reference(), "eval"};
  args.insert(args.end(), exported.begin(), exported.end());
  args.insert(args.end(), {"--tokens", (dir_ / "data.bin").string(), "--seq", "32", "--prompt",
                           "hello", "--new-tokens", "8"});
  const testing::CliResult r = testing::RunCli(python_, args, dir_ / "ref-eval.err", 600);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json ref = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(ref.is_array() && ref.size() == exported.size()) << r.out << r.err;
  for (size_t i = 0; i < exported.size(); ++i) {
    const double want = ref[i]["loss"].get<double>();
    EXPECT_LE(std::fabs(meshrun_loss[i] - want), 5e-6 * want)
        << exported[i] << ": meshrun eval " << meshrun_loss[i] << ", transformers " << want;
    EXPECT_EQ(generated[i], ref[i]["generated"].get<std::vector<int>>())
        << exported[i] << ": meshrun generate vs transformers' generate (greedy)";
  }
}

}  // namespace
}  // namespace meshrun
