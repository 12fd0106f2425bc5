// One resolved spec (decision 0048), end to end through a client that is not meshrun's: Python
// code generated from proto/ (grpcio-tools, tests/integration/python_init_from.py) submits a job
// with `model.init_from` (a tiny GPT-2 folder the script writes) and no model sizes on a
// 2-worker cluster, dp_shard 2 × tp 2, then the same job again with more steps. The coordinator
// runs in its own mount namespace with an empty tmpfs over the data folder (the folder, the
// corpus and checkpoint.dir), so it can neither read config.json nor see a checkpoint: the sizes
// are read by the ranks, and the second job resumes because rank 0 chose the checkpoint. Needs
// root (unshare -m, mount); skips, saying why, without it or without the tests' venv.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

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

fs::path OneSpecSourceDir() {
  return testing::TestSourceDir();
}

class OneSpecTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { venv_ = testing::TestPythonVenv(&venv_error_); }

  void SetUp() override {
    if (venv_.empty()) GTEST_SKIP() << venv_error_;
    if (geteuid() != 0) GTEST_SKIP() << "needs root for unshare -m and mount";
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(BinDir() / bin)) GTEST_SKIP() << (BinDir() / bin) << " is not built";
    }
    if (!fs::exists(testing::kCorpus)) GTEST_SKIP() << testing::kCorpus << " is missing";
    const testing::CliResult probe =
        testing::RunCli("/usr/bin/unshare", {"-m", "true"}, "/dev/null", 10);
    if (probe.exit_code != 0) GTEST_SKIP() << "unshare -m is refused here: " << probe.err;
    char pattern[] = "/tmp/meshrun_one_spec_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    data_ = dir_ / "data";
    fs::create_directories(data_);
    fs::copy_file(testing::kCorpus, data_ / "corpus.txt");
    address_ = "127.0.0.1:" + std::to_string(FreePort());
  }

  void TearDown() override {
    for (Daemon* d : {&worker1_, &worker2_, &coordinator_}) {
      if (d->pid > 0) testing::Stop(*d, 10s);
    }
    testing::KeepLogsOnFailure(HasFailure(), dir_,
                               {"coordinator.log", "worker-1.log", "worker-2.log", "python.err"});
  }

  testing::CliResult Cli(std::vector<std::string> args, int timeout_s = 30) {
    return testing::CoordinatorCli(address_, dir_, std::move(args), timeout_s);
  }

  void StartCluster() {
    // The coordinator sees an empty tmpfs where the data folder is.
    const std::string script = "mount -t tmpfs none '" + data_.string() + "' && exec '" +
                               (BinDir() / "meshrun-coordinator").string() + "' --listen " +
                               address_ + " --state-dir '" + (dir_ / "state").string() + "'";
    coordinator_ =
        Spawn("coordinator",
              {"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script},
              dir_ / "coordinator.log");
    auto worker = [&](const std::string& name) {
      return Spawn(name,
                   {(BinDir() / "meshrun-worker").string(), "--coordinator", address_, "--name",
                    name, "--slots", "2", "--work-dir", (dir_ / ("work-" + name)).string(),
                    "--cores", "1", "--grace", "2"},
                   dir_ / (name + ".log"));
    };
    worker1_ = worker("worker-1");
    worker2_ = worker("worker-2");
    if (!testing::WaitForReadyWorkers(address_, dir_, 2))
      FAIL() << "the workers did not become READY on " << address_;
  }

  static fs::path venv_;
  static std::string venv_error_;
  fs::path dir_, data_;
  std::string address_;
  Daemon coordinator_, worker1_, worker2_;
};

fs::path OneSpecTest::venv_;
std::string OneSpecTest::venv_error_;

TEST_F(OneSpecTest, InitFromWithoutSizesTrainsAndResumesWhereOnlyTheRanksSeeTheData) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  // The coordinator's view of the data folder is empty.
  const fs::path seen_by_coordinator =
      fs::path("/proc") / std::to_string(coordinator_.pid) / "root" / data_.relative_path();
  ASSERT_TRUE(fs::exists(data_ / "corpus.txt"));
  ASSERT_FALSE(fs::exists(seen_by_coordinator / "corpus.txt")) << seen_by_coordinator;
  const testing::CliResult py = testing::RunCli(
      venv_ / "bin" / "python",
      {(OneSpecSourceDir() / "tests" / "integration" / "python_init_from.py").string(),
       "--proto-dir", (OneSpecSourceDir() / "proto").string(), "--out", (dir_ / "gen").string(),
       "--coordinator", address_, "--data", data_.string(), "--train",
       (data_ / "corpus.txt").string(), "--timeout", "40"},
      dir_ / "python.err", 120);
  const json result = json::parse(py.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << "exit " << py.exit_code << ", stdout: " << py.out;
  ASSERT_FALSE(result.contains("submit_error")) << result["submit_error"].dump();
  ASSERT_EQ(result["jobs"].size(), 2u) << result.dump();
  const json& first = result["jobs"][0];
  const json& second = result["jobs"][1];
  ASSERT_EQ(first.value("state", ""), "JOB_STATE_SUCCEEDED") << first.dump();
  EXPECT_EQ(first.value("step", ""), "2") << first.dump();
  ASSERT_EQ(second.value("state", ""), "JOB_STATE_SUCCEEDED") << second.dump();
  EXPECT_EQ(second.value("step", ""), "4") << second.dump();
  // The stored spec is what the client sent, resolved: the sizes it left out stay unset (the
  // ranks read them from config.json), the rest holds the defaults.
  const json& model = first["spec"]["model"];
  EXPECT_FALSE(model.contains("d_model")) << model.dump();
  EXPECT_FALSE(model.contains("n_head")) << model.dump();
  EXPECT_EQ(first["spec"]["parallelism"].value("tp_size", 0), 2);

  // The second job resumed from the first's last checkpoint, chosen by rank 0 and recorded by
  // the coordinator (its log, the job's last_checkpoint and the rank's log line).
  const std::string step2 = (data_ / "ckpt" / "step-00000002").string();
  const std::string log = testing::ReadFile(dir_ / "coordinator.log");
  EXPECT_NE(log.find("resumed from " + step2), std::string::npos) << log;
  const testing::CliResult logs = Cli({"logs", second.value("job_id", ""), "--rank", "0"});
  EXPECT_NE(logs.out.find("resumed from " + step2), std::string::npos) << logs.out << logs.err;
  EXPECT_EQ(second.value("last_checkpoint", ""), (data_ / "ckpt" / "step-00000004").string());
}

}  // namespace
}  // namespace meshrun
