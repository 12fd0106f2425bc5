// A suite of `meshrun train` runs against a Python reference in the model venv
// (tests/reference/*.py, tests/python/make-venv with requirements-models.txt): the reference's
// `prepare DIR` runs once for the suite, writing its models and data into a fresh folder and
// printing its losses (JSON); each test trains with the built `meshrun` and compares. Used by
// hf_models_test.cc and attention_masks_test.cc.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun::testing {

// The source tree (MESHRUN_SOURCE_DIR, set by ctest; else the working directory).
inline std::filesystem::path TestSourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::current_path();
}

// The build folder (MESHRUN_BINARY_DIR, set by ctest; else build/).
inline std::filesystem::path TestBuildDir() {
  const char* dir = std::getenv("MESHRUN_BINARY_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::path("build");
}

// `Suite` (the derived fixture, which gives each suite its own statics) names its reference
// script under tests/reference (kReferenceScript) and its folder's mkdtemp prefix (kTempPrefix).
// A venv that cannot be made skips the suite, saying why; a failing `prepare` fails it.
template <typename Suite>
class ReferenceSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    python_ = ModelVenvPython(TestSourceDir(), &error_);
    if (python_.empty()) return;
    std::string pattern = std::string("/tmp/") + Suite::kTempPrefix + "_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = pattern;
    CliResult r =
        RunCli(python_, {ReferenceScript(), "prepare", dir_.string()}, dir_ / "prepare.err", 600);
    if (r.exit_code != 0) {
      error_ = std::string(Suite::kReferenceScript) + " prepare failed: " + r.err;  // a failure
      return;
    }
    reference_ = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  static void TearDownTestSuite() {
    if (!dir_.empty() && !kept_) std::filesystem::remove_all(dir_);
  }

  static std::string ReferenceScript() {
    return (TestSourceDir() / "tests" / "reference" / Suite::kReferenceScript).string();
  }

  void SetUp() override {
    if (python_.empty()) GTEST_SKIP() << error_;
    ASSERT_TRUE(error_.empty()) << error_;
    ASSERT_TRUE(reference_.is_object()) << "the reference printed no JSON";
    meshrun_ = TestBuildDir() / "bin" / "meshrun";
    ASSERT_TRUE(std::filesystem::exists(meshrun_)) << meshrun_;
  }

  void TearDown() override {
    if (HasFailure()) {
      kept_ = true;
      std::cerr << "files kept in " << dir_ << std::endl;
    }
  }

  // `meshrun train -o json` losses, with --set overrides; empty on failure (reported).
  std::vector<double> Train(const std::filesystem::path& spec, int nproc,
                            const std::vector<std::string>& sets) {
    std::vector<std::string> args = {
        "train", "-f", spec.string(), "--nproc", std::to_string(nproc), "-o", "json"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const CliResult r = RunCli(meshrun_, args, dir_ / "train.err", 300);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const std::string& line : Lines(r.out)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "summary") {
        return j["losses"].get<std::vector<double>>();
      }
    }
    ADD_FAILURE() << "no summary in: " << r.out << r.err;
    return {};
  }

  // got[k] against want[k]: the first step (a pure forward of the loaded weights) within
  // first_tol (relative), later ones within later_tol (they also carry the updates' float32
  // rounding). Prints the largest relative difference.
  static void ExpectLosses(const std::vector<double>& got, const std::vector<double>& want,
                           double first_tol, double later_tol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::fabs(got[k] / want[k] - 1));
    std::cout << what << ": largest relative difference " << worst << std::endl;
    for (size_t k = 0; k < got.size(); ++k) {
      const double tol = k == 0 ? first_tol : later_tol;
      EXPECT_LE(std::fabs(got[k] - want[k]), tol * std::fabs(want[k]))
          << what << " step " << k + 1 << ": meshrun " << got[k] << ", reference " << want[k];
    }
  }

  static inline std::filesystem::path python_, dir_;
  static inline std::string error_;
  static inline nlohmann::json reference_;
  static inline bool kept_ = false;
  std::filesystem::path meshrun_;
};

}  // namespace meshrun::testing
