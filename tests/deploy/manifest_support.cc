// Helpers of the deploy/k8s manifest test (see manifest_support.h).
#include "tests/deploy/manifest_support.h"

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>

#include "tests/coordinator/grpc_test_util.h"
#include "tests/deploy/kustomize.h"

namespace meshrun::deploy_test {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string Str(const YAML::Node& node) {
  return node && node.IsScalar() ? node.as<std::string>() : std::string();
}

YAML::Node At(const YAML::Node& node, std::initializer_list<std::string> keys) {
  YAML::Node current = node;
  for (const std::string& key : keys) {
    if (!current || !current.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& parent = current;
    YAML::Node next = parent[key];
    if (!next) return YAML::Node(YAML::NodeType::Undefined);
    current.reset(next);
  }
  return current;
}

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.out.append(buf, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

Rendered RenderWithKubectl(const std::string& kubectl, const std::string& dir, std::string* error) {
  Rendered rendered;
  rendered.source = "kubectl kustomize " + dir;
  const CommandResult r =
      RunCommand(ShellQuote(kubectl) + " kustomize " + ShellQuote(dir) + " 2>&1");
  rendered.text = r.out;
  if (r.status != 0) {
    *error = rendered.source + " failed (exit " + std::to_string(r.status) + "): " + r.out;
    return rendered;
  }
  try {
    for (const auto& doc : YAML::LoadAll(r.out)) {
      if (doc.IsMap()) rendered.objects.push_back(doc);
    }
  } catch (const std::exception& e) {
    *error = rendered.source + ": output is not YAML: " + e.what();
  }
  return rendered;
}

Rendered RenderManifests(const std::string& dir, std::string* error) {
  Rendered rendered;
  rendered.source = dir + " (rendered by the tests' kustomize subset)";
  rendered.objects = RenderKustomization(dir, error);
  return rendered;
}

std::vector<Container> Containers(const Rendered& rendered) {
  std::vector<Container> out;
  for (const auto& obj : rendered.objects) {
    const std::string kind = Str(obj["kind"]);
    YAML::Node pod;
    if (kind == "Deployment" || kind == "StatefulSet" || kind == "DaemonSet" ||
        kind == "ReplicaSet" || kind == "Job") {
      pod = obj["spec"]["template"];
    } else if (kind == "CronJob") {
      pod = obj["spec"]["jobTemplate"]["spec"]["template"];
    } else if (kind == "Pod") {
      pod = obj;
    } else {
      continue;
    }
    for (const char* list : {"initContainers", "containers"}) {
      for (const auto& c : pod["spec"][list]) {
        Container container;
        container.where =
            kind + "/" + Str(obj["metadata"]["name"]) + " container " + Str(c["name"]);
        container.ns = Str(obj["metadata"]["namespace"]);
        container.pod_template = pod;
        container.spec = static_cast<const YAML::Node&>(c);
        const YAML::Node command = c["command"];
        if (command && command.IsSequence() && command.size() > 0) {
          container.binary = fs::path(Str(command[0])).filename().string();
          for (size_t i = 1; i < command.size(); ++i) container.argv.push_back(Str(command[i]));
        }
        for (const auto& a : c["args"]) container.argv.push_back(Str(a));
        out.push_back(std::move(container));
      }
    }
  }
  return out;
}

std::vector<Flag> ParseFlags(const std::vector<std::string>& argv) {
  std::vector<Flag> flags;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) continue;
    Flag f;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      f.name = a.substr(0, eq);
      f.value = a.substr(eq + 1);
      f.has_value = true;
    } else {
      f.name = a;
      if (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) {
        f.value = argv[++i];
        f.has_value = true;
      }
    }
    flags.push_back(std::move(f));
  }
  return flags;
}

const Flag* FindFlag(const std::vector<Flag>& flags, const std::string& name) {
  for (const auto& f : flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return -1;
  const std::string digits = address.substr(colon + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 5) return -1;
  return std::stoi(digits);
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

HelpOptions ReadHelp(const std::string& binary_path) {
  HelpOptions help;
  if (access(binary_path.c_str(), X_OK) != 0) {
    help.error = binary_path + " is not an executable (hint: build it first)";
    return help;
  }
  const CommandResult r = RunCommand(ShellQuote(binary_path) + " --help 2>&1");
  if (r.status != 0) {
    help.error = binary_path + " --help exited " + std::to_string(r.status) + ": " + r.out;
    return help;
  }
  // CLI11: "  --state-dir TEXT REQUIRED   description" or "  -h,--help   description".
  static const std::regex option(R"(^\s+(?:-\w,)?(--[A-Za-z0-9][A-Za-z0-9-]*)(.*)$)");
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, option)) continue;
    help.options.insert(m[1]);
    // The type and REQUIRED come before the description, which is two or more spaces away.
    const std::string rest = m[2];
    const size_t gap = rest.find("  ");
    if (rest.substr(0, gap).find("REQUIRED") != std::string::npos) help.required.insert(m[1]);
  }
  if (help.options.empty()) help.error = binary_path + " --help lists no options: " + r.out;
  return help;
}

int ResolvePort(const YAML::Node& container, const YAML::Node& port) {
  const std::string text = Str(port);
  if (text.empty()) return -1;
  if (text.find_first_not_of("0123456789") == std::string::npos) return std::stoi(text);
  for (const auto& p : container["ports"]) {
    if (Str(p["name"]) == text) return std::stoi(Str(p["containerPort"]));
  }
  return -1;
}

bool SelectorMatches(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector || !selector.IsMap() || selector.size() == 0) return false;
  for (const auto& kv : selector) {
    if (Str(labels[Str(kv.first)]) != Str(kv.second)) return false;
  }
  return true;
}

int HealthCheck(int port, const std::string& service, std::chrono::milliseconds limit) {
  return testing::HealthStatus(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()),
      limit, service);
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[8192];
      ssize_t n = 0;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace meshrun::deploy_test
