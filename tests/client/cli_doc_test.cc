// Keeps docs/cli.md honest against the built binaries' own --help: every subcommand of `meshrun`
// has its entry (**`meshrun NAME …`**) and every flag it takes is named on the page; every flag
// of meshrun-coordinator and meshrun-worker has a row in its table, with the default --help shows.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

using testing::CliResult;
using testing::ReadFile;
using testing::RunCli;

class CliDocTest : public testing::MeshrunBinaryTest {
 protected:
  void SetUp() override {
    testing::MeshrunBinaryTest::SetUp();
    doc_ = ReadFile(source_ / "docs" / "cli.md");
    ASSERT_FALSE(doc_.empty()) << "cannot read docs/cli.md under " << source_;
  }

  std::string Help(const std::filesystem::path& binary, std::vector<std::string> args) {
    args.push_back("--help");
    const CliResult r = RunCli(binary, args, temp_ / "help.err");
    EXPECT_EQ(r.exit_code, 0) << binary << " --help: " << r.err;
    return r.out;
  }

  // The text of the "## `NAME`" section of docs/cli.md (to the next "## ").
  std::string Section(const std::string& name) const {
    const size_t begin = doc_.find("\n## `" + name + "`\n");
    if (begin == std::string::npos) return "";
    const size_t end = doc_.find("\n## ", begin + 4);
    return doc_.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }

  std::string doc_;
};

// The long flags --help lists (after "Options:"), without --help and --version; with the default
// CLI11 prints after '=' (e.g. "--heartbeat-timeout FLOAT=10"), or "" when it prints none.
std::map<std::string, std::string> Flags(const std::string& help) {
  std::map<std::string, std::string> flags;
  const size_t options = help.find("Options:");
  const size_t subcommands = help.find("Subcommands:");
  if (options == std::string::npos) return flags;
  const std::string text = help.substr(
      options, subcommands == std::string::npos ? std::string::npos : subcommands - options);
  // A flag line: two spaces, an optional short name, the long name, its type and default.
  static const std::regex kLine(R"(^  (?:-[A-Za-z],)?(--[a-z][a-z0-9-]*)(\s+\S+)?)");
  for (const std::string& line : testing::Lines(text)) {
    std::smatch m;
    if (!std::regex_search(line, m, kLine)) continue;
    const std::string flag = m[1];
    if (flag == "--help" || flag == "--version") continue;
    std::string type = m[2].matched ? std::string(m[2]) : "";
    const size_t eq = type.find('=');
    flags[flag] = eq == std::string::npos ? "" : type.substr(eq + 1);
  }
  return flags;
}

// The subcommand names under "Subcommands:".
std::vector<std::string> Subcommands(const std::string& help) {
  std::vector<std::string> names;
  const size_t at = help.find("Subcommands:");
  if (at == std::string::npos) return names;
  static const std::regex kLine(R"(^  ([a-z][a-z0-9-]*)\s)");
  for (const std::string& line : testing::Lines(help.substr(at))) {
    std::smatch m;
    if (std::regex_search(line, m, kLine)) names.push_back(m[1]);
  }
  return names;
}

TEST_F(CliDocTest, EveryCommandAndFlagOfMeshrunIsDocumented) {
  const std::vector<std::string> commands = Subcommands(Help(binary_, {}));
  ASSERT_GE(commands.size(), 10u) << "meshrun --help lists too few subcommands";
  for (const std::string& command : commands) {
    EXPECT_NE(doc_.find("**`meshrun " + command), std::string::npos)
        << "docs/cli.md has no entry **`meshrun " << command << " …`** for the subcommand "
        << command;
    for (const auto& [flag, default_text] : Flags(Help(binary_, {command}))) {
      EXPECT_NE(doc_.find(flag), std::string::npos)
          << "meshrun " << command << " takes " << flag << ", which docs/cli.md never names";
    }
  }
}

// Every option of a daemon has a row `| `--flag …` | default | … |` in the table of its section.
void ExpectTableCoversFlags(const std::string& daemon, const std::string& section,
                            const std::map<std::string, std::string>& flags) {
  ASSERT_FALSE(section.empty()) << "docs/cli.md has no section ## `" << daemon << "`";
  std::map<std::string, std::string> rows;  // flag -> its row
  static const std::regex kFlag(R"(`(--[a-z][a-z0-9-]*))");
  for (const std::string& line : testing::Lines(section)) {
    if (line.rfind("| `--", 0) != 0) continue;
    const std::string first_cell = line.substr(0, line.find('|', 1));
    for (std::sregex_iterator it(first_cell.begin(), first_cell.end(), kFlag), end; it != end;
         ++it) {
      rows[(*it)[1]] = line;
    }
  }
  ASSERT_GE(flags.size(), 5u) << daemon << " --help lists too few flags";
  for (const auto& [flag, default_text] : flags) {
    auto row = rows.find(flag);
    if (row == rows.end()) {
      ADD_FAILURE() << daemon << " takes " << flag << ", which has no row in docs/cli.md's "
                    << daemon << " table";
      continue;
    }
    if (!default_text.empty()) {
      EXPECT_NE(row->second.find(default_text), std::string::npos)
          << daemon << " " << flag << " defaults to " << default_text
          << " but its row in docs/cli.md says otherwise: " << row->second;
    }
  }
}

TEST_F(CliDocTest, EveryFlagOfTheDaemonsHasARowWithItsDefault) {
  const std::filesystem::path bin = binary_.parent_path();
  for (const std::string daemon : {"meshrun-coordinator", "meshrun-worker"}) {
    ASSERT_TRUE(std::filesystem::exists(bin / daemon)) << bin / daemon;
    ExpectTableCoversFlags(daemon, Section(daemon), Flags(Help(bin / daemon, {})));
  }
}

}  // namespace
}  // namespace meshrun
