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
#include "tests/integration/reference_suite.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class HfModelsTest : public testing::ReferenceSuite<HfModelsTest> {
 public:
  static constexpr const char* kReferenceScript = "hf_reference.py";
  static constexpr const char* kTempPrefix = "meshrun_hf_models";

 protected:
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

  // The first step is a pure forward of the loaded weights; later ones also carry the updates'
  // float32 rounding.
  static void ExpectLosses(const std::vector<double>& got, const std::vector<double>& want,
                           const std::string& what) {
    ReferenceSuite::ExpectLosses(got, want, 5e-6, 1e-4, what);
  }
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
  std::vector<std::string> args = {ReferenceScript(), "eval"};
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
