// Helpers of the deploy/k8s manifest test: rendering the manifests (the tests' own kustomize
// subset, tests/deploy/kustomize.h, and kubectl kustomize where one is installed), the containers
// of the workloads, their flags and ports, the options a binary's --help lists, and small probes of
// a running daemon (grpc.health.v1 Check through the generic stub, an HTTP GET).
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace meshrun::deploy_test {

// Objects of one rendering, and how they were obtained (for messages).
struct Rendered {
  std::string source;  // e.g. "kubectl kustomize deploy/k8s/overlays/cpu"
  std::vector<YAML::Node> objects;
  std::string text;  // the YAML stream as kubectl printed it ("" for the tests' renderer)
};

// `KUBECTL kustomize DIR` (KUBECTL: the path of a kubectl binary). `error` is set when it failed.
Rendered RenderWithKubectl(const std::string& kubectl, const std::string& dir, std::string* error);

// DIR rendered by the tests' own kustomize subset (tests/deploy/kustomize.h): resources,
// namespace, labels, images, replacements and the patches the overlays use. Needs no kubectl.
// Empty `error` on success.
Rendered RenderManifests(const std::string& dir, std::string* error);

// One container of a workload's pod template.
struct Container {
  std::string where;              // "DaemonSet/meshrun-worker container worker"
  std::string ns;                 // the workload's namespace
  YAML::Node pod_template;        // metadata + spec of the pods
  YAML::Node spec;                // the container
  std::string binary;             // file name of command[0] ("" when there is no command)
  std::vector<std::string> argv;  // command[1:] then args
};
std::vector<Container> Containers(const Rendered& rendered);

// A flag as written in argv: "--name=value", "--name value" or a bare "--name".
struct Flag {
  std::string name;
  std::string value;
  bool has_value = false;
};
std::vector<Flag> ParseFlags(const std::vector<std::string>& argv);
const Flag* FindFlag(const std::vector<Flag>& flags, const std::string& name);

// The flags that make a daemon listen, and the port of a HOST:PORT value (-1 if none).
inline const std::vector<std::string>& ListenFlags() {
  static const std::vector<std::string> flags = {"--listen", "--metrics-listen", "--health-listen"};
  return flags;
}
int PortOf(const std::string& address);
std::string HostOf(const std::string& address);

// The options `binary --help` lists, and which of them it marks REQUIRED.
struct HelpOptions {
  std::set<std::string> options;
  std::set<std::string> required;
  std::string error;  // the binary could not be run
};
HelpOptions ReadHelp(const std::string& binary_path);

// A port reference (number or name) resolved against a container's ports; -1 if unknown.
int ResolvePort(const YAML::Node& container, const YAML::Node& port);

// Every key of `selector` (a map of labels) has the same value in `labels`; false when empty.
bool SelectorMatches(const YAML::Node& selector, const YAML::Node& labels);

// Scalar text of a node ("" for a missing or non-scalar one).
std::string Str(const YAML::Node& node);

// node[k1][k2]...: an undefined node when any step is missing (yaml-cpp throws when a missing
// node is indexed again).
YAML::Node At(const YAML::Node& node, std::initializer_list<std::string> keys);

// grpc.health.v1.Health/Check for `service` on 127.0.0.1:port: 1 SERVING, 2 NOT_SERVING,
// -1 when the call failed.
int HealthCheck(int port, const std::string& service,
                std::chrono::milliseconds limit = std::chrono::seconds(3));

// The body of GET `path` on 127.0.0.1:port ("" on failure).
std::string HttpGet(int port, const std::string& path);

// A TCP port that was free a moment ago on 127.0.0.1.
int FreePort();

// Runs a shell command; its exit status and stdout.
struct CommandResult {
  int status = -1;
  std::string out;
};
CommandResult RunCommand(const std::string& command);
// S quoted for a POSIX shell ('…', with ' written '\'').
std::string ShellQuote(const std::string& s);

}  // namespace meshrun::deploy_test
