// Runs `meshrun validate` as a real process ($MESHRUN_BINARY_DIR/bin/meshrun) and checks exit
// codes (0 ok, 2 invalid input), the mesh table, the JSON shape, and that every invalid spec
// gives exactly one `error: <field>: ...` line on stderr.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace {

namespace fs = std::filesystem;

using meshrun::testing::CliResult;
using meshrun::testing::Lines;
using meshrun::testing::RunCli;
using Result = CliResult;

class ValidateCommandTest : public meshrun::testing::MeshrunBinaryTest {
 protected:
  // Runs meshrun with `args`; stdout through a pipe, stderr through a file. Bounded by
  // `timeout` (coreutils) so a hung binary fails the test instead of blocking it.
  Result Run(const std::vector<std::string>& args) {
    return RunCli(binary_, args, temp_ / "stderr.txt");
  }

  std::string Example(const std::string& name) { return (source_ / "examples" / name).string(); }

  // Writes `text` as a spec file in the temp dir and returns its path.
  std::string WriteSpec(const std::string& name, const std::string& text) {
    const fs::path path = temp_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  // Expects exit 2 and exactly one stderr line starting with `error: <prefix>`.
  void ExpectInvalid(const Result& result, const std::string& prefix,
                     const std::string& contains = "") {
    EXPECT_EQ(result.exit_code, 2) << result.err;
    const std::vector<std::string> lines = Lines(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_EQ(lines[0].rfind("error: " + prefix, 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(contains), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find("(hint: "), std::string::npos) << lines[0];
    EXPECT_EQ(result.out, "");
  }
};

// A valid spec in block style; the bad specs below each change one thing.
const std::string kGood = R"(name: good
model:
  n_layer: 2
  n_head: 4
  d_model: 64
  seq_len: 64
parallelism:
  dp_shard_size: 2
  tp_size: 2
train:
  steps: 10
  global_batch_size: 8
  micro_batch_size: 2
data:
  train: /usr/share/games/fortunes/cookie
)";

std::string With(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST_F(ValidateCommandTest, TinyExampleValidatesAndPrintsTheMesh) {
  const Result result = Run({"validate", "-f", Example("tiny.yaml")});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_NE(result.out.find("name: tiny\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("  train: /usr/share/games/fortunes/cookie\n"), std::string::npos);
  EXPECT_NE(result.out.find("rank  dp_replicate  dp_shard  cp  tp\n"), std::string::npos);
  EXPECT_TRUE(std::regex_search(result.out, std::regex(R"(\n\s+0\s+0\s+0\s+0\s+0\n$)")))
      << result.out;
}

TEST_F(ValidateCommandTest, MiniExampleValidates) {
  const Result result = Run({"validate", "-f", Example("mini.yaml"), "--nproc", "1"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("name: mini\n"), std::string::npos) << result.out;
}

TEST_F(ValidateCommandTest, OverridesShapeTheMeshTable) {
  const Result result =
      Run({"validate", "-f", Example("tiny.yaml"), "--set", "parallelism.dp_shard_size=2", "--set",
           "parallelism.tp_size=2", "--nproc", "4"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = Lines(result.out);
  const auto header = std::find(lines.begin(), lines.end(), "rank  dp_replicate  dp_shard  cp  tp");
  ASSERT_NE(header, lines.end()) << result.out;
  ASSERT_EQ(lines.end() - header, 5);  // header + 4 ranks
  // rank = ((r·S + s)·C + c)·T + t with S = 2, T = 2.
  const char* expected[] = {"0 0 0 0 0", "1 0 0 0 1", "2 0 1 0 0", "3 0 1 0 1"};
  for (int rank = 0; rank < 4; ++rank) {
    std::istringstream row(header[rank + 1]);
    std::string joined, value;
    while (row >> value) joined += (joined.empty() ? "" : " ") + value;
    EXPECT_EQ(joined, expected[rank]);
  }
}

TEST_F(ValidateCommandTest, JsonOutputIsOneDocumentWithSpecMeshAndRanks) {
  const Result result = Run({"validate", "-f", Example("tiny.yaml"), "-o", "json", "--set",
                             "parallelism.cp_size=2", "--set", "parallelism.dp_replicate_size=2"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);  // nothing else on stdout
  EXPECT_EQ(json["spec"]["name"], "tiny");
  EXPECT_EQ(json["spec"]["parallelism"]["cp_size"], 2);
  EXPECT_DOUBLE_EQ(json["spec"]["train"]["lr"].get<double>(), 1e-3);
  EXPECT_EQ(json["mesh"],
            (nlohmann::json{
                {"dp_replicate", 2}, {"dp_shard", 1}, {"cp", 2}, {"tp", 1}, {"world_size", 4}}));
  ASSERT_EQ(json["ranks"].size(), 4u);
  EXPECT_EQ(json["ranks"][3]["rank"], 3);
  EXPECT_EQ(json["ranks"][3]["coords"],
            (nlohmann::json{{"dp_replicate", 1}, {"dp_shard", 0}, {"cp", 1}, {"tp", 0}}));
}

TEST_F(ValidateCommandTest, GoodSpecPasses) {
  EXPECT_EQ(Run({"validate", "-f", WriteSpec("good.yaml", kGood)}).exit_code, 0);
}

TEST_F(ValidateCommandTest, NHeadNotDivisibleByTp) {
  const std::string spec = WriteSpec(
      "bad.yaml", With(With(kGood, "n_head: 4", "n_head: 6"), "d_model: 64", "d_model: 96"));
  ExpectInvalid(Run({"validate", "-f", spec, "--set", "parallelism.tp_size=4"}),
                "parallelism.tp_size: model.n_head(6) is not divisible by tp_size(4)",
                "such as 2 or 3");
}

TEST_F(ValidateCommandTest, SeqLenNotDivisibleByTwiceCp) {
  const std::string spec = WriteSpec(
      "bad.yaml", With(With(kGood, "seq_len: 64", "seq_len: 100"), "tp_size: 2", "cp_size: 4"));
  ExpectInvalid(Run({"validate", "-f", spec}), "model.seq_len: 100 is not divisible by 2·cp_size",
                "(line 6)");
}

TEST_F(ValidateCommandTest, GlobalBatchNotDivisibleByDpTimesMicroBatch) {
  const std::string spec =
      WriteSpec("bad.yaml", With(kGood, "global_batch_size: 8", "global_batch_size: 10"));
  ExpectInvalid(Run({"validate", "-f", spec}), "train.global_batch_size: 10 is not divisible",
                "micro_batch_size(2) = 4");
}

TEST_F(ValidateCommandTest, UnknownFieldSuggestsTheRealOne) {
  const std::string spec = WriteSpec("bad.yaml", With(kGood, "tp_size: 2", "tp_sz: 2"));
  ExpectInvalid(Run({"validate", "-f", spec}), "parallelism.tp_sz: unknown field (line 9)",
                "(hint: did you mean 'tp_size'?)");
}

TEST_F(ValidateCommandTest, SizesBelowOne) {
  ExpectInvalid(
      Run({"validate", "-f", WriteSpec("zero.yaml", With(kGood, "tp_size: 2", "tp_size: 0"))}),
      "parallelism.tp_size: must be at least 1, got 0");
  ExpectInvalid(
      Run({"validate", "-f",
           WriteSpec("negative.yaml", With(kGood, "dp_shard_size: 2", "dp_shard_size: -1"))}),
      "parallelism.dp_shard_size: must be at least 1, got -1");
}

TEST_F(ValidateCommandTest, StringWhereANumberBelongs) {
  const std::string spec = WriteSpec("bad.yaml", With(kGood, "steps: 10", "steps: ten"));
  ExpectInvalid(Run({"validate", "-f", spec}),
                "train.steps: expected an integer, got 'ten' (line 11)");
}

TEST_F(ValidateCommandTest, MalformedYamlNamesTheLine) {
  const std::string spec = WriteSpec("bad.yaml", With(kGood, "  d_model: 64", " d_model: 64"));
  ExpectInvalid(Run({"validate", "-f", spec}), spec + ": malformed YAML at line 5:");
}

TEST_F(ValidateCommandTest, WorldSizeMustMatchNproc) {
  ExpectInvalid(Run({"validate", "-f", WriteSpec("good.yaml", kGood), "--nproc", "8"}),
                "parallelism: ", "world size 4 but --nproc is 8");
}

TEST_F(ValidateCommandTest, BadFlagsAndArgumentsExitTwo) {
  const std::string tiny = Example("tiny.yaml");
  ExpectInvalid(Run({"validate"}), "--file: ");
  ExpectInvalid(Run({"validate", "-f", tiny, "--bogus"}), "--bogus: unexpected argument");
  ExpectInvalid(Run({"validate", "-f", tiny, "-o", "xml"}), "--output: ");
  ExpectInvalid(Run({"validate", "-f", tiny, "--nproc", "zero"}), "--nproc: ");
  ExpectInvalid(Run({"validate", "-f", tiny, "--set", "train.steps"}),
                "--set train.steps: expected KEY=VALUE");
  ExpectInvalid(Run({"validate", "-f", tiny, "--set", "parallelism.tp_sz=2"}),
                "--set parallelism.tp_sz: unknown field", "did you mean 'tp_size'?");
  ExpectInvalid(Run({"validate", "-f", (temp_ / "missing.yaml").string()}),
                (temp_ / "missing.yaml").string() + ": cannot read the job spec");
  ExpectInvalid(Run({}), "meshrun: a command is required");
  ExpectInvalid(Run({"frobnicate"}), "frobnicate: unknown command");
}

TEST_F(ValidateCommandTest, NumericFlagsAreExplainedInWholeNumbers) {
  const std::string tiny = Example("tiny.yaml");
  ExpectInvalid(Run({"validate", "-f", tiny, "--nproc", "abc"}),
                "--nproc: 'abc' is not a whole number from 1 to ");
  ExpectInvalid(Run({"train", "-f", tiny, "--nproc", "abc"}),
                "--nproc: 'abc' is not a whole number from 1 to 4096 (hint: run 'meshrun train "
                "--help')");
  ExpectInvalid(Run({"train", "-f", tiny, "--nproc", "5000"}),
                "--nproc: 5000 is out of range: a whole number from 1 to 4096");
  // CLI11's own check printed the double range 0 … 1.8e308 with all 309 digits.
  ExpectInvalid(Run({"train", "-f", tiny, "--stop-after", "0"}),
                "--stop-after: 0 is out of range: a whole number 1 or more (hint: ");
  ExpectInvalid(Run({"train", "-f", tiny, "--stop-after", "1.5"}),
                "--stop-after: '1.5' is not a whole number 1 or more");
  ExpectInvalid(Run({"up", "--workers", "0"}),
                "--workers: 0 is out of range: a whole number from "
                "1 to 64");
}

TEST_F(ValidateCommandTest, VersionNamesTheCommitAndBuildOptions) {
  const Result result = Run({"--version"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.out.find("(commit "), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("cuda="), std::string::npos) << result.out;
}

TEST_F(ValidateCommandTest, UpOnAPortInUseIsInvalidInput) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  ExpectInvalid(Run({"up", "--port", port}),
                "--port: 127.0.0.1:" + port + " is already in use (hint: ");
  close(fd);
  ExpectInvalid(Run({"up", "--port", "99999"}), "--port: 99999 is out of range");
}

TEST_F(ValidateCommandTest, HelpExitsZero) {
  const Result result = Run({"validate", "--help"});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.out.find("--set"), std::string::npos) << result.out;
}

}  // namespace
