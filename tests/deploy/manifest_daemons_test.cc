// deploy/k8s, the daemon check (integration): starts meshrun-coordinator and meshrun-worker
// with the manifests' arguments (paths moved into a temporary folder, addresses to 127.0.0.1
// with ephemeral ports, TLS material made with openssl) and asks the manifests' probes and
// scrapes.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

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
  auto argv_w = local.Argv(*worker, &worker_ports, &dropped_w, &files_w);
  // The manifest's workers own GPUs (--device=cuda), and a cuda worker on a node without one
  // refuses to start (exit 2, docs/gpu.md). Without a GPU here, the same arguments run on cpu
  // slots: every other flag, the probes and the metrics are still the manifest's.
  if (access("/dev/nvidiactl", F_OK) != 0) {
    for (std::string& a : argv_w) {
      if (a == "--device=cuda") {
        a = "--device=cpu";
        std::cout << "[ note ] " << worker->where
                  << ": --device=cuda run as --device=cpu (no GPU on this machine)\n";
      }
    }
  }
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
