// The one mapping of config.json to the spec's model fields (common/hf_config.h, decision 0048),
// read by the YAML reader, the rank and the engine's loader alike.
#include "common/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class HfConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_hf_config_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Folder(const std::string& name, const std::string& config) {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "config.json") << config;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(HfConfigTest, Gpt2FieldsAndWhatTheSpecGivesIsKept) {
  const std::string gpt2 = Folder("gpt2", R"({"model_type": "gpt2", "n_layer": 3, "n_head": 2,
      "n_embd": 64, "n_positions": 128, "vocab_size": 300, "layer_norm_epsilon": 1e-6})");
  StatusOr<ModelSpec> file = ReadInitFromConfig(gpt2);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->arch, "gpt2");
  EXPECT_EQ(file->d_model, 64);
  EXPECT_EQ(file->seq_len, 128);
  EXPECT_TRUE(file->tie_embeddings);
  ModelSpec out;
  out.seq_len = 32;
  const std::vector<std::string> given = {"seq_len"};
  FillModelFromConfig(
      *file,
      [&](std::string_view f) { return std::find(given.begin(), given.end(), f) != given.end(); },
      &out);
  EXPECT_EQ(out.n_layer, 3);
  EXPECT_EQ(out.n_head, 2);
  EXPECT_EQ(out.d_model, 64);
  EXPECT_EQ(out.vocab_size, 300);
  EXPECT_EQ(out.seq_len, 32) << "given by the spec";
  EXPECT_DOUBLE_EQ(out.norm_eps, 1e-6);
}

TEST_F(HfConfigTest, LlamaKeepsTheSpecsSeqLenAndItsFamilysDefaults) {
  const std::string llama = Folder("llama", R"({"model_type": "llama", "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
      "intermediate_size": 160, "vocab_size": 256, "max_position_embeddings": 4096})");
  StatusOr<ModelSpec> file = ReadInitFromConfig(llama);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ModelSpec out;
  FillModelFromConfig(
      *file, [](std::string_view) { return false; }, &out);
  EXPECT_EQ(out.arch, "llama");
  EXPECT_EQ(out.n_kv_head, 2);
  EXPECT_EQ(out.d_ff, 160);
  EXPECT_EQ(out.seq_len, ModelSpec().seq_len) << "max_position_embeddings is not a training length";
  EXPECT_DOUBLE_EQ(out.norm_eps, 1e-6) << "transformers' default for the family";
  EXPECT_FALSE(out.tie_embeddings);
}

TEST_F(HfConfigTest, RefusalsNameTheFolder) {
  const std::string bert = Folder("bert", R"({"model_type": "bert"})");
  StatusOr<ModelSpec> file = ReadInitFromConfig(bert);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message().rfind("model.init_from: " + bert, 0), 0u)
      << file.status().message();
  EXPECT_FALSE(ReadInitFromConfig((dir_ / "missing").string()).ok());
}

// The YAML reader fills with the same mapping: a spec file with only init_from validates with
// config.json's sizes.
TEST_F(HfConfigTest, TheYamlReaderFillsFromTheSameMapping) {
  const std::string gpt2 = Folder("y", R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2,
      "n_embd": 32, "n_positions": 32, "vocab_size": 256})");
  const fs::path spec = dir_ / "job.yaml";
  std::ofstream(spec) << "model: {init_from: " << gpt2
                      << "}\nparallelism: {tp_size: 2}\ndata: {train: /tmp/x.txt}\n";
  StatusOr<JobSpec> parsed = LoadJobSpecFile(spec.string(), {});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->model.d_model, 32);
  EXPECT_EQ(parsed->model.seq_len, 32);
  EXPECT_EQ(parsed->model.n_head, 2);
}

}  // namespace
}  // namespace meshrun
