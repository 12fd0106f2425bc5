// Attention masks beyond plain causal through the product, against independent references built
// on transformers (tests/reference/mask_reference.py, in the model venv that tests/python/make-venv
// makes from tests/python/requirements-models.txt):
//  - a tiny Mistral with sliding_window 11 < seq_len 32 trains from `init_from` with
//    transformers' per-step losses (first step ≤ 5e-6 relative) on one rank, under cp 2 (ring)
//    × tp 2 and under cp 2 (allgather);
//  - data.attention: document with a tiny Llama and a tiny GPT-2 (end-of-text id 2 from their
//    config.json): the first-step loss equals a block-diagonal causal mask with positions
//    restarting per document (≤ 1e-5), and cp 2 (ring) × tp 2, cp 2 (allgather), dp_shard 2
//    equal one rank at every step;
//  - data.attention: document with nothing that names the end-of-text token, or a value that
//    is not causal|document: exit 2 naming data.attention.
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

fs::path MaskSourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::current_path();
}

fs::path MaskBuildDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path("build");
}

class AttentionMasksTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    python_ = testing::ModelVenvPython(MaskSourceDir(), &error_);
    if (python_.empty()) return;
    char pattern[] = "/tmp/meshrun_masks_XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = pattern;
    const fs::path reference = MaskSourceDir() / "tests" / "reference" / "mask_reference.py";
    testing::CliResult r = testing::RunCli(python_, {reference.string(), "prepare", dir_.string()},
                                           dir_ / "prepare.err", 600);
    if (r.exit_code != 0) {
      error_ = "mask_reference.py prepare failed: " + r.err;  // a failure, not a skip (below)
      return;
    }
    reference_ = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  static void TearDownTestSuite() {
    if (!dir_.empty() && !kept_) fs::remove_all(dir_);
  }

  void SetUp() override {
    if (python_.empty()) GTEST_SKIP() << error_;
    ASSERT_TRUE(error_.empty()) << error_;
    ASSERT_TRUE(reference_.is_object()) << "the reference printed no JSON";
    meshrun_ = MaskBuildDir() / "bin" / "meshrun";
    ASSERT_TRUE(fs::exists(meshrun_)) << meshrun_;
  }

  void TearDown() override {
    if (HasFailure()) {
      kept_ = true;
      std::cerr << "files kept in " << dir_ << std::endl;
    }
  }

  // The reference's schedule (lr 3e-3, warmup 2, 3 steps, batch 8 of 32 tokens), sequential
  // windows of data.bin.
  fs::path WriteSpec(const std::string& name, const std::string& model_dir,
                     const std::string& attention) {
    const fs::path spec = dir_ / (name + ".yaml");
    std::ofstream out(spec);
    out << "name: " << name << "\n"
        << "model: {init_from: " << (dir_ / model_dir).string() << ", seq_len: 32}\n"
        << "train: {steps: 3, global_batch_size: 8, micro_batch_size: 2, "
        << "lr: 3.0e-3, min_lr: 3.0e-5, warmup_steps: 2}\n"
        << "data: {train: " << (dir_ / "data.bin").string() << ", attention: " << attention
        << "}\n";
    return spec;
  }

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

  // got[k] against want[k]: the first step within first_tol (relative), later ones within
  // later_tol (they also carry the updates' float32 rounding).
  static void ExpectLosses(const std::vector<double>& got, const std::vector<double>& want,
                           double first_tol, double later_tol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t k = 0; k < got.size(); ++k) {
      const double tol = k == 0 ? first_tol : later_tol;
      EXPECT_LE(std::fabs(got[k] - want[k]), tol * std::fabs(want[k]))
          << what << " step " << k + 1 << ": meshrun " << got[k] << ", reference " << want[k];
    }
  }

  static inline fs::path python_, dir_;
  static inline std::string error_;
  static inline json reference_;
  static inline bool kept_ = false;
  fs::path meshrun_;
};

TEST_F(AttentionMasksTest, MistralSlidingWindowMatchesTransformersOnOneRankAndUnderCp) {
  const std::vector<double> want = reference_["mistral"].get<std::vector<double>>();
  const fs::path spec = WriteSpec("mistral", "mistral", "causal");
  ExpectLosses(Train(spec, 1, {}), want, 5e-6, 1e-4, "mistral 1 rank");
  ExpectLosses(Train(spec, 4,
                     {"parallelism.cp_size=2", "parallelism.tp_size=2",
                      "parallelism.cp_comm_strategy=ring"}),
               want, 5e-6, 1e-4, "mistral cp 2 (ring) x tp 2");
  ExpectLosses(Train(spec, 2, {"parallelism.cp_size=2"}), want, 5e-6, 1e-4,
               "mistral cp 2 (allgather)");
}

TEST_F(AttentionMasksTest, DocumentMaskingMatchesABlockDiagonalReferenceOnEveryMesh) {
  // The mask must matter on this data, or the comparison would prove nothing.
  ASSERT_GT(std::fabs(reference_["llama-doc"][0].get<double>() -
                      reference_["llama-causal"][0].get<double>()),
            1e-4 * reference_["llama-causal"][0].get<double>());
  for (const std::string model : {"llama-doc", "gpt2-doc"}) {
    const std::vector<double> want = reference_[model].get<std::vector<double>>();
    const fs::path spec = WriteSpec(model, model, "document");
    const std::vector<double> one = Train(spec, 1, {});
    ExpectLosses(one, want, 1e-5, 1e-4, model + " 1 rank");
    // Every mesh equals one rank (float32 rounding of the reductions only).
    ExpectLosses(Train(spec, 4,
                       {"parallelism.cp_size=2", "parallelism.tp_size=2",
                        "parallelism.cp_comm_strategy=ring"}),
                 one, 1e-5, 1e-5, model + " cp 2 (ring) x tp 2");
    if (model == "gpt2-doc") continue;  // the other meshes once, on the Llama model
    ExpectLosses(Train(spec, 2, {"parallelism.cp_size=2"}), one, 1e-5, 1e-5,
                 model + " cp 2 (allgather)");
    ExpectLosses(Train(spec, 2, {"parallelism.dp_shard_size=2"}), one, 1e-5, 1e-5,
                 model + " dp_shard 2");
  }
}

// No venv needed: the refusals come before any model runs.
TEST(AttentionMasksSpecTest, DocumentMaskingNeedsAnEndOfTextTokenAndAKnownValue) {
  const fs::path meshrun = MaskBuildDir() / "bin" / "meshrun";
  ASSERT_TRUE(fs::exists(meshrun)) << meshrun;
  char pattern[] = "/tmp/meshrun_masks_spec_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const fs::path dir = pattern;
  {
    std::ofstream(dir / "data.txt") << std::string(4000, 'a');
    std::ofstream(dir / "job.yaml")
        << "model: {n_layer: 1, n_head: 2, d_model: 16, seq_len: 16}\n"
        << "train: {steps: 1, global_batch_size: 2, micro_batch_size: 1}\n"
        << "data: {train: " << (dir / "data.txt").string() << ", attention: document}\n";
  }
  // Byte-level text has no end-of-text token.
  testing::CliResult r = testing::RunCli(
      meshrun, {"train", "-f", (dir / "job.yaml").string(), "--nproc", "1"}, dir / "err", 120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("error: data.attention:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hint:"), std::string::npos) << r.err;
  r = testing::RunCli(
      meshrun, {"validate", "-f", (dir / "job.yaml").string(), "--set", "data.attention=packed"},
      dir / "err", 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("data.attention"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'packed'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'document'"), std::string::npos) << r.err;
  r = testing::RunCli(
      meshrun, {"validate", "-f", (dir / "job.yaml").string(), "--set", "model.sliding_window=-3"},
      dir / "err", 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("model.sliding_window"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshrun
