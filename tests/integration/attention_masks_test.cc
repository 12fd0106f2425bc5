// Attention masks beyond plain causal through the product, against independent references built
// on transformers (tests/reference/mask_reference.py, in the model venv that tests/python/make-venv
// makes from tests/python/requirements-models.txt):
//  - a tiny Mistral with sliding_window 11 < seq_len 32 trains from `init_from` with
//    transformers' per-step losses (first step ≤ 5e-6 relative) on one rank, under cp 2 (ring)
//    × tp 2 and under cp 2 (allgather);
//  - data.attention: document with a tiny Llama and a tiny GPT-2 (end-of-text id 2 from their
//    config.json): the first-step loss equals a block-diagonal causal mask with positions
//    restarting per document (≤ 1e-5), and cp 2 (ring) × tp 2, cp 2 (allgather), dp_shard 2,
//    selective recompute and pp 2 (1f1b, zero_bubble) equal one rank at every step;
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
#include "tests/integration/reference_suite.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class AttentionMasksTest : public testing::ReferenceSuite<AttentionMasksTest> {
 public:
  static constexpr const char* kReferenceScript = "mask_reference.py";
  static constexpr const char* kTempPrefix = "meshrun_masks";

 protected:
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

TEST_F(AttentionMasksTest, MistralExportKeepsItsWindowAndLoadsBack) {
  const fs::path spec = WriteSpec("mistral-export", "mistral", "causal");
  const fs::path ckpt = dir_ / "ckpt-mistral-export";
  ASSERT_EQ(
      Train(spec, 1, {"checkpoint.dir=" + ckpt.string(), "train.steps=1", "train.warmup_steps=1"})
          .size(),
      1u);
  const fs::path out = dir_ / "exported-mistral";
  testing::CliResult r = testing::RunCli(
      meshrun_, {"export", (ckpt / "step-00000001").string(), "--output-dir", out.string()},
      dir_ / "export.err", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out / "config.json");
  const json config = json::parse(in, nullptr, false);
  ASSERT_TRUE(config.is_object());
  EXPECT_EQ(config.value("model_type", ""), "mistral");
  EXPECT_EQ(config.value("sliding_window", 0), 11) << config.dump();
  // The exported folder is a starting point again, its window read back from config.json.
  const fs::path again = WriteSpec("mistral-again", "exported-mistral", "causal");
  r = testing::RunCli(meshrun_, {"validate", "-f", again.string(), "-o", "json"},
                      dir_ / "validate.err", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json validated = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(validated.is_object()) << r.out;
  EXPECT_EQ(validated["spec"]["model"].value("sliding_window", 0), 11) << r.out;
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
    // Pipeline stages fill their micro-batches through the same path as one stage: each
    // stage's masks from its micro-batch's documents.
    for (const std::string schedule : {"1f1b", "zero_bubble"}) {
      ExpectLosses(Train(spec, 2, {"parallelism.pp_size=2", "parallelism.pp_schedule=" + schedule}),
                   one, 1e-5, 1e-5, model + " pp 2 " + schedule);
    }
    // Recompute runs the masked attention again in the backward.
    ExpectLosses(Train(spec, 1, {"train.activation_checkpointing=selective"}), one, 1e-5, 1e-5,
                 model + " selective recompute");
  }
}

// No venv needed: the refusals come before any model runs.
TEST(AttentionMasksSpecTest, DocumentMaskingNeedsAnEndOfTextTokenAndAKnownValue) {
  const fs::path meshrun = testing::TestBuildDir() / "bin" / "meshrun";
  ASSERT_TRUE(fs::exists(meshrun)) << meshrun;
  char pattern[] = "/tmp/meshrun_masks_spec_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const fs::path dir = pattern;
  {
    std::ofstream(dir / "data.txt") << std::string(4000, 'a');
    std::ofstream(dir / "job.yaml")
        << "model: {n_layer: 1, n_head: 2, d_model: 16, seq_len: 16}\n"
        << "train: {steps: 1, warmup_steps: 1, global_batch_size: 2, micro_batch_size: 1}\n"
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
  // A family whose Hugging Face class has no window: refused, naming the field and the fix.
  for (const std::string arch : {"gpt2", "gemma"}) {
    r = testing::RunCli(meshrun,
                        {"validate", "-f", (dir / "job.yaml").string(), "--set",
                         "model.arch=" + arch, "--set", "model.sliding_window=8"},
                        dir / ("window-" + arch + ".err"), 60);
    EXPECT_EQ(r.exit_code, 2) << arch << ": " << r.err;
    EXPECT_NE(r.err.find("model.sliding_window"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("no sliding window"), std::string::npos) << r.err;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshrun
