// Keeps docs/cli.md's command table and each command's entry honest against `meshrun --help`
// (issue 39): the table under "## `meshrun`" lists exactly the subcommands the binary has; each
// subcommand's entry (**`meshrun NAME …`**, up to the next entry or section) names every flag the
// subcommand takes (or the shared options name it), and every flag that entry's synopsis or
// option table names is one the subcommand takes.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

using testing::CliResult;
using testing::RunCli;

// The long flags of a --help text's "Options:" (without --help and --version).
std::set<std::string> CommandTableHelpFlags(const std::string& help) {
  std::set<std::string> flags;
  const size_t options = help.find("Options:");
  if (options == std::string::npos) return flags;
  const size_t subcommands = help.find("Subcommands:", options);
  const std::string text = help.substr(
      options, subcommands == std::string::npos ? std::string::npos : subcommands - options);
  static const std::regex kLine(R"(^  (?:-[A-Za-z],)?(--[a-z][a-z0-9-]*))");
  for (const std::string& line : testing::Lines(text)) {
    std::smatch m;
    if (std::regex_search(line, m, kLine) && m[1] != "--help" && m[1] != "--version") {
      flags.insert(m[1]);
    }
  }
  return flags;
}

std::vector<std::string> CommandTableSubcommands(const std::string& help) {
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

// Every `--flag` written in `text`.
std::set<std::string> FlagsNamedIn(const std::string& text) {
  std::set<std::string> flags;
  static const std::regex kFlag(R"((--[a-z][a-z0-9-]*))");
  for (std::sregex_iterator it(text.begin(), text.end(), kFlag), end; it != end; ++it) {
    flags.insert((*it)[1]);
  }
  return flags;
}

class CliCommandTableDocTest : public testing::MeshrunBinaryTest {
 protected:
  void SetUp() override {
    testing::MeshrunBinaryTest::SetUp();
    doc_ = testing::ReadFile(source_ / "docs" / "cli.md");
    ASSERT_FALSE(doc_.empty()) << "cannot read docs/cli.md under " << source_;
    const size_t begin = doc_.find("\n## `meshrun`\n");
    ASSERT_NE(begin, std::string::npos) << "docs/cli.md has no section ## `meshrun`";
    const size_t end = doc_.find("\n## ", begin + 4);
    meshrun_section_ =
        doc_.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }

  std::string Help(const std::vector<std::string>& args) {
    std::vector<std::string> with_help = args;
    with_help.push_back("--help");
    const CliResult r = RunCli(binary_, with_help, temp_ / "help.err");
    EXPECT_EQ(r.exit_code, 0) << "meshrun --help: " << r.err;
    return r.out;
  }

  // The commands of the `| command | what it does |` table, in its order.
  std::vector<std::string> TableCommands() const {
    std::vector<std::string> commands;
    bool in_table = false;
    static const std::regex kRow(R"(^\| `([a-z][a-z0-9-]*)` \|)");
    for (const std::string& line : testing::Lines(meshrun_section_)) {
      if (line.rfind("| command |", 0) == 0) {
        in_table = true;
        continue;
      }
      if (!in_table) continue;
      if (line.rfind("|", 0) != 0) break;
      std::smatch m;
      if (std::regex_search(line, m, kRow)) commands.push_back(m[1]);
    }
    return commands;
  }

  // The entry of `meshrun NAME`: from its bold synopsis to the next entry or heading.
  std::string Entry(const std::string& name) const {
    const std::string marker = "**`meshrun " + name;
    size_t begin = std::string::npos;
    for (size_t at = meshrun_section_.find(marker); at != std::string::npos;
         at = meshrun_section_.find(marker, at + 1)) {
      const char next = meshrun_section_[at + marker.size()];
      if (next == ' ' || next == '`') {
        begin = at;
        break;
      }
    }
    if (begin == std::string::npos) return "";
    size_t end = meshrun_section_.find("\n**`meshrun ", begin + 1);
    for (const char* heading : {"\n## ", "\n### "}) {
      end = std::min(end, meshrun_section_.find(heading, begin + 1));
    }
    return meshrun_section_.substr(begin,
                                   end == std::string::npos ? std::string::npos : end - begin);
  }

  // The options every command of a kind shares, described once: the "Shared options:"
  // paragraph and the connection table of "### Commands that talk to a coordinator".
  std::string SharedOptionsText() const {
    std::string shared;
    const size_t paragraph = meshrun_section_.find("Shared options:");
    if (paragraph != std::string::npos) {
      shared +=
          meshrun_section_.substr(paragraph, meshrun_section_.find("\n\n", paragraph) - paragraph);
    }
    const size_t remote = meshrun_section_.find("### Commands that talk to a coordinator");
    if (remote != std::string::npos) {
      const size_t first_entry = meshrun_section_.find("\n**`meshrun ", remote);
      shared += meshrun_section_.substr(remote, first_entry - remote);
    }
    return shared;
  }

  std::string doc_, meshrun_section_;
};

TEST_F(CliCommandTableDocTest, TheTableListsExactlyTheCommands) {
  const std::vector<std::string> commands = CommandTableSubcommands(Help({}));
  ASSERT_GE(commands.size(), 10u) << "meshrun --help lists too few subcommands";
  const std::vector<std::string> table = TableCommands();
  ASSERT_FALSE(table.empty()) << "docs/cli.md has no `| command | what it does |` table";
  const std::set<std::string> real(commands.begin(), commands.end());
  const std::set<std::string> documented(table.begin(), table.end());
  for (const std::string& c : commands) {
    EXPECT_TRUE(documented.count(c))
        << "meshrun has the command " << c
        << ", which docs/cli.md's command table does not list (add a row | `" << c << "` | … |)";
  }
  for (const std::string& c : table) {
    EXPECT_TRUE(real.count(c)) << "docs/cli.md's command table lists " << c
                               << ", which is not a command of meshrun --help";
  }
  EXPECT_EQ(table.size(), documented.size()) << "a command is listed twice in the table";
}

TEST_F(CliCommandTableDocTest, EachEntryNamesTheFlagsOfItsCommandAndNoOthers) {
  const std::string shared = SharedOptionsText();
  ASSERT_FALSE(shared.empty()) << "docs/cli.md has no \"Shared options:\" paragraph";
  const std::set<std::string> shared_flags = FlagsNamedIn(shared);
  for (const std::string& command : CommandTableSubcommands(Help({}))) {
    const std::string entry = Entry(command);
    if (entry.empty()) {
      ADD_FAILURE() << "docs/cli.md has no entry **`meshrun " << command << " …`**";
      continue;
    }
    const std::set<std::string> flags = CommandTableHelpFlags(Help({command}));
    const std::set<std::string> in_entry = FlagsNamedIn(entry);
    for (const std::string& flag : flags) {
      EXPECT_TRUE(in_entry.count(flag) || shared_flags.count(flag))
          << "meshrun " << command << " takes " << flag << ", which its entry in docs/cli.md ("
          << "**`meshrun " << command << " …`**) does not name, nor the shared options";
    }
    // The synopsis (the bold first line) and the option table's first cells name only real
    // flags of this command.
    std::string declared = entry.substr(0, entry.find("**", 3) + 2);
    for (const std::string& line : testing::Lines(entry)) {
      if (line.rfind("| `-", 0) == 0 || line.rfind("| `CKPT", 0) == 0) {
        declared += "\n" + line.substr(0, line.find(" | ", 2));
      }
    }
    for (const std::string& flag : FlagsNamedIn(declared)) {
      EXPECT_TRUE(flags.count(flag))
          << "docs/cli.md's entry for meshrun " << command << " declares " << flag
          << ", which `meshrun " << command << " --help` does not list";
    }
  }
}

}  // namespace
}  // namespace meshrun
