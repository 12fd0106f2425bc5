// A tokenizer.json whose pre-tokenizer pattern backtracks catastrophically ((\w+\s?)*$ over
// 20 KB of words with commas, which took 15 s before the limits, and minutes on more text):
// `meshrun tokenize`, `validate` and `train` each stop with exit 2 and the one-line error naming
// data.tokenizer, the file and the pattern (the limits themselves:
// tests/engine/data/tokenizer_limits_test.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/client/cli_runner.h"
#include "tests/fakes/byte_level.h"

namespace meshrun {
namespace {

using testing::ByteLevelChar;

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path LimitsBuildDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path("build");
}

class TokenizerLimitsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tokenizer-limits-cli-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "tok");
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b;
    const json split = {{"type", "Split"},
                        {"pattern", {{"Regex", R"((\w+\s?)*$)"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
    const json byte_level = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
    const json tokenizer = {
        {"version", "1.0"},
        {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
        {"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
    std::ofstream(dir_ / "tok" / "tokenizer.json") << tokenizer.dump();
    std::string text;
    while (text.size() < 20000) text += "hello world this is some text, ";
    std::ofstream(dir_ / "text.txt") << text;
    std::ofstream(dir_ / "job.yaml")
        << "name: bad-pattern\n"
        << "model: {n_layer: 1, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 257}\n"
        << "train: {steps: 2, global_batch_size: 2, micro_batch_size: 1, warmup_steps: 1}\n"
        << "data: {train: " << (dir_ / "text.txt").string()
        << ", tokenizer: " << (dir_ / "tok").string() << "}\n";
    meshrun_ = LimitsBuildDir() / "bin" / "meshrun";
    ASSERT_TRUE(fs::exists(meshrun_)) << meshrun_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  void ExpectRefused(const std::vector<std::string>& args) {
    const testing::CliResult r = testing::RunCli(meshrun_, args, dir_ / "err", 120);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.out << r.err;
    const std::string want = "error: data.tokenizer: " + (dir_ / "text.txt").string() +
                             ": the pre-tokenizer pattern '(\\w+\\s?)*$' exceeded the match limit";
    EXPECT_EQ(r.err.rfind(want, 0), 0u) << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find("(hint: "), std::string::npos) << r.err;
  }

  fs::path dir_, meshrun_;
};

TEST_F(TokenizerLimitsCliTest, TokenizeValidateAndTrainStopWithTheLimitError) {
  ExpectRefused({"tokenize", "--tokenizer", (dir_ / "tok").string(), (dir_ / "text.txt").string(),
                 "-o", (dir_ / "out.bin").string()});
  ExpectRefused({"validate", "-f", (dir_ / "job.yaml").string()});
  ExpectRefused({"train", "-f", (dir_ / "job.yaml").string(), "--nproc", "1"});
}

}  // namespace
}  // namespace meshrun
