// What the tests of clients that are not meshrun's share (python_client_test.cc,
// one_spec_test.cc): the tests' Python venv (grpcio-tools from PyPI), `meshrun` pointed at a
// coordinator, waiting for a cluster's workers to be READY, and the logs printed on a failure.
#pragma once

#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/integration/daemons.h"
#include "tests/integration/reference_suite.h"

namespace meshrun::testing {

// The tests' Python venv (tests/python/make-venv into BUILD/test-venv), made once per build
// folder and reused by later runs (make-venv's stamp). Empty, with `why`, when it cannot be
// made (no python3-venv, PyPI unreachable): the caller skips.
inline std::filesystem::path TestPythonVenv(std::string* why) {
  const std::filesystem::path venv = BinDir().parent_path() / "test-venv";
  const std::filesystem::path log = BinDir().parent_path() / "test-venv.make.log";
  const CliResult r =
      RunCli(TestSourceDir() / "tests" / "python" / "make-venv", {venv.string()}, log, 900);
  if (r.exit_code != 0) {
    *why = "the tests' Python virtual environment could not be made (exit " +
           std::to_string(r.exit_code) + "): " + ReadFile(log);
    return {};
  }
  return venv;
}

// `meshrun ARGS --coordinator ADDRESS`, its stderr in DIR/cli.err.
inline CliResult CoordinatorCli(const std::string& address, const std::filesystem::path& dir,
                                std::vector<std::string> args, int timeout_s = 30) {
  args.push_back("--coordinator");
  args.push_back(address);
  return RunCli(BinDir() / "meshrun", args, dir / "cli.err", timeout_s);
}

// Whether `meshrun workers` listed `count` workers, all READY, within 30 s.
inline bool WaitForReadyWorkers(const std::string& address, const std::filesystem::path& dir,
                                size_t count) {
  for (int i = 0; i < 300; ++i) {
    const CliResult r = CoordinatorCli(address, dir, {"workers", "-o", "json"}, 5);
    if (r.exit_code == 0) {
      const nlohmann::json w = nlohmann::json::parse(r.out, nullptr, false);
      bool ready = w.is_array() && w.size() == count;
      for (size_t k = 0; ready && k < count; ++k) ready = w[k]["state"] == "READY";
      if (ready) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// After a test: on failure the logs `names` of `dir` go to stderr and `dir` is kept; else it is
// removed.
inline void KeepLogsOnFailure(bool failed, const std::filesystem::path& dir,
                              std::initializer_list<const char*> names) {
  if (dir.empty()) return;
  if (!failed) {
    std::filesystem::remove_all(dir);
    return;
  }
  std::cerr << "logs kept in " << dir << std::endl;
  for (const char* name : names)
    std::cerr << "---- " << name << "\n" << ReadFile(dir / name) << "\n";
}

}  // namespace meshrun::testing
