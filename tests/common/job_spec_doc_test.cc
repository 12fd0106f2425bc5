// Keeps docs/job-spec.md honest: its field table lists exactly the fields of the spec parser
// (ForEachJobSpecField), each with the parser's type and default, and its minimal spec parses.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

struct DocRow {
  std::string type;          // int, int64, float, string or enum
  std::string default_text;  // inside the backticks; "(required)" without them
};

std::string ReadDoc() {
  const char* root = std::getenv("MESHRUN_SOURCE_DIR");
  const std::string path = std::string(root != nullptr ? root : ".") + "/docs/job-spec.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream row(line.substr(1));  // after the leading '|'
  for (std::string cell; std::getline(row, cell, '|');) {
    const size_t begin = cell.find_first_not_of(' '), end = cell.find_last_not_of(' ');
    cells.push_back(begin == std::string::npos ? "" : cell.substr(begin, end - begin + 1));
  }
  return cells;
}

std::string Unquote(const std::string& cell) {
  if (cell.size() >= 2 && cell.front() == '`' && cell.back() == '`') {
    return cell.substr(1, cell.size() - 2);
  }
  return cell;
}

// The rows of the table under "## Fields" whose first cell is a backticked field path.
std::map<std::string, DocRow> FieldTable(const std::string& doc) {
  std::map<std::string, DocRow> rows;
  std::stringstream lines(doc.substr(doc.find("\n## Fields\n")));
  bool in_table = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) == 0) {
      in_table = true;
      const std::vector<std::string> cells = Cells(line);
      EXPECT_GE(cells.size(), 3u) << line;
      if (cells.size() < 3) continue;
      const std::string path = Unquote(cells[0]);
      EXPECT_EQ(rows.count(path), 0u) << path << " is listed twice";
      rows[path] = {cells[1], Unquote(cells[2])};
    } else if (in_table && line.rfind("|", 0) != 0) {
      break;  // the end of the table
    }
  }
  return rows;
}

template <typename T>
std::string TypeName(std::string_view section, std::string_view key) {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, int>) return "int";
  if constexpr (std::is_same_v<T, int64_t>) return "int64";
  if constexpr (std::is_same_v<T, double>) return "float";
  if constexpr (std::is_same_v<T, std::vector<int>>) return "list of int";
  if constexpr (std::is_same_v<T, std::string>) {
    return AllowedValues(section, key).empty() ? "string" : "enum";
  }
  return "?";
}

TEST(JobSpecDocTest, FieldTableMatchesTheParser) {
  std::map<std::string, DocRow> rows = FieldTable(ReadDoc());
  ASSERT_FALSE(rows.empty()) << "no field table under '## Fields' in docs/job-spec.md";
  const JobSpec defaults;
  ForEachJobSpecField(defaults, [&](std::string_view section, std::string_view key,
                                    const auto& value) {
    const std::string path =
        section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
    const auto it = rows.find(path);
    if (it == rows.end()) {
      ADD_FAILURE() << path << " is a field of the parser but has no row in docs/job-spec.md";
      return;
    }
    using T = std::decay_t<decltype(value)>;
    const DocRow& row = it->second;
    EXPECT_EQ(row.type, TypeName<T>(section, key)) << path;
    if constexpr (std::is_same_v<T, std::string>) {
      const std::string doc_default =
          row.default_text == "(required)" || row.default_text == "\"\"" ? "" : row.default_text;
      EXPECT_EQ(doc_default, value) << path;
    } else {
      // The documented default, read as the YAML reader reads it, must be the parser's.
      StatusOr<JobSpec> parsed =
          ParseJobSpecYaml("data: {train: x}\n", {path + "=" + row.default_text});
      ASSERT_TRUE(parsed.ok()) << path << ": " << parsed.status().ToString();
      ForEachJobSpecField(*parsed, [&](std::string_view s, std::string_view k, const auto& v) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, T>) {
          if (s == section && k == key) {
            EXPECT_EQ(v, value) << path << " = " << row.default_text;
          }
        }
      });
    }
    rows.erase(it);
  });
  for (const auto& [path, row] : rows) {
    ADD_FAILURE() << path << " is in docs/job-spec.md but the parser has no such field";
  }
}

TEST(JobSpecDocTest, MinimalSpecParses) {
  const std::string doc = ReadDoc();
  const size_t section = doc.find("\n## The smallest spec\n");
  ASSERT_NE(section, std::string::npos);
  const size_t begin = doc.find("```yaml\n", section);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc.find("```", begin + 8);
  const std::string yaml = doc.substr(begin + 8, end - begin - 8);
  StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, {});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  JobSpec expected;
  expected.data.train = spec->data.train;
  EXPECT_FALSE(expected.data.train.empty());
  EXPECT_EQ(*spec, expected) << "the smallest spec sets more than data.train";
}

}  // namespace
}  // namespace meshrun
