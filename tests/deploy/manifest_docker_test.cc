// deploy/docker against the tree (unit, ManifestStatic like the renderings' checks): no docker
// here; what the Dockerfiles install, build, copy and run as must exist in the tree and agree
// with the manifests.
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

}  // namespace
}  // namespace meshrun::deploy_test
