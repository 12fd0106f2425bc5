// Keeps the "complete spec" example of docs/job-spec.md honest against the parser's field table
// (ForEachJobSpecField): every field the parser accepts appears in it, in the table's order,
// with the parser's default, and nothing else does. A field added to the parser without the
// example fails here with the exact line to add.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
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

std::string ReadJobSpecDoc() {
  const char* root = std::getenv("MESHRUN_SOURCE_DIR");
  const std::string path = std::string(root != nullptr ? root : ".") + "/docs/job-spec.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

constexpr const char* kCompleteSpecIntro = "The complete spec with every field at its default";

// The YAML block after the sentence that introduces the complete spec ("" when missing).
std::string CompleteSpecBlock(const std::string& doc) {
  const size_t intro = doc.find(kCompleteSpecIntro);
  if (intro == std::string::npos) return "";
  const size_t begin = doc.find("```yaml\n", intro);
  if (begin == std::string::npos) return "";
  const size_t end = doc.find("\n```", begin + 8);
  if (end == std::string::npos) return "";
  return doc.substr(begin + 8, end + 1 - begin - 8);
}

// A default as it is written in YAML: strings as they are ("" for the empty one), numbers in
// their shortest round-trip form, bools as true/false.
template <typename T>
std::string YamlText(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value.empty() ? "\"\"" : value;
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    return "null";  // the one list field (parallelism.pp_layers) defaults to null
  } else {
    char buf[64];
    const auto result = std::to_chars(buf, buf + sizeof(buf), value);
    return std::string(buf, result.ptr);
  }
}

struct ParserField {
  std::string path;       // "model.rope_scaling.type"
  std::string section;    // "model" ("" for name)
  std::string key;        // "rope_scaling.type"
  std::string yaml_text;  // its default, as YAML
};

std::vector<ParserField> ParserFields(const JobSpec& spec) {
  std::vector<ParserField> fields;
  ForEachJobSpecField(spec, [&](std::string_view section, std::string_view key, const auto& value) {
    const std::string path =
        section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
    fields.push_back({path, std::string(section), std::string(key), YamlText(value)});
  });
  return fields;
}

// The leaves of a YAML tree as dotted paths, in document order, with their scalar text.
void Leaves(const YAML::Node& node, const std::string& prefix,
            std::vector<std::pair<std::string, std::string>>* out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      Leaves(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else {
    out->push_back({prefix, node.IsScalar() ? node.Scalar()
                            : node.IsNull() ? std::string("null")
                                            : std::string("(not a scalar)")});
  }
}

// "add `n_kv_head: 0` to its `model:` mapping, after `init_from`": where a missing field goes.
std::string WhereToAdd(const ParserField& field, const std::string& previous_in_section) {
  const size_t dot = field.key.find('.');
  std::string hint = "add `" + field.key.substr(dot == std::string::npos ? 0 : dot + 1) + ": " +
                     field.yaml_text + "`";
  if (dot != std::string::npos) {
    hint +=
        " to the `" + field.key.substr(0, dot) + ": {…}` mapping inside `" + field.section + ":`";
  } else if (!field.section.empty()) {
    hint += " to its `" + field.section + ":` mapping";
  } else {
    hint += " at the top level";
  }
  if (!previous_in_section.empty()) hint += ", after `" + previous_in_section + "`";
  return hint;
}

TEST(JobSpecCompleteDocTest, EveryParserFieldAppearsWithItsDefaultInTableOrder) {
  const std::string block = CompleteSpecBlock(ReadJobSpecDoc());
  ASSERT_FALSE(block.empty()) << "docs/job-spec.md has no ```yaml block after \""
                              << kCompleteSpecIntro << "\"";
  YAML::Node tree;
  try {
    tree = YAML::Load(block);
  } catch (const std::exception& e) {
    FAIL() << "docs/job-spec.md's complete spec is not YAML: " << e.what() << "\n" << block;
  }
  std::vector<std::pair<std::string, std::string>> leaves;
  Leaves(tree, "", &leaves);
  std::map<std::string, size_t> doc_index;  // path -> position in the example
  for (size_t i = 0; i < leaves.size(); ++i) doc_index[leaves[i].first] = i;

  const std::vector<ParserField> fields = ParserFields(JobSpec{});
  std::map<std::string, const ParserField*> by_path;
  for (const ParserField& f : fields) by_path[f.path] = &f;

  // Missing fields, each with the line to add.
  std::string previous_section, previous_key;
  for (const ParserField& f : fields) {
    if (f.section != previous_section) previous_key.clear();
    if (doc_index.count(f.path) == 0) {
      ADD_FAILURE() << "docs/job-spec.md's complete spec has no " << f.path
                    << ", a field of the parser (ForEachJobSpecField) with default " << f.yaml_text
                    << ": " << WhereToAdd(f, previous_key);
    }
    previous_section = f.section;
    previous_key = f.key;
  }
  // Fields the parser does not have.
  for (const auto& [path, text] : leaves) {
    EXPECT_TRUE(by_path.count(path))
        << "docs/job-spec.md's complete spec names " << path << " (" << text
        << "), which is not a field of the parser: remove it or fix its name";
  }
  // Order: the example reads like `meshrun validate` prints the table.
  size_t last = 0;
  std::string last_path;
  for (const ParserField& f : fields) {
    const auto it = doc_index.find(f.path);
    if (it == doc_index.end()) continue;
    EXPECT_TRUE(last_path.empty() || it->second > last)
        << "docs/job-spec.md's complete spec lists " << f.path << " before " << last_path
        << "; the parser's table (and `meshrun validate`) has it after";
    last = it->second;
    last_path = f.path;
  }
  // Values: each documented default, read as the YAML reader reads it, is the parser's.
  for (const auto& [path, text] : leaves) {
    const auto field = by_path.find(path);
    if (field == by_path.end() || path == "data.train") continue;  // data.train: PATH
    StatusOr<JobSpec> parsed = ParseJobSpecYaml("data: {train: x}\n", {path + "=" + text});
    if (!parsed.ok()) {
      ADD_FAILURE() << "docs/job-spec.md's complete spec: " << path << ": " << text
                    << " does not parse: " << parsed.status().ToString();
      continue;
    }
    for (const ParserField& got : ParserFields(*parsed)) {
      if (got.path == path) {
        EXPECT_EQ(got.yaml_text, field->second->yaml_text)
            << "docs/job-spec.md's complete spec says " << path << ": " << text
            << ", but the parser's default is " << field->second->yaml_text;
      }
    }
  }
}

// The example as a whole is a spec the reader accepts (its placeholder path replaced), and reads
// as the defaults.
TEST(JobSpecCompleteDocTest, CompleteSpecParsesToTheDefaults) {
  std::string block = CompleteSpecBlock(ReadJobSpecDoc());
  ASSERT_FALSE(block.empty());
  const size_t placeholder = block.find("train: PATH");
  ASSERT_NE(placeholder, std::string::npos) << "the example names data.train as `train: PATH`";
  block.replace(placeholder, 11, "train: corpus.txt");
  StatusOr<JobSpec> spec = ParseJobSpecYaml(block, {});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << block;
  JobSpec expected;
  expected.data.train = "corpus.txt";
  EXPECT_EQ(*spec, expected) << "docs/job-spec.md's complete spec is not the parser's defaults";
}

}  // namespace
}  // namespace meshrun
