// SubmitJob from a client that is not meshrun's: Python code generated from proto/ with current
// grpcio-tools (PyPI, in the tests' virtual environment made by tests/python/make-venv) submits
// a spec with only the fields a YAML user writes (tests/integration/python_submit.py) to a real
// coordinator with one worker on loopback. The job must train to SUCCEEDED with the defaults of
// the YAML path (cp_comm_strategy "allgather", lr, seed, …) filled in by the coordinator.
// Skips, saying why, only when the virtual environment cannot be made (no python3-venv, PyPI
// unreachable) or the binaries or corpus are missing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/job_spec.h"
#include "tests/client/cli_runner.h"
#include "tests/integration/daemons.h"
#include "tests/integration/python_cluster.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using testing::BinDir;
using testing::Daemon;
using testing::FreePort;
using testing::Spawn;

using testing::kCorpus;

fs::path SourceDir() {
  return testing::TestSourceDir();
}

class PythonClientTest : public ::testing::Test {
 protected:
  // The venv is made once per build folder and reused by later runs (make-venv's stamp).
  static void SetUpTestSuite() { venv_ = testing::TestPythonVenv(&venv_error_); }

  void SetUp() override {
    if (venv_.empty()) GTEST_SKIP() << venv_error_;
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(BinDir() / bin)) GTEST_SKIP() << (BinDir() / bin) << " is not built";
    }
    if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing (apt-get install fortunes)";
    char pattern[] = "/tmp/meshrun_python_client_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    address_ = "127.0.0.1:" + std::to_string(FreePort());
  }

  void TearDown() override {
    for (Daemon* d : {&worker_, &coordinator_}) {
      if (d->pid > 0) testing::Stop(*d, 10s);
    }
    testing::KeepLogsOnFailure(HasFailure(), dir_,
                               {"coordinator.log", "worker-1.log", "python.err"});
  }

  testing::CliResult Cli(std::vector<std::string> args, int timeout_s = 30) {
    return testing::CoordinatorCli(address_, dir_, std::move(args), timeout_s);
  }

  void StartCluster() {
    coordinator_ = Spawn("coordinator",
                         {(BinDir() / "meshrun-coordinator").string(), "--listen", address_,
                          "--state-dir", (dir_ / "state").string()},
                         dir_ / "coordinator.log");
    worker_ = Spawn(
        "worker-1",
        {(BinDir() / "meshrun-worker").string(), "--coordinator", address_, "--name", "worker-1",
         "--slots", "2", "--work-dir", (dir_ / "work").string(), "--cores", "1", "--grace", "2"},
        dir_ / "worker-1.log");
    if (!testing::WaitForReadyWorkers(address_, dir_, 1))
      FAIL() << "the worker did not become READY on " << address_;
  }

  static fs::path venv_;
  static std::string venv_error_;
  fs::path dir_;
  std::string address_;
  Daemon coordinator_, worker_;
};

fs::path PythonClientTest::venv_;
std::string PythonClientTest::venv_error_;

TEST_F(PythonClientTest, MinimalSpecFromGeneratedPythonClientTrainsWithTheYamlDefaults) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const testing::CliResult py = testing::RunCli(
      venv_ / "bin" / "python",
      {(SourceDir() / "tests" / "integration" / "python_submit.py").string(), "--proto-dir",
       (SourceDir() / "proto").string(), "--out", (dir_ / "gen").string(), "--coordinator",
       address_, "--train", kCorpus, "--timeout", "240"},
      dir_ / "python.err", 300);
  const json result = json::parse(py.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << "exit " << py.exit_code << ", stdout: " << py.out
                                  << "\nstderr: " << py.err;
  std::cout << "grpcio-tools " << result.value("grpcio_tools", "?") << "\n";
  ASSERT_FALSE(result.contains("submit_error"))
      << "SubmitJob refused the minimal spec: " << result["submit_error"].dump();
  ASSERT_EQ(py.exit_code, 0) << result.dump();
  const json& job = result["job"];
  ASSERT_EQ(job.value("state", ""), "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job.value("step", ""), "3") << job.dump();  // int64 fields are strings in JSON

  // The coordinator stored the resolved spec: every field the client left out holds the
  // default a YAML spec that leaves it out gets (common/job_spec.h), and what it set is kept.
  const JobSpec defaults;
  const json& spec = job["spec"];
  EXPECT_EQ(spec["parallelism"].value("cp_comm_strategy", ""),
            defaults.parallelism.cp_comm_strategy);
  EXPECT_EQ(spec["parallelism"].value("tp_size", -1), defaults.parallelism.tp_size);
  EXPECT_EQ(spec["parallelism"].value("dp_shard_size", -1), 2);
  EXPECT_EQ(spec["train"].value("lr", -1.0), defaults.train.lr);
  EXPECT_EQ(spec["train"].value("seed", ""), std::to_string(defaults.train.seed));
  EXPECT_EQ(spec["train"].value("precision", ""), defaults.train.precision);
  EXPECT_EQ(spec["data"].value("format", ""), defaults.data.format);
  EXPECT_EQ(spec["resources"].value("device", ""), defaults.resources.device);
  EXPECT_EQ(spec.value("name", ""), "python-minimal");

  // And meshrun's own client sees the same job.
  const testing::CliResult status =
      Cli({"status", result["job_id"].get<std::string>(), "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const json st = json::parse(status.out, nullptr, false);
  ASSERT_TRUE(st.is_object()) << status.out;
  EXPECT_EQ(st["state"], "SUCCEEDED");
  EXPECT_EQ(st["steps"], 3);
  EXPECT_EQ(st["ranks"].size(), 2u);
}

}  // namespace
}  // namespace meshrun
