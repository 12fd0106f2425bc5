// `meshrun export` keeps the identity of the model a job was trained from (init_from): a
// Llama 3-style folder in bfloat16 (bos 1, end of text 0, generation_config.json's eos [0, 5]
// and sampling defaults) and a Mistral in float16 (bos 1, eos 2, pad 0), both made by
// transformers at test time (tests/integration/hf_export_check.py), are fine-tuned two steps
// with `meshrun train` and exported; transformers loads each export with the source's
// model_type, class, special token ids, generation config and dtype (or the one --dtype asks
// for), and its generate stops at the source's end of text. The identity travels in the
// checkpoint's metadata: the export works with the source folder gone. Without a source the
// export keeps meshrun's own ids (eos from the job's tokenizer when it has one) and still
// writes generation_config.json.
// Skips, saying why, only when the model venv cannot be made.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/fakes/byte_level.h"

namespace meshrun {
namespace {

using testing::ByteLevelChar;

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path ExportSourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::current_path();
}

fs::path ExportBuildDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path("build");
}

json ReadExportedJson(const fs::path& path) {
  return json::parse(testing::ReadFile(path), nullptr, /*allow_exceptions=*/false);
}

class HfExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    python_ = testing::ModelVenvPython(ExportSourceDir(), &error_);
    if (python_.empty()) return;
    char pattern[] = "/tmp/meshrun_hf_export_XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = pattern;
    const testing::CliResult r =
        testing::RunCli(python_, {Script(), "prepare", dir_.string()}, dir_ / "prepare.err", 600);
    if (r.exit_code != 0) error_ = "hf_export_check.py prepare failed: " + r.err;  // a failure
  }

  static void TearDownTestSuite() {
    if (!dir_.empty() && !kept_) fs::remove_all(dir_);
  }

  static std::string Script() {
    return (ExportSourceDir() / "tests" / "integration" / "hf_export_check.py").string();
  }

  void SetUp() override {
    if (python_.empty()) GTEST_SKIP() << error_;
    ASSERT_TRUE(error_.empty()) << error_;
    meshrun_ = ExportBuildDir() / "bin" / "meshrun";
    ASSERT_TRUE(fs::exists(meshrun_)) << meshrun_;
  }

  void TearDown() override {
    if (HasFailure()) {
      kept_ = true;
      std::cerr << "files kept in " << dir_ << std::endl;
    }
  }

  // Two steps of `meshrun train` on one rank, from `model` (a line of the spec's model
  // section); returns the checkpoint folder.
  fs::path Train(const std::string& name, const std::string& model) {
    const fs::path spec = dir_ / (name + ".yaml");
    const fs::path ckpt = dir_ / ("ckpt-" + name);
    std::ofstream(spec) << "name: " << name << "\n"
                        << "model: {" << model << ", seq_len: 32}\n"
                        << "train: {steps: 2, global_batch_size: 4, micro_batch_size: 2, "
                        << "lr: 1.0e-3, warmup_steps: 1}\n"
                        << "data: {train: " << (dir_ / "data.bin").string() << "}\n"
                        << "checkpoint: {dir: " << ckpt.string() << ", resume: never}\n";
    const testing::CliResult r = testing::RunCli(
        meshrun_, {"train", "-f", spec.string(), "--nproc", "1"}, dir_ / "train.err", 300);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return ckpt;
  }

  // `meshrun export CKPT --output-dir DIR [args]`; the exit code.
  int Export(const fs::path& ckpt, const fs::path& out, std::vector<std::string> args = {}) {
    args.insert(args.begin(), {"export", ckpt.string(), "--output-dir", out.string()});
    const testing::CliResult r = testing::RunCli(meshrun_, args, dir_ / "export.err", 120);
    last_err_ = r.err;
    EXPECT_NE(r.exit_code == 0, r.out.empty()) << r.out << r.err;
    return r.exit_code;
  }

  // transformers' view of the export against the source's (hf_export_check.py check).
  void ExpectIdentity(const fs::path& source, const fs::path& out, const std::string& dtype) {
    const testing::CliResult r = testing::RunCli(
        python_, {Script(), "check", source.string(), out.string(), "--dtype", dtype},
        dir_ / "check.err", 300);
    EXPECT_EQ(r.exit_code, 0) << out << ":\n" << r.out << r.err;
    if (r.exit_code == 0) std::cout << out.filename().string() << ": " << r.out;
  }

  static inline fs::path python_, dir_;
  static inline std::string error_;
  static inline bool kept_ = false;
  fs::path meshrun_;
  std::string last_err_;
};

TEST_F(HfExportTest, LlamaThreeStyleKeepsItsIdsAndBfloat16WithTheSourceGone) {
  const fs::path ckpt = Train("llama3", "init_from: " + (dir_ / "llama3").string());
  // The identity was recorded in the checkpoint: the source folder is not needed to export.
  fs::rename(dir_ / "llama3", dir_ / "llama3-moved");
  const fs::path out = dir_ / "exported-llama3";
  ASSERT_EQ(Export(ckpt, out), 0) << last_err_;
  fs::rename(dir_ / "llama3-moved", dir_ / "llama3");
  ExpectIdentity(dir_ / "llama3", out, "bfloat16");
  // Half of float32's bytes.
  EXPECT_LT(fs::file_size(out / "model.safetensors"),
            fs::file_size(dir_ / "llama3" / "model.safetensors") * 11 / 10);
}

TEST_F(HfExportTest, MistralStaysMistralInItsDtypeOrTheOneAskedFor) {
  const fs::path ckpt = Train("mistral", "init_from: " + (dir_ / "mistral").string());
  ASSERT_EQ(Export(ckpt, dir_ / "exported-mistral"), 0) << last_err_;
  ExpectIdentity(dir_ / "mistral", dir_ / "exported-mistral", "float16");
  ASSERT_EQ(Export(ckpt, dir_ / "exported-mistral-fp32", {"--dtype", "float32"}), 0) << last_err_;
  ExpectIdentity(dir_ / "mistral", dir_ / "exported-mistral-fp32", "float32");
  EXPECT_EQ(Export(ckpt, dir_ / "exported-mistral-x", {"--dtype", "int8"}), 2);
  EXPECT_NE(last_err_.find("--dtype"), std::string::npos) << last_err_;
}

// From scratch: meshrun's own ids (eos vocab_size − 1, Llama's bos 0), float32, and a
// generation_config.json naming them.
TEST_F(HfExportTest, FromScratchKeepsMeshrunsIdsAndWritesAGenerationConfig) {
  const fs::path ckpt = Train("scratch",
                              "arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 64, "
                              "vocab_size: 320");
  const fs::path out = dir_ / "exported-scratch";
  ASSERT_EQ(Export(ckpt, out), 0) << last_err_;
  const json config = ReadExportedJson(out / "config.json");
  const json generation = ReadExportedJson(out / "generation_config.json");
  ASSERT_TRUE(config.is_object() && generation.is_object());
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["eos_token_id"], 319);
  EXPECT_EQ(config["bos_token_id"], 0);
  EXPECT_EQ(generation["eos_token_id"], 319);
  EXPECT_EQ(generation["bos_token_id"], 0);
}

// From scratch with data.tokenizer: eos is the tokenizer's end of text (id 0 here, where
// vocab_size − 1 would name an ordinary byte).
TEST_F(HfExportTest, FromScratchTakesEosFromTheJobsTokenizer) {
  // Id 0 is <|endoftext|>, ids 1..256 the bytes in GPT-2's byte-level alphabet.
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b + 1;
  const json tokenizer = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", {{{"id", 0}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  fs::create_directories(dir_ / "tok");
  std::ofstream(dir_ / "tok" / "tokenizer.json") << tokenizer.dump();
  std::string text;
  while (text.size() < 4000) text += "the model stops at its end of text. ";
  std::ofstream(dir_ / "text.txt") << text;
  const fs::path spec = dir_ / "scratch-tok.yaml";
  std::ofstream(spec) << "name: scratch-tok\n"
                      << "model: {arch: llama, n_layer: 1, n_head: 4, d_model: 32, seq_len: 32, "
                      << "vocab_size: 257}\n"
                      << "train: {steps: 2, global_batch_size: 2, micro_batch_size: 1, "
                      << "warmup_steps: 1}\n"
                      << "data: {train: " << (dir_ / "text.txt").string()
                      << ", tokenizer: " << (dir_ / "tok").string() << "}\n"
                      << "checkpoint: {dir: " << (dir_ / "ckpt-scratch-tok").string()
                      << ", resume: never}\n";
  const testing::CliResult r = testing::RunCli(
      meshrun_, {"train", "-f", spec.string(), "--nproc", "1"}, dir_ / "train.err", 300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const fs::path out = dir_ / "exported-scratch-tok";
  ASSERT_EQ(Export(dir_ / "ckpt-scratch-tok", out), 0) << last_err_;
  EXPECT_EQ(ReadExportedJson(out / "config.json")["eos_token_id"], 0);
  EXPECT_EQ(ReadExportedJson(out / "generation_config.json")["eos_token_id"], 0);
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
}

}  // namespace
}  // namespace meshrun
