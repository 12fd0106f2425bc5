// `validate`, `train` and `submit` on token shards (docs/data.md "Shards and memory"), run as the
// real binary: a malformed shard of a folder or a glob is exit 2 with one `error: data.train:
// SHARD: … at offset N` line, an empty glob names the glob, and a good glob validates.
#include <gtest/gtest.h>

#include <cstdint>
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

class PreflightShardsTest : public testing::MeshrunBinaryTest {
 protected:
  void SetUp() override {
    MeshrunBinaryTest::SetUp();
    spec_ = (temp_ / "job.yaml").string();
    std::ofstream(spec_) << "model:\n  vocab_size: 512\n  seq_len: 16\ntrain:\n  steps: 2\n"
                            "data:\n  train: unused\n";
    fs::create_directories(temp_ / "d");
  }
  // An llm.c version 1 shard of `n` ids (i % 500) with `magic`.
  void Shard(const std::string& name, int n, int32_t magic = 20240520) {
    std::ofstream f(temp_ / "d" / name, std::ios::binary);
    int32_t header[256] = {magic, 1, n};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int i = 0; i < n; ++i) {
      const uint16_t id = static_cast<uint16_t>(i % 500);
      f.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  CliResult Run(const std::vector<std::string>& args) {
    return RunCli(binary_, args, temp_ / "stderr.txt", 60);
  }
  void ExpectRefusedEverywhere(const std::string& train, const std::string& prefix,
                               const std::string& contains) {
    const std::vector<std::vector<std::string>> commands = {
        {"validate", "-f", spec_},
        {"train", "-f", spec_, "-o", "json"},
        {"submit", "-f", spec_, "--coordinator", "127.0.0.1:1"}};
    for (std::vector<std::string> args : commands) {
      args.insert(args.end(), {"--set", "data.train=" + train});
      const CliResult r = Run(args);
      SCOPED_TRACE(args[0] + " " + train);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      const std::vector<std::string> lines = Lines(r.err);
      ASSERT_EQ(lines.size(), 1u) << r.err;
      EXPECT_EQ(lines[0].rfind("error: " + prefix, 0), 0u) << lines[0];
      EXPECT_NE(lines[0].find(contains), std::string::npos) << lines[0];
      EXPECT_NE(lines[0].find("(hint: "), std::string::npos) << lines[0];
      EXPECT_EQ(r.out, "");
    }
  }
  std::string spec_;
};

TEST_F(PreflightShardsTest, AMalformedShardIsNamedWithItsOffset) {
  Shard("s_000.bin", 40);
  Shard("s_001.bin", 40);
  Shard("s_002.bin", 40, 0x12345678);
  const std::string bad = (temp_ / "d" / "s_002.bin").string();
  for (const std::string& train : {(temp_ / "d").string(), (temp_ / "d" / "s_*.bin").string()}) {
    ExpectRefusedEverywhere(train, "data.train: " + bad + ": bad magic 305419896 (0x12345678)",
                            "at offset 0");
  }
  // A header count that disagrees with the size.
  Shard("s_002.bin", 40);
  std::fstream f(temp_ / "d" / "s_001.bin", std::ios::in | std::ios::out | std::ios::binary);
  const int32_t count = 41;
  f.seekp(8);
  f.write(reinterpret_cast<const char*>(&count), 4);
  f.close();
  ExpectRefusedEverywhere((temp_ / "d").string(),
                          "data.train: " + (temp_ / "d" / "s_001.bin").string() +
                              ": the llm.c header says 41 tokens at offset 8",
                          "truncated");
}

TEST_F(PreflightShardsTest, AnEmptyGlobIsNamedAndAGoodOneValidates) {
  Shard("s_000.bin", 10);  // windows cross into the next shard: 10 < seq_len + 1
  Shard("s_001.bin", 30);
  const std::string none = (temp_ / "d" / "x_*.bin").string();
  ExpectRefusedEverywhere(none, "data.train: " + none + ": the glob matches no files", "wildcards");
  const CliResult r =
      Run({"validate", "-f", spec_, "--set", "data.train=" + (temp_ / "d" / "s_*.bin").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace meshrun
