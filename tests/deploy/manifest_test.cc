// deploy/k8s against the real binaries, static checks (unit): every flag a container passes is
// an option its binary's --help lists (and every REQUIRED one is passed); every containerPort,
// Service port, probe port, monitor port and prometheus.io/port annotation is a port the
// container's --listen / --metrics-listen / --health-listen flags make it listen on; the
// addresses the daemons dial name a Service that leads to those ports. They run on the
// renderings of the base and both overlays by the tests' own kustomize subset
// (tests/deploy/kustomize.h: no kubectl needed); manifest_kubectl_test.cc renders them with the
// real kubectl of the tests' virtual environment, requires the same objects and validates them
// strictly against the Kubernetes schemas (docs/decisions/0046-kubectl-from-pypi.md). The
// Dockerfiles are checked against the tree in manifest_docker_test.cc, the daemons started with the
// manifests' arguments in manifest_daemons_test.cc.
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
#include "tests/deploy/manifest_test_util.h"

namespace meshrun::deploy_test {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

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

}  // namespace
}  // namespace meshrun::deploy_test
