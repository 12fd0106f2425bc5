// `meshrun generate` through the binary: a trained tiny model's greedy continuation is the same
// from its checkpoint and from its exported folder, equals the float64 PyTorch reference's
// (tests/reference/gpt2_reference.py generate), and sampling is reproducible by its seed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

using json = nlohmann::json;
using testing::CliResult;

class GenerateCommandTest : public testing::MeshrunBinaryTest {
 protected:
  CliResult Run(const std::vector<std::string>& args) {
    return testing::RunCli(binary_, args, temp_ / "stderr.txt", 300);
  }
  // Trains tiny for 40 steps and exports it; returns the checkpoint dir.
  std::string TrainAndExport() {
    const std::string ckpt = (temp_ / "ckpt").string();
    CliResult t = Run({"train", "-f", (source_ / "examples/tiny.yaml").string(), "--set",
                       "train.steps=40", "--set", "checkpoint.dir=" + ckpt, "--set", "data.val="});
    EXPECT_EQ(t.exit_code, 0) << t.err;
    CliResult e = Run({"export", ckpt, "-o", (temp_ / "hf").string()});
    EXPECT_EQ(e.exit_code, 0) << e.err;
    return ckpt;
  }
  std::vector<int> Tokens(const CliResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    if (j.is_discarded()) return {};
    return j["tokens"].get<std::vector<int>>();
  }
};

TEST_F(GenerateCommandTest, GreedyFromCheckpointAndExportAgreeWithTheReference) {
  const std::string ckpt = TrainAndExport();
  const std::vector<std::string> common = {"--prompt", "The ", "--max-new-tokens",
                                           "24",       "-o",   "json"};
  std::vector<std::string> a = {"generate", "--checkpoint", ckpt};
  std::vector<std::string> b = {"generate", "--model", (temp_ / "hf").string()};
  a.insert(a.end(), common.begin(), common.end());
  b.insert(b.end(), common.begin(), common.end());
  const std::vector<int> from_ckpt = Tokens(Run(a)), from_export = Tokens(Run(b));
  ASSERT_EQ(from_ckpt.size(), 24u);
  EXPECT_EQ(from_ckpt, from_export);
  for (int t : from_ckpt) EXPECT_LT(t, 256);

  std::string why;
  const std::filesystem::path python = testing::ModelVenvPython(source_, &why);
  if (python.empty()) GTEST_SKIP() << why;
  CliResult ref = testing::RunCli(
      python,
      {(source_ / "tests/reference/gpt2_reference.py").string(), "generate", "--model",
       (temp_ / "hf").string(), "--prompt", "The ", "--max-new-tokens", "24"},
      temp_ / "ref.err", 300);
  EXPECT_EQ(Tokens(ref), from_ckpt);
}

TEST_F(GenerateCommandTest, SamplingIsReproducibleAndFlagsAreChecked) {
  const std::string ckpt = TrainAndExport();
  auto sample = [&](const char* seed) {
    return Tokens(
        Run({"generate", "--checkpoint", ckpt, "--prompt", "A", "--temperature", "1.0", "--top-k",
             "40", "--top-p", "0.9", "--seed", seed, "--max-new-tokens", "32", "-o", "json"}));
  };
  const std::vector<int> one = sample("7");
  ASSERT_EQ(one.size(), 32u);
  EXPECT_EQ(sample("7"), one);
  EXPECT_NE(sample("8"), one);
  CliResult both =
      Run({"generate", "--checkpoint", ckpt, "--model", (temp_ / "hf").string(), "--prompt", "x"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--model/--checkpoint: give exactly one"), std::string::npos) << both.err;
  CliResult none = Run({"generate", "--checkpoint", (temp_ / "nothing").string(), "--prompt", "x"});
  EXPECT_EQ(none.exit_code, 2) << none.err;
}

}  // namespace
}  // namespace meshrun
