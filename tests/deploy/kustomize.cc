// The kustomize subset of kustomize.h. Transformations of one kustomization run in kustomize's
// order: its resources (folders rendered first, recursively), patches, namespace, labels,
// images, then replacements.
#include "tests/deploy/kustomize.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <set>

namespace meshrun::deploy_test {
namespace {

namespace fs = std::filesystem;
using Objects = std::vector<YAML::Node>;

std::string Text(const YAML::Node& n) {
  return n && n.IsScalar() ? n.Scalar() : std::string();
}

bool Fail(std::string* error, const std::string& what) {
  if (error->empty()) *error = what;
  return false;
}

bool IsNamespaced(const std::string& kind) {
  static const std::set<std::string> cluster_scoped = {
      "Namespace",        "ClusterRole",  "ClusterRoleBinding", "CustomResourceDefinition",
      "PersistentVolume", "StorageClass", "PriorityClass"};
  return cluster_scoped.count(kind) == 0;
}

// The pod templates of a workload (none for other kinds), as references into the object.
std::vector<YAML::Node> PodTemplates(YAML::Node& obj) {
  const std::string kind = Text(obj["kind"]);
  if (kind == "Deployment" || kind == "StatefulSet" || kind == "DaemonSet" ||
      kind == "ReplicaSet" || kind == "Job") {
    return {obj["spec"]["template"]};
  }
  if (kind == "CronJob") return {obj["spec"]["jobTemplate"]["spec"]["template"]};
  return {};
}

// "a.b\.c.[name=x]" -> {"a", "b.c", "[name=x]"}.
std::vector<std::string> SplitFieldPath(const std::string& path) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '\\' && i + 1 < path.size()) {
      out.back() += path[++i];
    } else if (path[i] == '.') {
      out.emplace_back();
    } else {
      out.back() += path[i];
    }
  }
  return out;
}

bool AllDigits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// The child of `node` that one segment names ([key=value] in a list, an index, a map key);
// an undefined node when there is none. Never adds anything.
YAML::Node Child(YAML::Node node, const std::string& seg) {
  if (!node) return YAML::Node(YAML::NodeType::Undefined);
  if (seg.size() > 2 && seg.front() == '[' && seg.back() == ']') {
    const size_t eq = seg.find('=');
    if (!node.IsSequence() || eq == std::string::npos) return YAML::Node(YAML::NodeType::Undefined);
    const std::string key = seg.substr(1, eq - 1), value = seg.substr(eq + 1, seg.size() - eq - 2);
    for (size_t i = 0; i < node.size(); ++i) {
      if (Text(node[i][key]) == value) return node[i];
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }
  if (node.IsSequence()) {
    if (!AllDigits(seg) || std::stoul(seg) >= node.size())
      return YAML::Node(YAML::NodeType::Undefined);
    return node[std::stoul(seg)];
  }
  if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node& map = node;
  YAML::Node child = map[seg];
  return child ? node[seg] : YAML::Node(YAML::NodeType::Undefined);
}

// Follows `count` segments. reset() rebinds the handle: assigning to a YAML::Node would
// overwrite the node it refers to (here: the object itself) with the child.
YAML::Node At(const YAML::Node& root, const std::vector<std::string>& segs, size_t count) {
  YAML::Node node = root;
  for (size_t i = 0; i < count && node; ++i) node.reset(Child(node, segs[i]));
  return node;
}

bool Matches(const YAML::Node& obj, const YAML::Node& select, const char* what,
             std::string* error) {
  static const std::set<std::string> known = {"kind", "name", "namespace", "group", "version"};
  for (const auto& kv : select) {
    if (!known.count(Text(kv.first))) {
      return Fail(error, std::string(what) + ": selector field '" + Text(kv.first) +
                             "' is not supported by the tests' renderer");
    }
  }
  auto equal = [&](const char* key, const std::string& value, bool regex) {
    const std::string want = Text(select[key]);
    if (want.empty()) return true;
    return regex ? std::regex_match(value, std::regex(want)) : want == value;
  };
  const std::string api = Text(obj["apiVersion"]);
  const size_t slash = api.find('/');
  const std::string group = slash == std::string::npos ? "" : api.substr(0, slash);
  const std::string version = slash == std::string::npos ? api : api.substr(slash + 1);
  return equal("kind", Text(obj["kind"]), true) &&
         equal("name", Text(obj["metadata"]["name"]), true) &&
         equal("namespace", Text(obj["metadata"]["namespace"]), true) &&
         equal("group", group, true) && equal("version", version, true);
}

// JSON pointer (RFC 6901) segments.
std::vector<std::string> SplitPointer(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string seg = path.substr(start, end - start);
    for (size_t at = seg.find("~1"); at != std::string::npos; at = seg.find("~1", at)) {
      seg.replace(at, 2, "/");
    }
    for (size_t at = seg.find("~0"); at != std::string::npos; at = seg.find("~0", at + 1)) {
      seg.replace(at, 2, "~");
    }
    out.push_back(seg);
    start = end + 1;
  }
  return out;
}

bool ApplyJson6902(YAML::Node obj, const YAML::Node& ops, const std::string& where,
                   std::string* error) {
  for (const auto& op : ops) {
    const std::string name = Text(op["op"]), path = Text(op["path"]);
    const std::string at = where + ": op " + name + " " + path;
    if (path.empty() || path[0] != '/') return Fail(error, at + ": path must start with '/'");
    const std::vector<std::string> segs = SplitPointer(path);
    YAML::Node parent = At(obj, segs, segs.size() - 1);
    const std::string& last = segs.back();
    if (!parent) return Fail(error, at + ": the parent of the path does not exist");
    if (name != "add" && name != "replace" && name != "remove") {
      return Fail(error,
                  at + ": only add, replace and remove are supported by the tests' renderer");
    }
    if (parent.IsMap()) {
      const bool exists = static_cast<bool>(static_cast<const YAML::Node&>(parent)[last]);
      if (name != "add" && !exists) return Fail(error, at + ": no such field");
      if (name == "remove") {
        parent.remove(last);
      } else {
        parent[last] = YAML::Clone(op["value"]);
      }
    } else if (parent.IsSequence()) {
      const size_t n = parent.size();
      const bool append = name == "add" && last == "-";
      if (!append &&
          (!AllDigits(last) || std::stoul(last) > n || (name != "add" && std::stoul(last) == n))) {
        return Fail(error, at + ": no such index");
      }
      const size_t index = append ? n : std::stoul(last);
      if (name == "replace") {
        parent[index] = YAML::Clone(op["value"]);
        continue;
      }
      YAML::Node rebuilt(YAML::NodeType::Sequence);
      for (size_t i = 0; i <= n; ++i) {
        if (i == index && name == "add") rebuilt.push_back(YAML::Clone(op["value"]));
        if (i < n && !(i == index && name == "remove")) rebuilt.push_back(parent[i]);
      }
      parent = rebuilt;  // in place: every reference to the sequence sees the new one
    } else {
      return Fail(error, at + ": the parent is neither a map nor a list");
    }
  }
  return true;
}

bool ApplyPatches(const fs::path& dir, const YAML::Node& patches, Objects& objects,
                  std::string* error) {
  for (const auto& p : patches) {
    std::string text = Text(p["patch"]);
    if (p["path"]) {
      std::ifstream in(dir / Text(p["path"]));
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (p["options"]) return Fail(error, dir.string() + ": patches[].options is not supported");
    YAML::Node patch;
    try {
      patch = YAML::Load(text);
    } catch (const std::exception& e) {
      return Fail(error, dir.string() + ": a patch is not YAML: " + e.what());
    }
    if (patch.IsSequence()) {
      if (!p["target"]) return Fail(error, dir.string() + ": a JSON 6902 patch needs a target");
      int matched = 0;
      for (YAML::Node& obj : objects) {
        if (!Matches(obj, p["target"], "patches[].target", error)) continue;
        ++matched;
        const std::string where =
            dir.string() + ": patch of " + Text(obj["kind"]) + "/" + Text(obj["metadata"]["name"]);
        if (!ApplyJson6902(obj, patch, where, error)) return false;
      }
      if (!error->empty()) return false;
      if (matched == 0) return Fail(error, dir.string() + ": a patch's target matches nothing");
    } else if (patch.IsMap() && Text(patch["$patch"]) == "delete") {
      const size_t before = objects.size();
      objects.erase(std::remove_if(objects.begin(), objects.end(),
                                   [&](const YAML::Node& obj) {
                                     return Text(obj["kind"]) == Text(patch["kind"]) &&
                                            Text(obj["metadata"]["name"]) ==
                                                Text(patch["metadata"]["name"]) &&
                                            (!patch["metadata"]["namespace"] ||
                                             Text(obj["metadata"]["namespace"]) ==
                                                 Text(patch["metadata"]["namespace"]));
                                   }),
                    objects.end());
      if (objects.size() == before) {
        return Fail(error, dir.string() + ": $patch: delete of " + Text(patch["kind"]) + "/" +
                               Text(patch["metadata"]["name"]) + " matches nothing");
      }
    } else {
      return Fail(error, dir.string() +
                             ": strategic-merge patches other than `$patch: delete` are not "
                             "supported by the tests' renderer");
    }
  }
  return true;
}

bool ApplyLabels(const YAML::Node& labels, Objects& objects, const std::string& where,
                 std::string* error) {
  for (const auto& l : labels) {
    if (l["includeSelectors"] && l["includeSelectors"].as<bool>()) {
      return Fail(error, where + ": labels[].includeSelectors: true is not supported");
    }
    const bool templates = l["includeTemplates"] && l["includeTemplates"].as<bool>();
    for (YAML::Node& obj : objects) {
      std::vector<YAML::Node> targets = {obj["metadata"]};
      if (templates) {
        for (YAML::Node t : PodTemplates(obj)) targets.push_back(t["metadata"]);
        // kustomize labels a StatefulSet's volume claim templates too.
        if (Text(obj["kind"]) == "StatefulSet") {
          for (YAML::Node claim : obj["spec"]["volumeClaimTemplates"]) {
            targets.push_back(claim["metadata"]);
          }
        }
      }
      for (YAML::Node meta : targets) {
        for (const auto& kv : l["pairs"]) meta["labels"][Text(kv.first)] = Text(kv.second);
      }
    }
  }
  return true;
}

bool ApplyImages(const YAML::Node& images, Objects& objects, const std::string& where,
                 std::string* error) {
  for (const auto& img : images) {
    if (img["digest"]) return Fail(error, where + ": images[].digest is not supported");
    const std::string name = Text(img["name"]);
    for (YAML::Node& obj : objects) {
      for (YAML::Node pod : PodTemplates(obj)) {
        for (const char* list : {"initContainers", "containers"}) {
          for (YAML::Node c : pod["spec"][list]) {
            const std::string image = Text(c["image"]);
            const size_t slash = image.rfind('/');
            const size_t colon = image.find(':', slash == std::string::npos ? 0 : slash);
            const std::string base = image.substr(0, colon);
            if (base != name) continue;
            const std::string tag = colon == std::string::npos ? "" : image.substr(colon);
            const std::string new_name = img["newName"] ? Text(img["newName"]) : base;
            c["image"] = new_name + (img["newTag"] ? ":" + Text(img["newTag"]) : tag);
          }
        }
      }
    }
  }
  return true;
}

bool ApplyReplacements(const YAML::Node& replacements, Objects& objects, const std::string& where,
                       std::string* error) {
  for (const auto& r : replacements) {
    const YAML::Node& source = r["source"];
    YAML::Node value(YAML::NodeType::Undefined);
    const std::string path = source["fieldPath"] ? Text(source["fieldPath"]) : "metadata.name";
    for (YAML::Node& obj : objects) {
      YAML::Node select = YAML::Clone(source);
      select.remove("fieldPath");
      if (!Matches(obj, select, "replacements[].source", error)) continue;
      const auto segs = SplitFieldPath(path);
      value.reset(At(obj, segs, segs.size()));
    }
    if (!error->empty()) return false;
    if (!value) return Fail(error, where + ": replacement source " + path + " not found");
    for (const auto& t : r["targets"]) {
      if (t["reject"] || t["options"]) {
        return Fail(error, where + ": replacements[].targets[].reject/options are not supported");
      }
      int matched = 0;
      for (YAML::Node& obj : objects) {
        if (!Matches(obj, t["select"], "replacements[].targets[].select", error)) continue;
        ++matched;
        for (const auto& fp : t["fieldPaths"]) {
          const auto segs = SplitFieldPath(Text(fp));
          YAML::Node parent = At(obj, segs, segs.size() - 1);
          if (!Child(parent, segs.back()) || !parent.IsMap()) {
            return Fail(error, where + ": replacement target field " + Text(fp) + " of " +
                                   Text(obj["kind"]) + "/" + Text(obj["metadata"]["name"]) +
                                   " does not exist");
          }
          parent[segs.back()] = YAML::Clone(value);
        }
      }
      if (!error->empty()) return false;
      if (matched == 0) return Fail(error, where + ": a replacement target matches nothing");
    }
  }
  return true;
}

bool Render(const fs::path& dir, Objects& out, std::string* error) {
  fs::path file = dir / "kustomization.yaml";
  if (!fs::exists(file)) file = dir / "kustomization.yml";
  if (!fs::exists(file)) return Fail(error, dir.string() + ": no kustomization.yaml");
  YAML::Node k;
  try {
    k = YAML::LoadFile(file.string());
  } catch (const std::exception& e) {
    return Fail(error, file.string() + ": " + e.what());
  }
  static const std::set<std::string> known = {"apiVersion", "kind",   "resources",    "namespace",
                                              "labels",     "images", "replacements", "patches"};
  for (const auto& kv : k) {
    if (!known.count(Text(kv.first))) {
      return Fail(error,
                  file.string() + ": '" + Text(kv.first) +
                      "' is not supported by the tests' renderer (tests/deploy/kustomize.h)");
    }
  }
  Objects objects;
  for (const auto& resource : k["resources"]) {
    const fs::path path = dir / Text(resource);
    if (fs::is_directory(path)) {
      if (!Render(path, objects, error)) return false;
      continue;
    }
    try {
      for (const auto& doc : YAML::LoadAllFromFile(path.string())) {
        if (doc.IsMap()) objects.push_back(doc);
      }
    } catch (const std::exception& e) {
      return Fail(error, path.string() + ": " + e.what());
    }
  }
  try {
    if (!ApplyPatches(dir, k["patches"], objects, error)) return false;
    const std::string ns = Text(k["namespace"]);
    if (!ns.empty()) {
      for (YAML::Node& obj : objects) {
        if (IsNamespaced(Text(obj["kind"]))) obj["metadata"]["namespace"] = ns;
      }
    }
    if (!ApplyLabels(k["labels"], objects, file.string(), error)) return false;
    if (!ApplyImages(k["images"], objects, file.string(), error)) return false;
    if (!ApplyReplacements(k["replacements"], objects, file.string(), error)) return false;
  } catch (const std::exception& e) {
    return Fail(error, file.string() + ": " + e.what());
  }
  out.insert(out.end(), objects.begin(), objects.end());
  return true;
}

// An unquoted YAML 1.1 integer (decimal, 0-prefixed octal, 0x hex) as a value.
std::optional<long long> YamlInt(const YAML::Node& n) {
  if (n.Tag() == "!") return std::nullopt;  // quoted: a string
  const std::string& t = n.Scalar();
  if (t.empty() || !std::all_of(t.begin(), t.end(),
                                [](unsigned char c) { return std::isxdigit(c) || c == 'x'; })) {
    return std::nullopt;
  }
  try {
    size_t used = 0;
    const int base = t.rfind("0x", 0) == 0 ? 16 : (t.size() > 1 && t[0] == '0' ? 8 : 10);
    const long long v = std::stoll(t, &used, base);
    if (used != t.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::vector<YAML::Node> RenderKustomization(const std::string& dir, std::string* error) {
  error->clear();
  Objects objects;
  if (!Render(dir, objects, error)) return {};
  return objects;
}

std::string YamlDifference(const YAML::Node& a, const YAML::Node& b, const std::string& path) {
  const std::string at = path.empty() ? "(top)" : path;
  if (!a || !b) {
    if ((!a || a.IsNull()) && (!b || b.IsNull())) return "";
    return at + ": " + (a ? "'" + YAML::Dump(a) + "'" : "missing") + " vs " +
           (b ? "'" + YAML::Dump(b) + "'" : "missing");
  }
  if (a.Type() != b.Type()) {
    // An empty map and an absent/null value print alike in some tools.
    if ((a.IsNull() || !a) && (b.IsNull() || !b)) return "";
    return at + ": one side is " + (a ? YAML::Dump(a) : "missing") + ", the other " +
           (b ? YAML::Dump(b) : "missing");
  }
  switch (a.Type()) {
    case YAML::NodeType::Scalar: {
      if (a.Scalar() == b.Scalar()) return "";
      // kustomize prints YAML 1.1 integers in decimal (defaultMode: 0440 becomes 288).
      const auto a_int = YamlInt(a), b_int = YamlInt(b);
      if (a_int && b_int && *a_int == *b_int) return "";
      return at + ": '" + a.Scalar() + "' vs '" + b.Scalar() + "'";
    }
    case YAML::NodeType::Sequence:
      if (a.size() != b.size()) {
        return at + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " items";
      }
      for (size_t i = 0; i < a.size(); ++i) {
        std::string d = YamlDifference(a[i], b[i], path + "/" + std::to_string(i));
        if (!d.empty()) return d;
      }
      return "";
    case YAML::NodeType::Map: {
      std::set<std::string> keys;
      for (const auto& kv : a) keys.insert(Text(kv.first));
      for (const auto& kv : b) keys.insert(Text(kv.first));
      for (const std::string& k : keys) {
        std::string d = YamlDifference(a[k], b[k], path + "/" + k);
        if (!d.empty()) return d;
      }
      return "";
    }
    default: return "";
  }
}

}  // namespace meshrun::deploy_test
