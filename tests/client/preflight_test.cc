// What `validate`, `train` and `submit` check before any training starts (client/preflight.h),
// run as the real binary: missing or binary data, token ids over vocab_size, a vocabulary that
// is not the data's (bytes or data.tokenizer), an unwritable
// checkpoint.dir and a model no host can hold are each exit 2 with one `error: <field>:` line,
// and `train` stops before its first step.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::Lines;
using testing::RunCli;

constexpr char kCorpus[] = "/usr/share/games/fortunes/cookie";

class PreflightTest : public testing::MeshrunBinaryTest {
 protected:
  void SetUp() override {
    MeshrunBinaryTest::SetUp();
    if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing (apt-get install fortunes)";
    spec_ = (temp_ / "job.yaml").string();
    std::ofstream(spec_) << "data:\n  train: " << kCorpus << "\ntrain:\n  steps: 2\n";
  }
  CliResult Run(const std::vector<std::string>& args) {
    return RunCli(binary_, args, temp_ / "stderr.txt", 60);
  }
  // `validate`, `train` and `submit` (to a coordinator that is not there: the checks come
  // first) with `sets`; each must exit 2 with one line starting `error: <prefix>`.
  void ExpectRefusedEverywhere(const std::vector<std::string>& sets, const std::string& prefix,
                               const std::string& contains) {
    const std::vector<std::vector<std::string>> commands = {
        {"validate", "-f", spec_},
        {"train", "-f", spec_, "-o", "json"},
        {"submit", "-f", spec_, "--coordinator", "127.0.0.1:1"}};
    for (std::vector<std::string> args : commands) {
      for (const std::string& kv : sets) {
        args.push_back("--set");
        args.push_back(kv);
      }
      const CliResult r = Run(args);
      SCOPED_TRACE(args[0]);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      const std::vector<std::string> lines = Lines(r.err);
      ASSERT_EQ(lines.size(), 1u) << r.err;
      EXPECT_EQ(lines[0].rfind("error: " + prefix, 0), 0u) << lines[0];
      EXPECT_NE(lines[0].find(contains), std::string::npos) << lines[0];
      EXPECT_NE(lines[0].find("(hint: "), std::string::npos) << lines[0];
      EXPECT_EQ(r.out, "") << "nothing trained or printed";
    }
  }
  std::string spec_;
};

TEST_F(PreflightTest, MissingDataNamesTheField) {
  ExpectRefusedEverywhere({"data.train=" + (temp_ / "nope.txt").string()},
                          "data.train: " + (temp_ / "nope.txt").string(), "no such file");
  ExpectRefusedEverywhere({"data.val=" + (temp_ / "val.txt").string()},
                          "data.val: " + (temp_ / "val.txt").string(), "no such file");
}

TEST_F(PreflightTest, BinaryDataForTextIsRefused) {
  const fs::path bin = temp_ / "blob.dat";
  std::ofstream(bin, std::ios::binary) << std::string(
      "\x7f"
      "ELF\x02\x01\x01\x00\xff\xfe",
      10);
  ExpectRefusedEverywhere({"data.train=" + bin.string(), "data.format=text"},
                          "data.train: ", "not UTF-8 text");
}

TEST_F(PreflightTest, TokenIdsAboveTheVocabularyAreRefused) {
  // nanoGPT layout: raw uint16 tokens; id 300 does not fit the byte-level vocab of 256.
  const fs::path bin = temp_ / "tokens.bin";
  std::ofstream out(bin, std::ios::binary);
  for (int i = 0; i < 1000; ++i) {
    const uint16_t token = i % 2 ? 300 : 7;
    out.write(reinterpret_cast<const char*>(&token), 2);
  }
  out.close();
  ExpectRefusedEverywhere({"data.train=" + bin.string()}, "model.vocab_size: token id 300",
                          "vocab_size(256)");
}

TEST_F(PreflightTest, TheDataVocabularyMustBeTheModels) {
  // Byte-level text (vocabulary 256) into a GPT-2-sized model.
  ExpectRefusedEverywhere({"model.vocab_size=50257"}, "model.vocab_size: 50257",
                          "byte-level text (vocabulary 256)");
  // A tokenizer (a minimal byte-level one: 256 byte tokens, no merges, one special token, so
  // 257 ids) against a model of 256.
  const fs::path tok = temp_ / "tok";
  fs::create_directories(tok);
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!direct) continue;  // a tokenizer without these bytes still loads
    char key[16];
    if (b == '"' || b == '\\') {
      std::snprintf(key, sizeof(key), "\"\\%c\"", b);
    } else if (b < 0x80) {
      std::snprintf(key, sizeof(key), "\"%c\"", b);
    } else {
      std::snprintf(key, sizeof(key), "\"%c%c\"", 0xC0 | (b >> 6), 0x80 | (b & 0x3F));
    }
    vocab += (vocab.empty() ? "" : ",") + std::string(key) + ":" + std::to_string(b);
  }
  std::ofstream(tok / "tokenizer.json")
      << R"({"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,)"
      << R"("use_regex":true},"added_tokens":[{"id":256,"content":"<|endoftext|>"}],)"
      << R"("model":{"type":"BPE","vocab":{)" << vocab << R"(},"merges":[]}})";
  ExpectRefusedEverywhere({"data.tokenizer=" + tok.string()}, "model.vocab_size: 256",
                          "has a vocabulary of 257");
  // The same tokenizer with a model of 257 passes the checks.
  const CliResult ok = Run({"validate", "-f", spec_, "--set", "data.tokenizer=" + tok.string(),
                            "--set", "model.vocab_size=257"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  // A model larger than the tokenizer is padded: it passes, with one note.
  const CliResult padded = Run({"validate", "-f", spec_, "--set", "data.tokenizer=" + tok.string(),
                                "--set", "model.vocab_size=320"});
  EXPECT_EQ(padded.exit_code, 0) << padded.err;
  EXPECT_NE(padded.err.find("note: model.vocab_size 320 > the tokenizer's 257 ids: ids "
                            "257\u2013319 are padding, never produced"),
            std::string::npos)
      << padded.err;
}

TEST_F(PreflightTest, UnwritableCheckpointDirFailsBeforeTraining) {
  const fs::path file = temp_ / "a-file";
  std::ofstream(file) << "x";
  ExpectRefusedEverywhere({"checkpoint.dir=" + (file / "ck").string()},
                          "checkpoint.dir: ", "is not a folder");
  // A folder where nothing can be created, even by root.
  ExpectRefusedEverywhere({"checkpoint.dir=/proc/meshrun-ck"}, "checkpoint.dir: /proc/meshrun-ck",
                          "cannot create anything in /proc");
  // None of the checks leaves anything behind.
  EXPECT_FALSE(fs::exists(file / "ck"));
}

TEST_F(PreflightTest, AModelNoHostCanHoldIsRefusedWithTheField) {
  ExpectRefusedEverywhere({"model.d_model=65536", "model.n_layer=48", "model.n_head=64"},
                          "model.d_model: n_layer 48, d_model 65536", "of memory");
}

TEST_F(PreflightTest, InitFromMustBeAHuggingFaceFolder) {
  ExpectRefusedEverywhere({"model.init_from=" + temp_.string()},
                          "model.init_from: " + temp_.string() + " has no config.json", "export");
}

TEST_F(PreflightTest, SkipLocalChecksLeavesPathsToTheWorkers) {
  const CliResult r = Run({"validate", "-f", spec_, "--skip-local-checks", "--set",
                           "data.train=/only/on/the/workers.txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PreflightTest, AGoodSpecStillTrains) {
  const CliResult r = Run({"train", "-f", spec_, "-o", "json", "--set",
                           "checkpoint.dir=" + (temp_ / "new" / "ck").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"event\":\"summary\""), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(temp_ / "new" / "ck" / "step-00000002"));
}

}  // namespace
}  // namespace meshrun
