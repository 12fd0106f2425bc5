// Helpers shared by the deploy/k8s tests (manifest_test.cc, manifest_docker_test.cc,
// manifest_daemons_test.cc): where the source and build trees are, the --help options of the
// meshrun binaries (read once per binary), a rendering's container of one binary and the
// Service a host name leads to.
#pragma once

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/deploy/manifest_support.h"

namespace meshrun::deploy_test {

inline std::string SourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}
inline std::string BinaryDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? dir : "build";
}
inline std::string K8sDir(const std::string& sub = "") {
  return SourceDir() + "/deploy/k8s" + (sub.empty() ? "" : "/" + sub);
}

inline const HelpOptions& Help(const std::string& binary) {
  static std::map<std::string, HelpOptions> cache;
  auto it = cache.find(binary);
  if (it == cache.end()) {
    HelpOptions help;
    if (binary != "meshrun" && binary != "meshrun-coordinator" && binary != "meshrun-worker") {
      help.error = "command '" + binary +
                   "' is not a meshrun binary (meshrun, meshrun-coordinator, meshrun-worker)";
    } else {
      help = ReadHelp(BinaryDir() + "/bin/" + binary);
    }
    it = cache.emplace(binary, std::move(help)).first;
  }
  return it->second;
}

inline const Container* FindContainer(const std::vector<Container>& all,
                                      const std::string& binary) {
  for (const auto& c : all) {
    if (c.binary == binary) return &c;
  }
  return nullptr;
}

// The Service a host names: NAME, NAME.NS, NAME.NS.svc[.cluster.local].
inline const YAML::Node* ServiceOfHost(const Rendered& r, const std::string& host,
                                       const std::string& default_ns) {
  std::vector<std::string> parts;
  std::istringstream in(host);
  for (std::string p; std::getline(in, p, '.');) parts.push_back(p);
  if (parts.empty()) return nullptr;
  const std::string ns = parts.size() > 1 ? parts[1] : default_ns;
  if (parts.size() > 2 && parts[2] != "svc") return nullptr;
  for (const auto& obj : r.objects) {
    if (Str(obj["kind"]) == "Service" && Str(obj["metadata"]["name"]) == parts[0] &&
        Str(obj["metadata"]["namespace"]) == ns) {
      return &obj;
    }
  }
  return nullptr;
}

}  // namespace meshrun::deploy_test
