// The YAML side of the job spec: yaml-cpp tree -> --set overrides -> JobSpec -> ValidateJobSpec,
// and JobSpec -> YAML. All field knowledge comes from ForEachJobSpecField; this file only knows
// how to read and write YAML and how to word an error.
#include "common/job_spec_yaml.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "common/hf_config.h"

namespace meshrun {
namespace {

// A spec is a page of text; anything larger is not one (and would only feed the parser).
constexpr size_t kMaxSpecBytes = 1 << 20;

std::string PathOf(std::string_view section, std::string_view key) {
  return section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
}

bool IsSection(const std::string& name) {
  const auto& sections = JobSpecSections();
  return std::find(sections.begin(), sections.end(), name) != sections.end();
}

bool IsKnownPath(std::string_view section, const std::string& key) {
  const std::vector<std::string> keys = JobSpecKeys(section);
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// The keys after "group." of the fields "group.*" of a section (empty when it has none).
std::vector<std::string> GroupKeys(std::string_view section, const std::string& group) {
  std::vector<std::string> out;
  for (const std::string& key : JobSpecKeys(section)) {
    if (key.size() > group.size() && key.compare(0, group.size(), group) == 0 &&
        key[group.size()] == '.') {
      out.push_back(key.substr(group.size() + 1));
    }
  }
  return out;
}

bool IsGroup(std::string_view section, const std::string& key) {
  return !GroupKeys(section, key).empty();
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Levenshtein distance, case-insensitive.
size_t EditDistance(std::string_view a_in, std::string_view b_in) {
  const std::string a = Lower(a_in), b = Lower(b_in);
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate a user most likely meant by `word`, or "" when none is close.
std::string ClosestName(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    const size_t distance = EditDistance(word, c);
    const bool prefix = word.size() >= 3 && (Lower(c).rfind(Lower(word), 0) == 0 ||
                                             Lower(word).rfind(Lower(c), 0) == 0);
    const bool close = distance < word.size() && (distance <= 2 || distance <= word.size() / 3);
    if ((close || prefix) && distance < best_distance) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
}

std::string JoinQuoted(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "'" : ", '") + item + "'";
  return out;
}

std::vector<std::string> TopLevelKeys() {
  std::vector<std::string> keys = JobSpecKeys("");
  for (const std::string& s : JobSpecSections()) keys.push_back(s);
  return keys;
}

// The hint for an unknown `key` in `section` ("" = top level).
std::string UnknownFieldHint(const std::string& section, const std::string& key) {
  std::vector<std::string> here;  // "rope_scaling.factor" and its siblings as "rope_scaling"
  for (const std::string& k : section.empty() ? TopLevelKeys() : JobSpecKeys(section)) {
    const std::string name = k.substr(0, k.find('.'));
    if (std::find(here.begin(), here.end(), name) == here.end()) here.push_back(name);
  }
  if (std::string best = ClosestName(key, here); !best.empty()) {
    return "did you mean '" + best + "'?";
  }
  for (const std::string& other : JobSpecSections()) {
    if (other != section && IsKnownPath(other, key)) {
      return "did you mean '" + other + "." + key + "'? " + key + " belongs under '" + other + ":'";
    }
  }
  return section.empty() ? "the top level holds " + JoinQuoted(here)
                         : "the fields of " + section + " are " + JoinQuoted(here);
}

// The hint for an unknown --set path.
std::string UnknownOverrideHint(const std::vector<std::string>& parts) {
  if (parts.size() == 2 && IsSection(parts[0])) return UnknownFieldHint(parts[0], parts[1]);
  if (parts.size() == 1) return UnknownFieldHint("", parts[0]);
  if (parts.size() == 2) {
    const std::string section = ClosestName(parts[0], JobSpecSections());
    if (!section.empty() && IsKnownPath(section, parts[1])) {
      return "did you mean '" + section + "." + parts[1] + "'?";
    }
    if (!section.empty()) return "did you mean section '" + section + "'?";
  }
  return "use a dotted path such as parallelism.tp_size or name";
}

std::string LineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.line >= 0 ? " (line " + std::to_string(mark.line + 1) + ")" : "";
}

// What a node holds, for "expected X, got Y".
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return QuoteForMessage(node.Scalar());
    default: return "nothing";
  }
}

Status FieldError(const std::string& path, const std::string& what, const std::string& where,
                  const std::string& hint) {
  return InvalidArgumentError(EscapeForMessage(path) + ": " + what + where + " (hint: " + hint +
                              ")");
}

template <typename T>
bool ParseNumber(std::string_view text, T& out, bool& out_of_range) {
  out_of_range = false;
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  if (text.empty() || text[0] == '+' || std::isspace(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  T value{};
  std::from_chars_result result;
  if constexpr (std::is_floating_point_v<T>) {
    result =
        std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::general);
  } else {
    result = std::from_chars(text.data(), text.data() + text.size(), value);
  }
  if (result.ec == std::errc::result_out_of_range) out_of_range = true;
  if (result.ec != std::errc() || result.ptr != text.data() + text.size()) return false;
  out = value;
  return true;
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round trip
  std::string s(buf, result.ptr);
  // Keep it visibly a float for human readers and other YAML tools: 1 -> 1.0, 1e-08 -> 1.0e-08.
  if (s.find_first_of(".e") == std::string::npos) {
    s += ".0";
  } else if (s.find('.') == std::string::npos) {
    s.insert(s.find('e'), ".0");
  }
  return s;
}

// The default of a field as written in YAML, for "e.g." hints.
std::string DefaultText(std::string_view section, std::string_view key) {
  std::string text;
  const JobSpec defaults;
  ForEachJobSpecField(defaults, [&](std::string_view s, std::string_view k, const auto& value) {
    if (s != section || k != key) return;
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::string>) {
      text = value;
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      text = "null";  // the one list field (parallelism.pp_layers) defaults to null
    } else if constexpr (std::is_same_v<T, bool>) {
      text = value ? "true" : "false";
    } else if constexpr (std::is_floating_point_v<T>) {
      text = FormatDouble(value);
    } else {
      text = std::to_string(value);
    }
  });
  return text;
}

// Reads one YAML value into a field; `where` is " (line N)" or " (from --set)".
template <typename T>
Status ReadValue(const YAML::Node& node, std::string_view section, std::string_view key,
                 const std::string& where, T& out) {
  const std::string path = PathOf(section, key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (node.IsNull()) {
      out.clear();  // `val:` with nothing after it
      return OkStatus();
    }
    if (node.IsScalar()) {
      out = node.Scalar();
      return OkStatus();
    }
    const std::vector<std::string> allowed = AllowedValues(section, key);
    return FieldError(path, "expected a string, got " + Describe(node), where,
                      allowed.empty() ? "write a single value, e.g. " + std::string(key) + ": ..."
                                      : "use one of " + JoinQuoted(allowed));
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    // A list of integers (parallelism.pp_layers); null or [] leaves it empty.
    const std::string hint =
        "write a list of whole numbers, e.g. " + std::string(key) + ": [3, 3], or null";
    if (node.IsNull()) {
      out.clear();
      return OkStatus();
    }
    if (!node.IsSequence()) {
      return FieldError(path, "expected a list of integers, got " + Describe(node), where, hint);
    }
    if (node.size() > 4096) {
      return FieldError(path, "lists " + std::to_string(node.size()) + " entries, over 4096", where,
                        hint);
    }
    std::vector<int> values;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      int v = 0;
      bool out_of_range = false;
      if (!item.IsScalar() || !ParseNumber(item.Scalar(), v, out_of_range)) {
        return FieldError(path + "[" + std::to_string(i) + "]",
                          "expected an integer, got " + Describe(item), where, hint);
      }
      values.push_back(v);
    }
    out = std::move(values);
    return OkStatus();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (node.IsScalar()) {
      const std::string& v = node.Scalar();
      if (v == "true" || v == "True" || v == "TRUE") {
        out = true;
        return OkStatus();
      }
      if (v == "false" || v == "False" || v == "FALSE") {
        out = false;
        return OkStatus();
      }
    }
    return FieldError(path, "expected true or false, got " + Describe(node), where,
                      "write " + std::string(key) + ": true or " + std::string(key) + ": false");
  } else {
    constexpr bool kIsInt = std::is_integral_v<T>;
    const std::string expected = kIsInt ? "an integer" : "a number";
    const std::string hint = std::string(kIsInt ? "write a whole number" : "write a number") +
                             ", e.g. " + std::string(key) + ": " + DefaultText(section, key);
    bool out_of_range = false;
    if (node.IsScalar() && ParseNumber(node.Scalar(), out, out_of_range)) return OkStatus();
    if (out_of_range) {
      return FieldError(path, Describe(node) + " is out of range", where, hint);
    }
    return FieldError(path, "expected " + expected + ", got " + Describe(node), where, hint);
  }
}

// State of one parse: which paths came from --set (their errors say so instead of a line).
class SpecReader {
 public:
  explicit SpecReader(std::string source) : source_(std::move(source)) {}

  Status ApplyOverride(YAML::Node& root, const std::string& assignment);
  Status ReadRoot(const YAML::Node& root, JobSpec& spec) const;
  // Adds " (line N)" or " (from --set)" to a ValidateJobSpec error about a field.
  Status Locate(const Status& status, const YAML::Node& root) const;

 private:
  std::string Where(const std::string& path, const YAML::Node& node) const {
    const std::string section = path.substr(0, path.find('.'));
    if (overridden_.count(path) || overridden_.count(section)) return " (from --set)";
    return LineOf(node);
  }
  // Rejects a key seen before in the same mapping.
  Status CheckDuplicate(std::map<std::string, YAML::Node>& seen, const std::string& path,
                        const YAML::Node& key) const;
  Status ReadField(const YAML::Node& value, const std::string& section, const std::string& key,
                   const YAML::Node& key_node, JobSpec& spec) const;
  Status ReadSection(const std::string& section, const YAML::Node& value, JobSpec& spec) const;
  // data.train written as a list [{path, weight}, ...] (docs/data.md "Mixtures").
  Status ReadTrainSources(const YAML::Node& list, JobSpec& spec) const;
  // A mapping inside a section whose keys are the fields "group.*" (model.rope_scaling).
  Status ReadGroup(const std::string& section, const std::string& group, const YAML::Node& value,
                   JobSpec& spec) const;

  std::string source_;
  std::set<std::string> overridden_;
};

Status SpecReader::ApplyOverride(YAML::Node& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--set " + EscapeForMessage(assignment) +
                                ": expected KEY=VALUE (hint: e.g. --set parallelism.tp_size=2)");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // model.rope_scaling.factor: the field "rope_scaling.factor" of section model.
  if (parts.size() == 3) {
    parts[1] += "." + parts[2];
    parts.pop_back();
  }
  const bool known = (parts.size() == 1 && (parts[0] == "name" || IsSection(parts[0]))) ||
                     (parts.size() == 2 && IsSection(parts[0]) && IsKnownPath(parts[0], parts[1]));
  if (!known) {
    return InvalidArgumentError("--set " + EscapeForMessage(key) +
                                ": unknown field (hint: " + UnknownOverrideHint(parts) + ")");
  }
  YAML::Node value;
  if (text.empty()) {
    value = YAML::Node(std::string());
  } else {
    try {
      value = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return InvalidArgumentError("--set " + key + ": malformed value " + QuoteForMessage(text) +
                                  ": " + EscapeForMessage(e.msg) +
                                  " (hint: quote the value, e.g. --set '" + key + "=\"...\"')");
    }
  }
  if (parts.size() == 1) {
    root[key] = value;
  } else {
    YAML::Node section = root[parts[0]];
    if (section.IsDefined() && !section.IsNull() && !section.IsMap()) {
      return FieldError(parts[0], "expected a mapping of fields, got " + Describe(section),
                        LineOf(section), "write '" + parts[0] + ":' with its fields indented");
    }
    if (!section.IsDefined() || section.IsNull()) {
      root[parts[0]] = YAML::Node(YAML::NodeType::Map);
    }
    const size_t dot = parts[1].find('.');
    if (dot == std::string::npos) {
      root[parts[0]][parts[1]] = value;
    } else {
      const std::string group = parts[1].substr(0, dot);
      YAML::Node sub = root[parts[0]][group];
      if (!sub.IsDefined() || !sub.IsMap()) root[parts[0]][group] = YAML::Node(YAML::NodeType::Map);
      root[parts[0]][group][parts[1].substr(dot + 1)] = value;
    }
  }
  overridden_.insert(key);
  return OkStatus();
}

Status SpecReader::CheckDuplicate(std::map<std::string, YAML::Node>& seen, const std::string& path,
                                  const YAML::Node& key) const {
  auto [it, inserted] = seen.emplace(path, key);
  if (inserted) return OkStatus();
  const int first_line = it->second.Mark().line;
  return FieldError(path, "duplicate field", LineOf(key),
                    first_line < 0
                        ? std::string("remove one of the two")
                        : "remove this one or the one on line " + std::to_string(first_line + 1));
}

Status SpecReader::ReadTrainSources(const YAML::Node& list, JobSpec& spec) const {
  const std::string where = Where("data.train", list);
  if (list.size() == 0) {
    return FieldError("data.train", "the list of sources is empty", where,
                      "give a path, or a list [{path: PATH, weight: W}, ...]");
  }
  if (list.size() > static_cast<size_t>(kMaxDataSources)) {
    return FieldError("data.train",
                      "lists " + std::to_string(list.size()) + " sources, over the limit of " +
                          std::to_string(kMaxDataSources),
                      where, "merge sources into fewer files or folders");
  }
  std::vector<DataSource> sources;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node item = list[i];
    const std::string field = "data.train[" + std::to_string(i) + "]";
    const std::string at = Where("data.train", item);
    if (!item.IsMap()) {
      return FieldError(field, "expected a mapping {path, weight}, got " + Describe(item), at,
                        "write each source as {path: PATH, weight: W}");
    }
    DataSource source;
    bool has_path = false;
    std::map<std::string, YAML::Node> seen;
    for (auto it = item.begin(); it != item.end(); ++it) {
      const YAML::Node key = it->first;
      const std::string name = key.IsScalar() ? key.Scalar() : std::string();
      MESHRUN_RETURN_IF_ERROR(CheckDuplicate(seen, field + "." + name, key));
      if (name == "path") {
        MESHRUN_RETURN_IF_ERROR(ReadValue(
            it->second, "data", "train[" + std::to_string(i) + "].path", at, source.path));
        has_path = true;
      } else if (name == "weight") {
        bool out_of_range = false;
        if (!it->second.IsScalar() ||
            !ParseNumber(it->second.Scalar(), source.weight, out_of_range)) {
          return FieldError(field + ".weight", "expected a number, got " + Describe(it->second), at,
                            "write a positive weight such as 0.3");
        }
      } else {
        return FieldError(field + "." + name, "unknown field", LineOf(key),
                          "a source has the fields 'path' and 'weight'");
      }
    }
    if (!has_path || source.path.empty()) {
      return FieldError(field + ".path", "required field is missing", at,
                        "give each source a path: {path: PATH, weight: W}");
    }
    sources.push_back(std::move(source));
  }
  spec.data.train.clear();
  spec.data.train_sources = std::move(sources);
  return OkStatus();
}

Status SpecReader::ReadField(const YAML::Node& value, const std::string& section,
                             const std::string& key, const YAML::Node& key_node,
                             JobSpec& spec) const {
  const std::string path = PathOf(section, key);
  // data.train: one path (the table's string), or a list of weighted sources.
  if (section == "data" && key == "train") {
    if (value.IsSequence()) return ReadTrainSources(value, spec);
    spec.data.train_sources.clear();
  }
  bool found = false;
  Status status;
  ForEachJobSpecField(spec, [&](std::string_view s, std::string_view k, auto& member) {
    if (s != section || k != key) return;
    found = true;
    status = ReadValue(value, s, k, Where(path, value), member);
  });
  if (!found) {
    return FieldError(path, "unknown field", Where(path, key_node), UnknownFieldHint(section, key));
  }
  return status;
}

Status SpecReader::ReadSection(const std::string& section, const YAML::Node& value,
                               JobSpec& spec) const {
  if (value.IsNull()) return OkStatus();  // `model:` alone: all defaults
  if (!value.IsMap()) {
    return FieldError(
        section, "expected a mapping of fields, got " + Describe(value), Where(section, value),
        "indent the fields under '" + section + ":', e.g. " + JobSpecKeys(section).front() + ": " +
            DefaultText(section, JobSpecKeys(section).front()));
  }
  std::map<std::string, YAML::Node> seen;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) {
      return FieldError(section, "expected a field name, got " + Describe(key), LineOf(key),
                        "write 'name: value' pairs");
    }
    const std::string path = PathOf(section, key.Scalar());
    MESHRUN_RETURN_IF_ERROR(CheckDuplicate(seen, path, key));
    if (IsGroup(section, key.Scalar())) {
      MESHRUN_RETURN_IF_ERROR(ReadGroup(section, key.Scalar(), it->second, spec));
      continue;
    }
    MESHRUN_RETURN_IF_ERROR(ReadField(it->second, section, key.Scalar(), key, spec));
  }
  return OkStatus();
}

Status SpecReader::ReadGroup(const std::string& section, const std::string& group,
                             const YAML::Node& value, JobSpec& spec) const {
  const std::string path = PathOf(section, group);
  if (value.IsNull()) return OkStatus();  // `rope_scaling: null`: the defaults
  if (!value.IsMap()) {
    return FieldError(
        path, "expected a mapping of fields or null, got " + Describe(value), Where(path, value),
        "write e.g. '" + group + ": {" + GroupKeys(section, group).front() + ": ...}'");
  }
  std::map<std::string, YAML::Node> seen;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) {
      return FieldError(path, "expected a field name, got " + Describe(key), LineOf(key),
                        "write 'name: value' pairs");
    }
    const std::string sub = group + "." + key.Scalar();
    MESHRUN_RETURN_IF_ERROR(CheckDuplicate(seen, PathOf(section, sub), key));
    if (!IsKnownPath(section, sub)) {
      return FieldError(PathOf(section, sub), "unknown field", LineOf(key),
                        "the fields of " + path + " are " + JoinQuoted(GroupKeys(section, group)));
    }
    MESHRUN_RETURN_IF_ERROR(ReadField(it->second, section, sub, key, spec));
  }
  return OkStatus();
}

Status SpecReader::ReadRoot(const YAML::Node& root, JobSpec& spec) const {
  std::map<std::string, YAML::Node> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) {
      return InvalidArgumentError(source_ + ": expected a field name, got " + Describe(key) +
                                  LineOf(key) + " (hint: write 'name: value' pairs)");
    }
    const std::string name = key.Scalar();
    MESHRUN_RETURN_IF_ERROR(CheckDuplicate(seen, name, key));
    if (IsSection(name)) {
      MESHRUN_RETURN_IF_ERROR(ReadSection(name, it->second, spec));
    } else {
      MESHRUN_RETURN_IF_ERROR(ReadField(it->second, "", name, key, spec));
    }
  }
  return OkStatus();
}

Status SpecReader::Locate(const Status& status, const YAML::Node& root) const {
  const std::string& message = status.message();
  // "data.train[1].weight" is located at data.train.
  const std::string full = message.substr(0, message.find(": "));
  const std::string path = full.substr(0, full.find('['));
  const size_t dot = path.find('.');
  const std::string section = path.substr(0, dot);
  // Const lookups only: they never add nodes, and a missing key yields an undefined node.
  auto line_of_field = [](const YAML::Node& map, const std::string& key) {
    if (!map.IsDefined() || !map.IsMap()) return std::string();
    const YAML::Node value = map[key];
    return value.IsDefined() ? LineOf(value) : std::string();
  };
  std::string where;
  if (overridden_.count(path) || overridden_.count(section)) {
    where = " (from --set)";
  } else if (path == "name") {
    where = line_of_field(root, "name");
  } else if (dot != std::string::npos) {
    const YAML::Node section_node = root[section];
    where = line_of_field(section_node, path.substr(dot + 1));
  }
  const size_t hint = message.rfind(" (hint: ");
  if (where.empty() || hint == std::string::npos) return status;
  std::string located = message;
  located.insert(hint, where);
  return Status(status.code(), located);
}

Status MalformedYaml(const std::string& source, const YAML::Mark& mark, const std::string& what) {
  const std::string at = mark.line >= 0 ? " at line " + std::to_string(mark.line + 1) : "";
  return InvalidArgumentError(source + ": malformed YAML" + at + ": " + EscapeForMessage(what) +
                              " (hint: check the indentation, colons and quotes" +
                              (at.empty() ? "" : " around that line") + ")");
}

// yaml-cpp reports a tab in the indentation as whatever it made of the line ("illegal map
// value"): when a parse fails, the first line up to the failing one whose indentation holds a
// tab is named instead, with its column.
std::optional<Status> TabIndentation(const std::string& text, const std::string& source,
                                     const YAML::Mark& mark) {
  const size_t last_line = mark.line >= 0 ? static_cast<size_t>(mark.line) + 1 : SIZE_MAX;
  size_t line = 0;
  for (size_t start = 0; start < text.size() && line <= last_line; ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const size_t first = text.find_first_not_of(" \t\r", start);
    if (first == std::string::npos || first >= end) {  // a blank line: no indentation
      start = end + 1;
      continue;
    }
    for (size_t i = start; i < end && (text[i] == ' ' || text[i] == '\t'); ++i) {
      if (text[i] != '\t') continue;
      return InvalidArgumentError(
          source + ": line " + std::to_string(line + 1) + ", column " +
          std::to_string(i - start + 1) +
          ": a tab in the indentation; YAML does not allow tabs for indentation (hint: indent "
          "with spaces)");
    }
    start = end + 1;
  }
  return std::nullopt;
}

// Records where each document starts; ignores everything else.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Rejects a text of more than one YAML document. Done with the event parser, not LoadAll:
// yaml-cpp 0.7 never advances past a stray ',' at the start of a document and LoadAll then
// collects empty documents until memory runs out. A document starting where the previous one
// started is that case. Throws what yaml-cpp throws for malformed text.
Status CheckSingleDocument(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts handler;
  while (handler.starts.size() < 2 && parser.HandleNextDocument(handler)) {
    const auto& starts = handler.starts;
    if (starts.size() == 2 && starts[0].pos == starts[1].pos) {
      const size_t pos = static_cast<size_t>(std::max(starts[1].pos, 0));
      const std::string found = pos < text.size() ? QuoteForMessage(text.substr(pos, 1)) : "";
      return MalformedYaml(source, starts[1], "unexpected " + (found.empty() ? "text" : found));
    }
  }
  if (handler.starts.size() > 1) {
    return InvalidArgumentError(source + ": holds more than one YAML document (hint: keep one " +
                                "job spec per file and remove the '---' separators)");
  }
  return OkStatus();
}

// The model fields the tree gives (after --set): the rest are config.json's under init_from.
std::vector<std::string> GivenModelFields(const YAML::Node& root) {
  std::vector<std::string> given;
  const YAML::Node model = root["model"];
  if (!model || !model.IsMap()) return given;
  for (const auto& kv : model) {
    if (kv.first.IsScalar()) given.push_back(kv.first.Scalar());
  }
  return given;
}

// With model.init_from set, each model field the tree left out becomes config.json's
// (common/hf_config.h, the one mapping); a folder that cannot be read is left for the rank's
// loader to report.
void FillModelFromInitFrom(const std::vector<std::string>& given, JobSpec* spec) {
  if (spec->model.init_from.empty()) return;
  StatusOr<ModelSpec> file = ReadInitFromConfig(spec->model.init_from);
  if (!file.ok()) return;
  FillModelFromConfig(
      *file,
      [&](std::string_view field) {
        return std::find(given.begin(), given.end(), field) != given.end();
      },
      &spec->model);
}

// model.tie_embeddings left out: the family's default (true for gpt2, false for llama, as
// their checkpoints are).
void DefaultTieEmbeddings(YAML::Node& root) {
  YAML::Node model = root["model"];
  if (!model || !model.IsMap() || model["tie_embeddings"]) return;
  if (!model["arch"] || !model["arch"].IsScalar()) return;
  const Architecture* family = FindArchitecture(model["arch"].Scalar());
  if (family != nullptr && !family->tied_by_default) model["tie_embeddings"] = false;
}

StatusOr<JobSpec> ParseUnguarded(const std::string& text, const std::vector<std::string>& overrides,
                                 const std::string& source, bool fill_from_init_from = false) {
  if (text.size() > kMaxSpecBytes) {
    return InvalidArgumentError(source + ": " + std::to_string(text.size()) +
                                " bytes is too large for a job spec (hint: a spec is at most " +
                                std::to_string(kMaxSpecBytes) + " bytes)");
  }
  YAML::Node document;
  try {
    MESHRUN_RETURN_IF_ERROR(CheckSingleDocument(text, source));
    document = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (std::optional<Status> tab = TabIndentation(text, source, e.mark)) return *tab;
    return MalformedYaml(source, e.mark, e.msg);
  }
  YAML::Node root = document.IsNull() ? YAML::Node(YAML::NodeType::Map) : document;
  if (!root.IsMap()) {
    return InvalidArgumentError(source + ": expected a mapping of fields at the top level, got " +
                                Describe(root) + LineOf(root) +
                                " (hint: start with 'name:' and sections such as 'model:')");
  }
  SpecReader reader(source);
  for (const std::string& assignment : overrides) {
    MESHRUN_RETURN_IF_ERROR(reader.ApplyOverride(root, assignment));
  }
  const std::vector<std::string> given = GivenModelFields(root);
  DefaultTieEmbeddings(root);
  JobSpec spec;
  MESHRUN_RETURN_IF_ERROR(reader.ReadRoot(root, spec));
  if (fill_from_init_from) FillModelFromInitFrom(given, &spec);
  if (Status status = ValidateJobSpec(spec, /*nproc=*/0); !status.ok()) {
    return reader.Locate(status, root);
  }
  return spec;
}

}  // namespace

StatusOr<JobSpec> ParseJobSpecYaml(const std::string& text,
                                   const std::vector<std::string>& overrides,
                                   const std::string& source) {
  // yaml-cpp reports problems by throwing; the boundary of this component is a Status.
  try {
    return ParseUnguarded(text, overrides, source);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(source +
                                ": cannot read the job spec: " + EscapeForMessage(e.what()) +
                                " (hint: check the YAML near the position given)");
  } catch (const std::exception& e) {
    return InternalError(source + ": cannot read the job spec: " + EscapeForMessage(e.what()));
  } catch (...) {
    return InternalError(source + ": cannot read the job spec: unknown exception");
  }
}

StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in || std::filesystem::is_directory(path, ec)) {
    const std::string why = in ? "is a directory" : std::strerror(errno);
    return InvalidArgumentError(path + ": cannot read the job spec: " + why +
                                " (hint: pass the path of a YAML file with -f)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return InvalidArgumentError(path + ": cannot read the job spec: " + std::strerror(errno) +
                                " (hint: check that the file is readable)");
  }
  // docs/job-spec.md: model fields the spec leaves out come from model.init_from's config.json.
  try {
    return ParseUnguarded(text.str(), overrides, path, /*fill_from_init_from=*/true);
  } catch (const std::exception& e) {
    return InvalidArgumentError(path + ": cannot read the job spec: " + EscapeForMessage(e.what()) +
                                " (hint: check the YAML near the position given)");
  }
}

std::string JobSpecToYaml(const JobSpec& spec) {
  try {
    YAML::Emitter out;
    out << YAML::BeginMap;
    std::string_view open_section, open_group;
    ForEachJobSpecField(
        spec, [&](std::string_view section, std::string_view key, const auto& value) {
          // A key "group.name" is `name` inside the mapping `group` (model.rope_scaling).
          const size_t dot = key.find('.');
          const std::string_view group = dot == std::string_view::npos ? "" : key.substr(0, dot);
          if (section != open_section || group != open_group) {
            if (!open_group.empty()) out << YAML::EndMap;
            open_group = "";
          }
          if (section != open_section) {
            if (!open_section.empty()) out << YAML::EndMap;
            open_section = section;
            out << YAML::Key << std::string(section) << YAML::Value << YAML::BeginMap;
          }
          if (group != open_group) {
            open_group = group;
            out << YAML::Key << std::string(group) << YAML::Value << YAML::BeginMap;
          }
          out << YAML::Key << std::string(dot == std::string_view::npos ? key : key.substr(dot + 1))
              << YAML::Value;
          using T = std::decay_t<decltype(value)>;
          if (section == "data" && key == "train" && !spec.data.train_sources.empty()) {
            out << YAML::BeginSeq;
            for (const DataSource& source : spec.data.train_sources) {
              out << YAML::Flow << YAML::BeginMap << YAML::Key << "path" << YAML::Value
                  << source.path << YAML::Key << "weight" << YAML::Value
                  << FormatDouble(source.weight) << YAML::EndMap;
            }
            out << YAML::EndSeq;
          } else if constexpr (std::is_same_v<T, std::vector<int>>) {
            if (value.empty()) {
              out << YAML::Null;
            } else {
              out << YAML::Flow << YAML::BeginSeq;
              for (int v : value) out << v;
              out << YAML::EndSeq;
            }
          } else if constexpr (std::is_same_v<T, bool>) {
            out << (value ? "true" : "false");
          } else if constexpr (std::is_floating_point_v<T>) {
            out << FormatDouble(value);
          } else {
            out << value;
          }
        });
    if (!open_group.empty()) out << YAML::EndMap;
    if (!open_section.empty()) out << YAML::EndMap;
    out << YAML::EndMap;
    return std::string(out.c_str()) + "\n";
  } catch (const std::exception& e) {
    // Only reachable for a spec that ValidateJobSpec rejects (e.g. invalid UTF-8).
    return std::string("# cannot write the job spec as YAML: ") + e.what() + "\n";
  }
}

}  // namespace meshrun
