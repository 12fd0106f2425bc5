// `meshrun completion bash|zsh` as the real binary: the script is valid bash, completes the
// commands and a command's flags, and refuses another shell with exit 2.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

using testing::CliResult;
using testing::RunCli;

class CompletionTest : public testing::MeshrunBinaryTest {
 protected:
  // Sources the bash script and prints what _meshrun offers for `words` (the last one typed).
  std::string Complete(const std::string& words, int cword) {
    const std::string script = (temp_ / "complete.sh").string();
    std::ofstream(script) << "source <(" << testing::ShellQuote(binary_.string())
                          << " completion bash)\nCOMP_WORDS=(" << words << ")\nCOMP_CWORD=" << cword
                          << "\n_meshrun\necho \"${COMPREPLY[*]}\"\n";
    return RunCli("/bin/bash", {script}, temp_ / "bash.err").out;
  }
};

TEST_F(CompletionTest, BashCompletesCommandsAndFlags) {
  const CliResult r = RunCli(binary_, {"completion", "bash"}, temp_ / "err.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("complete -o filenames -F _meshrun meshrun"), std::string::npos);
  EXPECT_EQ(Complete("meshrun su", 1), "submit\n");
  EXPECT_EQ(Complete("meshrun submit --dr", 2), "--dry-run\n");
  EXPECT_EQ(Complete("meshrun submit --wait", 2), "--wait-for-capacity\n");
  EXPECT_EQ(Complete("meshrun logs --ra", 2), "--rank\n");
}

TEST_F(CompletionTest, ZshLoadsTheBashFunctionAndOtherShellsAreRefused) {
  const CliResult zsh = RunCli(binary_, {"completion", "zsh"}, temp_ / "err.txt");
  ASSERT_EQ(zsh.exit_code, 0) << zsh.err;
  EXPECT_EQ(zsh.out.rfind("autoload -U +X bashcompinit && bashcompinit\n", 0), 0u);
  const CliResult fish = RunCli(binary_, {"completion", "fish"}, temp_ / "err.txt");
  EXPECT_EQ(fish.exit_code, 2);
  EXPECT_EQ(fish.err.rfind("error: completion: SHELL: fish not in {bash,zsh}", 0), 0u) << fish.err;
}

}  // namespace
}  // namespace meshrun
