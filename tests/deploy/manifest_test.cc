// deploy/k8s against the real binaries. Static checks (unit): every flag a container passes is
// an option its binary's --help lists (and every REQUIRED one is passed); every containerPort,
// Service port, probe port, monitor port and prometheus.io/port annotation is a port the
// container's --listen / --metrics-listen / --health-listen flags make it listen on; the
// addresses the daemons dial name a Service that leads to those ports. They run on the
// renderings of the base and both overlays by the tests' own kustomize subset
// (tests/deploy/kustomize.h: no kubectl needed), and ManifestKubectl checks that kubectl
// kustomize, where one that can build deploy/k8s is installed, renders the same objects
// (docs/decisions/0006-manifest-validation.md). The daemon check (integration) starts
// meshrun-coordinator and meshrun-worker with the manifests' arguments (paths moved into a
// temporary folder, addresses to 127.0.0.1 with ephemeral ports, TLS material made with openssl)
// and asks the manifests' probes and scrapes.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/coordinator/grpc_test_util.h"
#include "tests/deploy/kustomize.h"
#include "tests/deploy/manifest_support.h"

namespace meshrun::deploy_test {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string SourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}
std::string BinaryDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? dir : "build";
}
std::string K8sDir(const std::string& sub = "") {
  return SourceDir() + "/deploy/k8s" + (sub.empty() ? "" : "/" + sub);
}

const HelpOptions& Help(const std::string& binary) {
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

// A container with its flags and the ports those flags listen on.
struct Analyzed {
  Container c;
  std::vector<Flag> flags;
  std::map<int, std::string> listens;  // port -> the flag that listens on it
};

std::string ListensText(const std::map<int, std::string>& listens) {
  if (listens.empty()) return "it listens on none";
  std::string s;
  for (const auto& [port, flag] : listens)
    s += (s.empty() ? "" : ", ") + flag + " " + std::to_string(port);
  return s;
}

// The Service a host names: NAME, NAME.NS, NAME.NS.svc[.cluster.local].
const YAML::Node* ServiceOfHost(const Rendered& r, const std::string& host,
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

std::vector<const Analyzed*> Selected(const std::vector<Analyzed>& all, const YAML::Node& selector,
                                      const std::string& ns) {
  std::vector<const Analyzed*> out;
  for (const auto& a : all) {
    if (a.c.ns == ns && SelectorMatches(selector, At(a.c.pod_template, {"metadata", "labels"}))) {
      out.push_back(&a);
    }
  }
  return out;
}

// Where a Service port leads: (container, port number) for every selected container.
std::vector<std::pair<const Analyzed*, int>> Targets(const std::vector<Analyzed>& all,
                                                     const YAML::Node& service,
                                                     const YAML::Node& port) {
  std::vector<std::pair<const Analyzed*, int>> out;
  const YAML::Node target = port["targetPort"] ? port["targetPort"] : port["port"];
  for (const Analyzed* a :
       Selected(all, service["spec"]["selector"], Str(service["metadata"]["namespace"]))) {
    out.emplace_back(a, ResolvePort(a->c.spec, target));
  }
  return out;
}

std::vector<Analyzed> Analyze(const Rendered& r, std::vector<std::string>* problems) {
  std::vector<Analyzed> all;
  for (auto& c : Containers(r)) {
    Analyzed a;
    a.flags = ParseFlags(c.argv);
    for (const auto& name : ListenFlags()) {
      const Flag* f = FindFlag(a.flags, name);
      if (f == nullptr) continue;
      const int port = PortOf(f->value);
      if (port <= 0) {
        problems->push_back(c.where + ": " + name + "=" + f->value +
                            " has no fixed port (hint: probes and Services need a known port)");
        continue;
      }
      a.listens[port] = name;
    }
    a.c = std::move(c);
    all.push_back(std::move(a));
  }
  return all;
}

// Every problem of one rendering, each naming the container, flag or port.
std::vector<std::string> CheckRendering(const Rendered& r) {
  std::vector<std::string> problems;
  std::vector<Analyzed> all = Analyze(r, &problems);
  if (all.empty()) problems.push_back("no workload containers");
  for (const Analyzed& a : all) {
    const Container& c = a.c;
    // (a) flags against --help.
    if (c.binary.empty()) {
      problems.push_back(c.where + ": no command (hint: name the meshrun binary in `command:`)");
      continue;
    }
    const HelpOptions& help = Help(c.binary);
    if (!help.error.empty()) {
      problems.push_back(c.where + ": " + help.error);
      continue;
    }
    for (const Flag& f : a.flags) {
      if (help.options.count(f.name) == 0) {
        problems.push_back(c.where + ": flag " + f.name + " is not an option of `" + c.binary +
                           " --help` (hint: fix the flag name or build a binary that has it)");
      }
    }
    for (const std::string& required : help.required) {
      if (FindFlag(a.flags, required) == nullptr) {
        problems.push_back(c.where + ": " + c.binary + " requires " + required +
                           ", which its arguments leave out");
      }
    }
    // (b) ports.
    std::set<int> declared;
    for (const auto& p : c.spec["ports"]) {
      const int port = ResolvePort(c.spec, p["containerPort"]);
      declared.insert(port);
      if (a.listens.count(port) == 0) {
        problems.push_back(c.where + ": containerPort " + Str(p["containerPort"]) + " (" +
                           Str(p["name"]) + ") is not a port its flags listen on (" +
                           ListensText(a.listens) + ")");
      }
    }
    for (const auto& [port, flag] : a.listens) {
      if (declared.count(port) == 0) {
        problems.push_back(c.where + ": " + flag + " port " + std::to_string(port) +
                           " is not declared in ports: (hint: name it so Services and monitors "
                           "can refer to it)");
      }
    }
    for (const char* probe_name : {"startupProbe", "livenessProbe", "readinessProbe"}) {
      const YAML::Node probe = c.spec[probe_name];
      if (!probe) continue;
      for (const char* handler : {"grpc", "httpGet", "tcpSocket"}) {
        if (!probe[handler]) continue;
        const std::string ref = Str(probe[handler]["port"]);
        const int port = ResolvePort(c.spec, probe[handler]["port"]);
        auto it = a.listens.find(port);
        if (it == a.listens.end()) {
          problems.push_back(c.where + ": " + probe_name + " " + handler + " port " + ref +
                             " is not a port its flags listen on (" + ListensText(a.listens) + ")");
        } else if (std::string(handler) == "grpc" && it->second != "--health-listen") {
          problems.push_back(c.where + ": " + probe_name + " grpc port " + ref + " is " +
                             it->second +
                             "; the kubelet's gRPC probes speak plaintext only (hint: probe the "
                             "--health-listen port)");
        }
      }
    }
    const std::string annotated =
        Str(At(c.pod_template, {"metadata", "annotations", "prometheus.io/port"}));
    const Flag* metrics = FindFlag(a.flags, "--metrics-listen");
    if (!annotated.empty() && metrics != nullptr &&
        annotated != std::to_string(PortOf(metrics->value))) {
      problems.push_back(c.where + ": annotation prometheus.io/port \"" + annotated +
                         "\" is not its --metrics-listen port " + metrics->value);
    }
    // The addresses it dials: --coordinator must reach a container's --listen through a
    // Service; --advertise-address (the ranks dial it with the --listen port) likewise.
    if (const Flag* f = FindFlag(a.flags, "--coordinator")) {
      const YAML::Node* svc = ServiceOfHost(r, HostOf(f->value), c.ns);
      if (svc == nullptr) {
        problems.push_back(c.where + ": --coordinator=" + f->value +
                           " names no Service of these manifests");
      } else {
        bool reaches = false;
        for (const auto& p : (*svc)["spec"]["ports"]) {
          if (Str(p["port"]) != std::to_string(PortOf(f->value))) continue;
          for (const auto& [target, port] : Targets(all, *svc, p)) {
            reaches |= target->c.binary == "meshrun-coordinator" && target->listens.count(port) &&
                       target->listens.at(port) == "--listen";
          }
        }
        if (!reaches) {
          problems.push_back(c.where + ": --coordinator=" + f->value +
                             " does not lead to a coordinator's --listen port through Service/" +
                             Str((*svc)["metadata"]["name"]));
        }
      }
    }
    if (const Flag* f = FindFlag(a.flags, "--advertise-address")) {
      const YAML::Node* svc = ServiceOfHost(r, f->value, c.ns);
      const Flag* listen = FindFlag(a.flags, "--listen");
      const std::string port = listen ? std::to_string(PortOf(listen->value)) : "";
      bool reaches = false;
      if (svc != nullptr) {
        for (const auto& p : (*svc)["spec"]["ports"]) {
          if (Str(p["port"]) != port) continue;
          for (const auto& [target, target_port] : Targets(all, *svc, p)) {
            reaches |= target->c.where == c.where && std::to_string(target_port) == port;
          }
        }
      }
      if (!reaches) {
        problems.push_back(c.where + ": --advertise-address=" + f->value +
                           " is not a Service with port " + port +
                           " leading to its --listen (ranks dial HOST:" + port + ")");
      }
    }
  }
  // Services, ServiceMonitors, PodMonitors.
  for (const auto& obj : r.objects) {
    const std::string kind = Str(obj["kind"]);
    const std::string name = kind + "/" + Str(obj["metadata"]["name"]);
    const std::string ns = Str(obj["metadata"]["namespace"]);
    if (kind == "Service") {
      if (Selected(all, obj["spec"]["selector"], ns).empty()) {
        problems.push_back(name + ": its selector matches no pod of these manifests");
      }
      for (const auto& p : obj["spec"]["ports"]) {
        for (const auto& [target, port] : Targets(all, obj, p)) {
          if (target->listens.count(port) == 0) {
            problems.push_back(name + " port " + Str(p["name"]) + " (" + Str(p["port"]) +
                               ") targets " + Str(p["targetPort"] ? p["targetPort"] : p["port"]) +
                               ", which " + target->c.where + " does not listen on (" +
                               ListensText(target->listens) + ")");
          }
        }
      }
    } else if (kind == "ServiceMonitor") {
      std::vector<const YAML::Node*> services;
      for (const auto& s : r.objects) {
        if (Str(s["kind"]) == "Service" && Str(s["metadata"]["namespace"]) == ns &&
            SelectorMatches(At(obj, {"spec", "selector", "matchLabels"}),
                            s["metadata"]["labels"])) {
          services.push_back(&s);
        }
      }
      if (services.empty()) problems.push_back(name + ": its selector matches no Service");
      for (const auto& e : obj["spec"]["endpoints"]) {
        if (e["honorLabels"]) {
          problems.push_back(name + ": endpoint " + Str(e["port"]) +
                             " sets honorLabels (not needed: meshrun's labels never collide with "
                             "target labels, and it would overwrite the scrape job's `job`)");
        }
        for (const YAML::Node* s : services) {
          bool metrics = false;
          for (const auto& p : (*s)["spec"]["ports"]) {
            if (Str(p["name"]) != Str(e["port"])) continue;
            for (const auto& [target, port] : Targets(all, *s, p)) {
              metrics |=
                  target->listens.count(port) && target->listens.at(port) == "--metrics-listen";
            }
          }
          if (!metrics) {
            problems.push_back(name + ": endpoint port " + Str(e["port"]) + " of Service/" +
                               Str((*s)["metadata"]["name"]) +
                               " does not lead to a --metrics-listen port");
          }
        }
      }
    } else if (kind == "PodMonitor") {
      const auto pods = Selected(all, At(obj, {"spec", "selector", "matchLabels"}), ns);
      if (pods.empty()) problems.push_back(name + ": its selector matches no pod");
      for (const auto& e : obj["spec"]["podMetricsEndpoints"]) {
        if (e["honorLabels"]) {
          problems.push_back(name + ": endpoint " + Str(e["port"]) +
                             " sets honorLabels (not needed: meshrun's labels never collide with "
                             "target labels, and it would overwrite the scrape job's `job`)");
        }
        for (const Analyzed* a : pods) {
          const int port = ResolvePort(a->c.spec, e["port"]);
          if (a->listens.count(port) == 0 || a->listens.at(port) != "--metrics-listen") {
            problems.push_back(name + ": endpoint port " + Str(e["port"]) + " is not " +
                               a->c.where + "'s --metrics-listen port");
          }
        }
      }
    }
  }
  return problems;
}

void ExpectNoProblems(const Rendered& r) {
  for (const std::string& p : CheckRendering(r)) ADD_FAILURE() << r.source << ": " << p;
}

const YAML::Node* FindObject(const Rendered& r, const std::string& kind, const std::string& name) {
  for (const auto& obj : r.objects) {
    if (Str(obj["kind"]) == kind && Str(obj["metadata"]["name"]) == name) return &obj;
  }
  return nullptr;
}

const Container* FindContainer(const std::vector<Container>& all, const std::string& binary) {
  for (const auto& c : all) {
    if (c.binary == binary) return &c;
  }
  return nullptr;
}

// ---- Static checks ----------------------------------------------------------------------

const char* const kRenderings[] = {"", "overlays/cpu", "overlays/no-operator"};

TEST(ManifestStatic, RenderingsPass) {
  for (const std::string sub : kRenderings) {
    std::string error;
    const Rendered r = RenderManifests(K8sDir(sub), &error);
    ASSERT_EQ(error, "") << sub;
    ASSERT_NE(FindContainer(Containers(r), "meshrun-coordinator"), nullptr) << r.source;
    ASSERT_NE(FindContainer(Containers(r), "meshrun-worker"), nullptr) << r.source;
    ExpectNoProblems(r);
  }
}

// kubectl kustomize, where installed and new enough to build deploy/k8s (Debian's kubectl 1.20
// is not), renders exactly the objects of the tests' renderer: the cross-check that the subset
// implements what the manifests use as kustomize does. Skipped (reported so) otherwise.
TEST(ManifestKubectl, RendersTheSameObjectsAsTheTestsRenderer) {
  for (const std::string sub : kRenderings) {
    std::string error;
    const auto kubectl = RenderWithKubectl(K8sDir(sub), &error);
    if (!kubectl)
      GTEST_SKIP() << "kubectl is not on PATH: deploy/k8s is checked on the tests' "
                      "own rendering only";
    if (!error.empty()) {
      GTEST_SKIP() << "this kubectl cannot build deploy/k8s (its kustomize is too old?), so "
                      "only the tests' own rendering is checked: "
                   << error.substr(0, 300);
    }
    const Rendered ours = RenderManifests(K8sDir(sub), &error);
    ASSERT_EQ(error, "");
    auto key = [](const YAML::Node& o) {
      return Str(o["kind"]) + "/" + Str(o["metadata"]["namespace"]) + "/" +
             Str(o["metadata"]["name"]);
    };
    std::map<std::string, YAML::Node> theirs;
    for (const auto& o : kubectl->objects) theirs[key(o)] = o;
    EXPECT_EQ(ours.objects.size(), theirs.size()) << kubectl->source;
    for (const auto& o : ours.objects) {
      auto it = theirs.find(key(o));
      if (it == theirs.end()) {
        ADD_FAILURE() << kubectl->source << " has no " << key(o);
        continue;
      }
      EXPECT_EQ(YamlDifference(o, it->second), "")
          << key(o) << ": the tests' renderer and " << kubectl->source << " differ";
    }
  }
}

TEST(ManifestStatic, OverlaysChangeWhatTheySay) {
  std::string error;
  const auto base = RenderManifests(K8sDir(), &error);
  ASSERT_EQ(error, "");
  const auto cpu = RenderManifests(K8sDir("overlays/cpu"), &error);
  ASSERT_EQ(error, "");
  const auto plain = RenderManifests(K8sDir("overlays/no-operator"), &error);
  ASSERT_EQ(error, "");

  // Base: the GPU request is the ConfigMap's slots, the workers run cuda ranks.
  const YAML::Node* config = FindObject(base, "ConfigMap", "meshrun-worker");
  ASSERT_NE(config, nullptr);
  const std::string slots = Str((*config)["data"]["slots"]);
  const auto base_containers = Containers(base);
  const Container* worker = FindContainer(base_containers, "meshrun-worker");
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ(Str(At(worker->spec, {"resources", "limits", "nvidia.com/gpu"})), slots);
  EXPECT_EQ(Str(At(worker->spec, {"resources", "requests", "nvidia.com/gpu"})), slots);
  EXPECT_EQ(FindFlag(ParseFlags(worker->argv), "--device")->value, "cuda");
  EXPECT_EQ(FindFlag(ParseFlags(worker->argv), "--slots")->value, "$(MESHRUN_SLOTS)");
  EXPECT_EQ(Str(worker->pod_template["spec"]["hostIPC"]), "true");
  EXPECT_NE(FindObject(base, "ServiceMonitor", "meshrun-coordinator"), nullptr);
  EXPECT_NE(FindObject(base, "PodMonitor", "meshrun-worker"), nullptr);

  // cpu: --device=cpu (the patch addresses args by position), no GPU anywhere.
  const auto cpu_containers = Containers(cpu);
  const Container* cpu_worker = FindContainer(cpu_containers, "meshrun-worker");
  ASSERT_NE(cpu_worker, nullptr);
  const auto cpu_flags = ParseFlags(cpu_worker->argv);
  ASSERT_NE(FindFlag(cpu_flags, "--device"), nullptr);
  EXPECT_EQ(FindFlag(cpu_flags, "--device")->value, "cpu");
  EXPECT_EQ(cpu_flags.size(), ParseFlags(worker->argv).size());
  EXPECT_FALSE(At(cpu_worker->spec, {"resources", "limits"}));
  EXPECT_FALSE(At(cpu_worker->spec, {"resources", "requests", "nvidia.com/gpu"}));
  EXPECT_FALSE(cpu_worker->pod_template["spec"]["nodeSelector"]);
  EXPECT_EQ(Str(cpu_worker->pod_template["spec"]["volumes"][3]["name"]), "shm");

  // no-operator: the monitors are gone, everything else stays.
  EXPECT_EQ(FindObject(plain, "ServiceMonitor", "meshrun-coordinator"), nullptr);
  EXPECT_EQ(FindObject(plain, "PodMonitor", "meshrun-worker"), nullptr);
  EXPECT_EQ(plain.objects.size() + 2, base.objects.size());
}

// The checks must be able to fail: break a rendering in each way and expect the message.
TEST(ManifestStatic, ChecksNameWhatIsWrong) {
  std::string error;
  auto fresh = [&] { return RenderManifests(K8sDir(), &error); };
  auto problems_of = [](const Rendered& r) {
    std::string all;
    for (const auto& p : CheckRendering(r)) all += p + "\n";
    return all;
  };
  auto worker_of = [](Rendered& r) -> YAML::Node {
    for (auto& obj : r.objects) {
      if (Str(obj["kind"]) == "DaemonSet") return obj["spec"]["template"]["spec"]["containers"][0];
    }
    return YAML::Node();
  };
  {
    Rendered r = fresh();
    ASSERT_EQ(problems_of(r), "");
    worker_of(r)["args"].push_back("--no-such-flag=1");
    EXPECT_NE(problems_of(r).find("container worker: flag --no-such-flag is not an option of "
                                  "`meshrun-worker --help`"),
              std::string::npos)
        << problems_of(r);
  }
  {
    Rendered r = fresh();
    worker_of(r)["ports"][0]["containerPort"] = 9999;
    const std::string p = problems_of(r);
    EXPECT_NE(p.find("containerPort 9999 (metrics) is not a port its flags listen on"),
              std::string::npos)
        << p;
    EXPECT_NE(p.find("PodMonitor/meshrun-worker: endpoint port metrics"), std::string::npos) << p;
  }
  {
    Rendered r = fresh();
    worker_of(r)["readinessProbe"]["grpc"]["port"] = 9101;
    EXPECT_NE(problems_of(r).find("readinessProbe grpc port 9101 is --metrics-listen"),
              std::string::npos)
        << problems_of(r);
  }
  {
    Rendered r = fresh();
    YAML::Node args = worker_of(r)["args"];
    for (size_t i = 0; i < args.size(); ++i) {
      if (Str(args[i]).rfind("--coordinator=", 0) == 0) {
        args[i] = "--coordinator=meshrun-coordinator.meshrun.svc:9100";
      }
    }
    EXPECT_NE(problems_of(r).find("--coordinator=meshrun-coordinator.meshrun.svc:9100 does not "
                                  "lead to a coordinator's --listen port"),
              std::string::npos)
        << problems_of(r);
  }
  {
    Rendered r = fresh();
    for (auto& obj : r.objects) {
      if (Str(obj["kind"]) == "Service" && Str(obj["metadata"]["name"]) == "meshrun-coordinator") {
        obj["spec"]["ports"][2]["targetPort"] = 8082;
      }
    }
    EXPECT_NE(problems_of(r).find("Service/meshrun-coordinator port health (8081) targets 8082"),
              std::string::npos)
        << problems_of(r);
  }
  {
    Rendered r = fresh();
    YAML::Node args = worker_of(r)["args"];
    YAML::Node kept(YAML::NodeType::Sequence);
    for (const auto& a : args) {
      if (Str(a).rfind("--work-dir", 0) != 0) kept.push_back(a);
    }
    worker_of(r)["args"] = kept;
    EXPECT_NE(problems_of(r).find("meshrun-worker requires --work-dir"), std::string::npos)
        << problems_of(r);
  }
}

// ---- deploy/docker ------------------------------------------------------------------------

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Words of a text with comments (# to the end of a line) removed.
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line.substr(0, line.find('#')));
    for (std::string w; in >> w;) words.push_back(w);
  }
  return words;
}

// No docker here: check what the Dockerfiles take from the tree. The builder installs only
// packages of scripts/setup, builds targets and uses CMake options that exist, copies out
// binaries CMake makes and folders that exist (and .dockerignore keeps), runs as the uid the
// manifests ask for.
TEST(ManifestStatic, DockerfilesMatchTheTree) {
  const std::string setup = ReadText(SourceDir() + "/scripts/setup");
  const size_t begin = setup.find("PACKAGES=(");
  ASSERT_NE(begin, std::string::npos) << "scripts/setup has no PACKAGES=( list";
  const size_t end = setup.find("\n)", begin);
  std::set<std::string> setup_packages;
  for (const auto& w : Words(setup.substr(begin + 10, end - begin - 10))) {
    setup_packages.insert(w);
  }
  std::string cmake_text;
  for (const auto& entry : fs::recursive_directory_iterator(SourceDir())) {
    const std::string path = entry.path().string();
    if (entry.path().filename() == "CMakeLists.txt" && path.find("/build") == std::string::npos) {
      cmake_text += ReadText(path);
    }
  }
  const std::string dockerignore = ReadText(SourceDir() + "/.dockerignore");
  std::string k8s_error;
  const Rendered base = RenderManifests(K8sDir(), &k8s_error);
  ASSERT_EQ(k8s_error, "");

  for (const std::string name : {"Dockerfile.cpu", "Dockerfile.cuda"}) {
    const std::string path = SourceDir() + "/deploy/docker/" + name;
    const std::string text = ReadText(path);
    ASSERT_FALSE(text.empty()) << path;
    // Join continuation lines, then look at each instruction.
    std::string joined = std::regex_replace(text, std::regex("\\\\\n"), " ");
    std::istringstream lines(joined);
    int stage = -1;
    bool copies_tree = false, builds = false;
    std::string user;
    for (std::string line; std::getline(lines, line);) {
      const auto words = Words(line);
      if (words.empty()) continue;
      if (words[0] == "FROM") ++stage;
      if (words[0] == "USER") user = words[1];
      if (words[0] == "COPY" && words.size() >= 3 && words[1] == "." && stage == 0) {
        copies_tree = true;
      }
      if (words[0] == "COPY" && words[1].rfind("--from=builder", 0) == 0) {
        for (size_t i = 2; i + 1 < words.size(); ++i) {
          const std::string& src = words[i];
          if (src.rfind("/src/build/bin/", 0) == 0) {
            const std::string bin = src.substr(15);
            EXPECT_NE(cmake_text.find("OUTPUT_NAME " + bin + ")"), std::string::npos)
                << name << ": COPY " << src << ": no CMake executable is named " << bin;
          } else if (src.rfind("/src/", 0) == 0) {
            EXPECT_TRUE(fs::exists(SourceDir() + "/" + src.substr(5)))
                << name << ": COPY " << src << " is not in the tree";
            EXPECT_EQ(dockerignore.find("\n" + src.substr(5) + "\n"), std::string::npos)
                << name << ": COPY " << src << " is excluded by .dockerignore";
          }
        }
      }
      if (words[0] != "RUN") continue;
      for (size_t i = 0; i < words.size(); ++i) {
        // The builder's packages come from scripts/setup.
        if (stage == 0 && words[i] == "install") {
          for (size_t j = i + 1; j < words.size() && words[j] != "&&"; ++j) {
            if (words[j][0] == '-') continue;
            EXPECT_TRUE(setup_packages.count(words[j]))
                << name << ": the builder installs " << words[j]
                << ", which is not in scripts/setup's PACKAGES (hint: keep them in step)";
          }
        }
        if (words[i].rfind("-D", 0) == 0) {
          const std::string option = words[i].substr(2, words[i].find('=') - 2);
          if (option.rfind("CMAKE_", 0) == 0) continue;
          const std::string top = ReadText(SourceDir() + "/CMakeLists.txt");
          EXPECT_NE(top.find("set(" + option + " "), std::string::npos)
              << name << ": -D" << option << " is not an option of CMakeLists.txt";
        }
        if (words[i] == "--target") {
          builds = true;
          for (size_t j = i + 1; j < words.size() && words[j] != "&&"; ++j) {
            EXPECT_NE(cmake_text.find("meshrun_add_executable(" + words[j] + " "),
                      std::string::npos)
                << name << ": --target " << words[j] << " is not a CMake executable";
          }
        }
      }
    }
    EXPECT_TRUE(copies_tree) << name << ": the builder does not COPY . (the source tree)";
    EXPECT_TRUE(builds) << name << ": no cmake --build --target";
    EXPECT_EQ(stage, 1) << name << ": expected two stages (builder, runtime)";
    for (const auto& c : Containers(base)) {
      const std::string uid = Str(At(c.pod_template, {"spec", "securityContext", "runAsUser"}));
      EXPECT_EQ(user, uid + ":" + uid)
          << name << ": USER " << user << " but " << c.where << " runs as uid " << uid;
    }
  }
}

// ---- The daemons, started with the manifests' arguments ---------------------------------

// Runs a container's arguments on this machine: $(VAR) from its env, paths under `root`,
// listen addresses on 127.0.0.1 with the ports of `ports`, Service addresses resolved.
class LocalRun {
 public:
  LocalRun(const Rendered& r, const std::string& root, std::map<int, int>* coordinator_ports)
      : r_(r), root_(root), coordinator_ports_(coordinator_ports) {}

  std::string Expand(const Container& c, std::string s) const {
    for (const auto& e : c.spec["env"]) {
      std::string value = Str(e["value"]);
      if (At(e, {"valueFrom", "fieldRef"})) {
        const std::string field = Str(At(e, {"valueFrom", "fieldRef", "fieldPath"}));
        value = field == "spec.nodeName"  ? "node-test"
                : field == "status.podIP" ? "127.0.0.1"
                                          : "field-" + field;
      } else if (At(e, {"valueFrom", "configMapKeyRef"})) {
        for (const auto& obj : r_.objects) {
          if (Str(obj["kind"]) == "ConfigMap" &&
              Str(obj["metadata"]["name"]) ==
                  Str(At(e, {"valueFrom", "configMapKeyRef", "name"}))) {
            value = Str(obj["data"][Str(At(e, {"valueFrom", "configMapKeyRef", "key"}))]);
          }
        }
      }
      const std::string ref = "$(" + Str(e["name"]) + ")";
      for (size_t at; (at = s.find(ref)) != std::string::npos;) s.replace(at, ref.size(), value);
    }
    return s;
  }

  // argv for the binary; flags the binary lacks are dropped and listed in `dropped`;
  // `files` maps each path flag to its local path.
  std::vector<std::string> Argv(const Container& c, std::map<int, int>* ports,
                                std::vector<std::string>* dropped,
                                std::map<std::string, std::string>* files) const {
    std::vector<std::string> argv = {BinaryDir() + "/bin/" + c.binary};
    const HelpOptions& help = Help(c.binary);
    for (const Flag& raw : ParseFlags(c.argv)) {
      if (help.options.count(raw.name) == 0) {
        dropped->push_back(raw.name);
        continue;
      }
      std::string value = Expand(c, raw.value);
      const auto& listen = ListenFlags();
      if (std::find(listen.begin(), listen.end(), raw.name) != listen.end()) {
        const int port = PortOf(value);
        if (ports->count(port) == 0) (*ports)[port] = FreePort();
        value = "127.0.0.1:" + std::to_string(ports->at(port));
      } else if (raw.name == "--advertise-address") {
        value = "127.0.0.1";
      } else if (raw.name == "--coordinator") {
        value = "127.0.0.1:" + std::to_string(CoordinatorPort(c, value));
      } else if (!value.empty() && value[0] == '/') {
        value = root_ + value;
        fs::create_directories(fs::path(value).parent_path());
        const auto ends_with = [&](const std::string& end) {
          return raw.name.size() > end.size() &&
                 raw.name.compare(raw.name.size() - end.size(), end.size(), end) == 0;
        };
        if (ends_with("-dir") || ends_with("-root")) {
          fs::create_directories(value);
        }
        (*files)[raw.name] = value;
      }
      argv.push_back(raw.has_value ? raw.name + "=" + value : raw.name);
    }
    return argv;
  }

 private:
  // The local port of the coordinator container port a Service address leads to.
  int CoordinatorPort(const Container& c, const std::string& address) const {
    const YAML::Node* svc = ServiceOfHost(r_, HostOf(address), c.ns);
    if (svc == nullptr) return -1;
    for (const auto& p : (*svc)["spec"]["ports"]) {
      if (Str(p["port"]) != std::to_string(PortOf(address))) continue;
      for (const auto& target : Containers(r_)) {
        if (target.binary != "meshrun-coordinator") continue;
        const int port = ResolvePort(target.spec, p["targetPort"] ? p["targetPort"] : p["port"]);
        if (coordinator_ports_->count(port)) return coordinator_ports_->at(port);
      }
    }
    return -1;
  }

  const Rendered& r_;
  std::string root_;
  std::map<int, int>* coordinator_ports_;
};

bool Openssl(const std::string& args, std::string* log) {
  const CommandResult r = RunCommand("openssl " + args + " 2>&1");
  *log += "openssl " + args + "\n" + r.out;
  return r.status == 0;
}

// A CA, the coordinator's server certificate (the advertised Service name, localhost and
// 127.0.0.1) and a worker client certificate (CN = the worker's --name), into `dir`.
bool MakeTls(const std::string& dir, const std::string& service_host,
             const std::string& worker_name, std::string* log) {
  const std::string d = dir + "/";
  std::ofstream(d + "server.ext") << "subjectAltName=DNS:" << service_host
                                  << ",DNS:localhost,IP:127.0.0.1\n"
                                  << "extendedKeyUsage=serverAuth\n";
  std::ofstream(d + "client.ext") << "extendedKeyUsage=clientAuth\n";
  return Openssl("req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=meshrun-test-ca -keyout " +
                     d + "ca.key -out " + d + "ca.crt",
                 log) &&
         Openssl("req -newkey rsa:2048 -nodes -subj /CN=" + service_host + " -keyout " + d +
                     "server.key -out " + d + "server.csr",
                 log) &&
         Openssl("x509 -req -in " + d + "server.csr -CA " + d + "ca.crt -CAkey " + d +
                     "ca.key -CAcreateserial -days 2 -extfile " + d + "server.ext -out " + d +
                     "server.crt",
                 log) &&
         Openssl("req -newkey rsa:2048 -nodes -subj /CN=" + worker_name + " -keyout " + d +
                     "client.key -out " + d + "client.csr",
                 log) &&
         Openssl("x509 -req -in " + d + "client.csr -CA " + d + "ca.crt -CAkey " + d +
                     "ca.key -CAcreateserial -days 2 -extfile " + d + "client.ext -out " + d +
                     "client.crt",
                 log);
}

void CopyFile(const std::string& from, const std::string& to) {
  fs::create_directories(fs::path(to).parent_path());
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Polls a gRPC probe of the manifest until it answers SERVING (1) or `limit` passes; the last
// answer.
int WaitServing(int port, const std::string& service, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int answer = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    answer = HealthCheck(port, service);
    if (answer == 1) return answer;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return answer;
}

// Asks every probe of `c` (ports mapped by `ports`) and scrapes its --metrics-listen port.
void ExpectProbesAndMetrics(const Container& c, const std::map<int, int>& ports,
                            const std::string& metric, const std::string& stderr_path) {
  int asked = 0;
  for (const char* probe_name : {"startupProbe", "livenessProbe", "readinessProbe"}) {
    const YAML::Node grpc = At(c.spec, {probe_name, "grpc"});
    if (!grpc) continue;
    const int port = ResolvePort(c.spec, grpc["port"]);
    ASSERT_TRUE(ports.count(port)) << c.where << ": " << probe_name << " port " << port;
    const std::string service = Str(grpc["service"]);
    EXPECT_EQ(WaitServing(ports.at(port), service, seconds(30)), 1)
        << c.where << ": " << probe_name << " (grpc port " << port << ", service \"" << service
        << "\") is not SERVING; stderr:\n"
        << ReadAll(stderr_path);
    ++asked;
  }
  EXPECT_GE(asked, 2) << c.where << ": expected gRPC liveness and readiness probes";
  const Flag* metrics = FindFlag(ParseFlags(c.argv), "--metrics-listen");
  ASSERT_NE(metrics, nullptr) << c.where;
  const std::string path =
      Str(At(c.pod_template, {"metadata", "annotations", "prometheus.io/path"})).empty()
          ? "/metrics"
          : Str(At(c.pod_template, {"metadata", "annotations", "prometheus.io/path"}));
  const std::string body = HttpGet(ports.at(PortOf(metrics->value)), path);
  EXPECT_NE(body.find(metric), std::string::npos)
      << c.where << ": GET " << path << " on the --metrics-listen port (" << metrics->value
      << ") has no " << metric << ":\n"
      << body.substr(0, 2000);
}

TEST(ManifestDaemons, ProbesAndScrapesAnswerWithTheManifestsArguments) {
  std::string error;
  std::optional<Rendered> r = RenderManifests(K8sDir(), &error);
  ASSERT_EQ(error, "");
  const auto containers = Containers(*r);
  const Container* coordinator = FindContainer(containers, "meshrun-coordinator");
  const Container* worker = FindContainer(containers, "meshrun-worker");
  ASSERT_NE(coordinator, nullptr);
  ASSERT_NE(worker, nullptr);
  ASSERT_EQ(Help("meshrun-coordinator").error, "");
  ASSERT_EQ(Help("meshrun-worker").error, "");

  char tmpl[] = "/tmp/meshrun-manifest-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  std::map<int, int> coordinator_ports, worker_ports;
  LocalRun local(*r, root + "/fs", &coordinator_ports);
  std::vector<std::string> dropped_c, dropped_w;
  std::map<std::string, std::string> files_c, files_w;
  const auto argv_c = local.Argv(*coordinator, &coordinator_ports, &dropped_c, &files_c);
  const auto argv_w = local.Argv(*worker, &worker_ports, &dropped_w, &files_w);
  for (const auto& f : dropped_c) {
    std::cout << "[ note ] " << coordinator->where << ": " << f
              << " dropped (not an option of this meshrun-coordinator yet)\n";
  }
  for (const auto& f : dropped_w) {
    std::cout << "[ note ] " << worker->where << ": " << f
              << " dropped (not an option of this meshrun-worker yet)\n";
  }

  // TLS material and the token file, where the (kept) flags point.
  if (files_c.count("--tls-cert") || files_w.count("--tls-cert")) {
    if (RunCommand("command -v openssl").status != 0) {
      GTEST_SKIP() << "openssl is not installed: cannot make the certificates the manifests' "
                      "--tls-* flags need (scripts/setup installs it)";
    }
    std::string log;
    const Flag* advertise = FindFlag(ParseFlags(coordinator->argv), "--advertise-address");
    const std::string worker_name =
        local.Expand(*worker, FindFlag(ParseFlags(worker->argv), "--name")->value);
    ASSERT_TRUE(MakeTls(root, advertise ? advertise->value : "localhost", worker_name, &log))
        << log;
    auto place = [&](std::map<std::string, std::string>& files, const std::string& cert,
                     const std::string& key) {
      if (files.count("--tls-cert")) CopyFile(root + "/" + cert, files["--tls-cert"]);
      if (files.count("--tls-key")) CopyFile(root + "/" + key, files["--tls-key"]);
      if (files.count("--tls-ca")) CopyFile(root + "/ca.crt", files["--tls-ca"]);
    };
    place(files_c, "server.crt", "server.key");
    place(files_w, "client.crt", "client.key");
  }
  if (files_c.count("--token-file")) std::ofstream(files_c["--token-file"]) << "test-token\n";

  std::string joined;
  for (const auto& a : argv_c) joined += " " + a;
  std::cout << "[ coordinator ]" << joined << "\n";
  testing::Subprocess c_proc(argv_c, root + "/coordinator.stderr");
  const auto line = c_proc.ReadLine(seconds(30));
  ASSERT_TRUE(line.has_value()) << "meshrun-coordinator did not start with the manifest's "
                                   "arguments; stderr:\n"
                                << ReadAll(root + "/coordinator.stderr");
  ExpectProbesAndMetrics(*coordinator, coordinator_ports, "meshrun_", root + "/coordinator.stderr");

  joined.clear();
  for (const auto& a : argv_w) joined += " " + a;
  std::cout << "[ worker ]" << joined << "\n";
  testing::Subprocess w_proc(argv_w, root + "/worker.stderr");
  // Readiness ("") turns SERVING only once the worker's session to the coordinator is up.
  ExpectProbesAndMetrics(*worker, worker_ports, "meshrun_worker", root + "/worker.stderr");
  // And the coordinator sees it READY (with TLS: under its certificate's name).
  const Flag* metrics = FindFlag(ParseFlags(coordinator->argv), "--metrics-listen");
  const std::string body = HttpGet(coordinator_ports.at(PortOf(metrics->value)), "/metrics");
  EXPECT_TRUE(
      std::regex_search(body, std::regex(R"(meshrun_workers\{[^}]*state="READY"[^}]*\} 1)")))
      << body.substr(0, 3000) << "\nworker stderr:\n"
      << ReadAll(root + "/worker.stderr");

  w_proc.Signal(SIGTERM);
  EXPECT_TRUE(w_proc.Wait(seconds(20)).has_value());
  c_proc.Signal(SIGTERM);
  EXPECT_TRUE(c_proc.Wait(seconds(20)).has_value());
  if (!::testing::Test::HasFailure()) fs::remove_all(root);
}

}  // namespace
}  // namespace meshrun::deploy_test
