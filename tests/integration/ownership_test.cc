// Exclusive ownership and the clean stop (issue #31), through the real binaries: a second
// coordinator on a port or a state folder in use is refused naming what holds it (and the first
// keeps its jobs); a second `train` on a checkpoint.dir in use exits 2 naming the first, whose
// checkpoints stay intact, while a run killed with -9 leaves nothing behind; a second worker
// under a live worker's name is refused (exit 2) and a restarted one takes over; SIGTERM to the
// coordinator, between checkpoint barriers and inside one, is as harmless as kill -9: the job
// SUCCEEDS with the undisturbed loss and `submit --follow` exits 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/chaos/chaos_trial.h"
#include "tests/client/cli_runner.h"
#include "tests/integration/daemons.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

class OwnershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(testing::BinDir() / bin)) GTEST_SKIP() << bin << " is not built";
    }
    if (!fs::exists(testing::kCorpus)) GTEST_SKIP() << testing::kCorpus << " is missing";
    char pattern[] = "/tmp/meshrun_ownership_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (testing::Daemon& d : daemons_) testing::Stop(d, 5s);
    if (HasFailure()) {
      std::cerr << "logs kept in " << dir_ << std::endl;
    } else if (!dir_.empty()) {
      fs::remove_all(dir_);
    }
  }

  // A coordinator on `port` with its state in `state`; waits for its "listening" line.
  testing::Daemon& StartCoordinator(int port, const fs::path& state, const std::string& log) {
    daemons_.push_back(testing::Spawn("coordinator",
                                      {(testing::BinDir() / "meshrun-coordinator").string(),
                                       "--listen", "127.0.0.1:" + std::to_string(port),
                                       "--state-dir", state.string(), "--heartbeat-timeout", "3"},
                                      dir_ / log));
    testing::Daemon& d = daemons_.back();
    for (int i = 0; i < 400 && testing::Alive(d.pid); ++i) {
      if (testing::ReadFile(d.log).find("listening on") != std::string::npos) break;
      std::this_thread::sleep_for(50ms);
    }
    return d;
  }

  testing::Daemon& StartWorker(int port, const std::string& name, const std::string& log) {
    daemons_.push_back(testing::Spawn(
        name,
        {(testing::BinDir() / "meshrun-worker").string(), "--coordinator",
         "127.0.0.1:" + std::to_string(port), "--name", name, "--slots", "1", "--work-dir",
         (dir_ / ("work-" + log)).string(), "--cores", "1", "--grace", "2"},
        dir_ / log));
    return daemons_.back();
  }

  testing::CliResult Cli(int port, std::vector<std::string> args, int timeout_s = 30) {
    args.push_back("--coordinator");
    args.push_back("127.0.0.1:" + std::to_string(port));
    return testing::RunCli(testing::BinDir() / "meshrun", args, dir_ / "cli.err", timeout_s);
  }

  // The tiny model of the chaos trials, `steps` steps, a checkpoint every 2 into `checkpoints`
  // (the newest 3 kept).
  std::string WriteSpec(const std::string& name, int steps, const fs::path& checkpoints) {
    const fs::path spec = dir_ / (name + ".yaml");
    std::ofstream(spec) << "name: " << name
                        << "\nmodel: {arch: gpt2, n_layer: 2, n_head: 2, d_model: 64, seq_len: 64, "
                           "vocab_size: 256}\n"
                        << "train: {steps: " << steps
                        << ", global_batch_size: 4, micro_batch_size: 2, warmup_steps: 2}\n"
                        << "data: {train: " << testing::kCorpus << ", format: text}\n"
                        << "checkpoint: {dir: " << checkpoints.string() << ", every: 2, keep: 3}\n";
    return spec.string();
  }

  // Reaps `d` within `timeout`: its exit code (-1: still running, or killed by a signal).
  static int ExitCode(testing::Daemon& d, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(d.pid, &status, WNOHANG) == d.pid) {
        d.pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }

  // The step-N folders of `dir` with their metadata.json.
  static std::vector<std::string> CompleteSteps(const fs::path& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.rfind("step-", 0) == 0 && fs::exists(it->path() / "metadata.json")) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // The step of the newest complete checkpoint in `dir` (-1: none).
  static int Newest(const fs::path& dir) {
    const std::vector<std::string> steps = CompleteSteps(dir);
    return steps.empty() ? -1 : std::atoi(steps.back().c_str() + 5);
  }

  fs::path dir_;
  std::deque<testing::Daemon> daemons_;
};

TEST_F(OwnershipTest, ASecondCoordinatorOnAPortInUseIsRefused) {
  const int port = testing::FreePort();
  testing::Daemon& first = StartCoordinator(port, dir_ / "state-a", "a.log");
  ASSERT_TRUE(testing::Alive(first.pid)) << testing::ReadFile(first.log);
  testing::Daemon& second = StartCoordinator(port, dir_ / "state-b", "b.log");
  const int code = ExitCode(second, 20s);
  const std::string err = testing::ReadFile(second.log);
  EXPECT_EQ(code, 1) << "a second coordinator serves on a port in use: " << err;
  EXPECT_NE(err.find("error: --listen: cannot listen on '127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << err;
  // The first one still answers every call.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Cli(port, {"jobs"}).exit_code, 0);
}

TEST_F(OwnershipTest, ASecondCoordinatorOnAStateFolderInUseIsRefusedNamingTheHolder) {
  const int port = testing::FreePort();
  testing::Daemon& first = StartCoordinator(port, dir_ / "state", "a.log");
  ASSERT_TRUE(testing::Alive(first.pid)) << testing::ReadFile(first.log);
  const std::string spec = WriteSpec("queued", 4, dir_ / "ck");
  testing::CliResult r =
      Cli(port, {"submit", "-f", spec, "--wait-for-capacity", "--skip-local-checks", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string job = json::parse(r.out)["job_id"];

  const int other_port = testing::FreePort();
  testing::Daemon& second = StartCoordinator(other_port, dir_ / "state", "b.log");
  const int code = ExitCode(second, 20s);
  const std::string err = testing::ReadFile(second.log);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("error: --state-dir: " + (dir_ / "state").string() +
                     " is in use by another meshrun-coordinator, pid " + std::to_string(first.pid) +
                     " on "),
            std::string::npos)
      << err;
  // The first keeps its job, and the next id is the next one.
  const json jobs = json::parse(Cli(port, {"jobs", "-o", "json"}).out, nullptr, false);
  ASSERT_TRUE(jobs.is_array() && jobs.size() == 1u) << jobs.dump();
  EXPECT_EQ(jobs[0]["job_id"], job);
  r = Cli(port, {"submit", "-f", spec, "--wait-for-capacity", "--skip-local-checks", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(json::parse(r.out)["job_id"], job);
  // Once the holder is gone (kill -9 included) the folder is free again.
  testing::KillNow(first);
  testing::Daemon& third = StartCoordinator(port, dir_ / "state", "c.log");
  ASSERT_TRUE(testing::Alive(third.pid)) << testing::ReadFile(third.log);
  EXPECT_EQ(json::parse(Cli(port, {"jobs", "-o", "json"}).out, nullptr, false).size(), 2u);
}

TEST_F(OwnershipTest, TwoTrainRunsOnOneCheckpointFolder) {
  const fs::path ck = dir_ / "ck";
  const std::string spec = WriteSpec("train", 100000, ck);
  daemons_.push_back(testing::Spawn(
      "train-1", {(testing::BinDir() / "meshrun").string(), "train", "-f", spec, "-o", "json"},
      dir_ / "train-1.log"));
  testing::Daemon& first = daemons_.back();
  for (int i = 0; i < 1200 && Newest(ck) < 4 && testing::Alive(first.pid); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_GE(Newest(ck), 4) << testing::ReadFile(first.log);

  // A second run on the folder: exit 2, naming the first.
  testing::CliResult second = testing::RunCli(testing::BinDir() / "meshrun", {"train", "-f", spec},
                                              dir_ / "train-2.err", 120);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_NE(second.err.find("error: checkpoint.dir: " + ck.string() +
                            " is in use by another run, pid " + std::to_string(first.pid) + " on "),
            std::string::npos)
      << second.err;
  EXPECT_NE(second.err.find("meshrun train"), std::string::npos) << second.err;
  // The first goes on undisturbed, two more checkpoints at least, and the folder holds only its
  // complete checkpoints (and the one it may be writing).
  const int seen = Newest(ck);
  for (int i = 0; i < 1200 && Newest(ck) < seen + 4 && testing::Alive(first.pid); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(testing::Alive(first.pid)) << testing::ReadFile(first.log);
  const int newest = Newest(ck);
  EXPECT_GE(newest, seen + 4) << testing::ReadFile(first.log);
  EXPECT_EQ(testing::ReadFile(first.log).find("error"), std::string::npos)
      << testing::ReadFile(first.log);
  std::error_code ec;
  for (fs::directory_iterator it(ck, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind("step-", 0) != 0 || std::atoi(n.c_str() + 5) > newest) continue;
    if (fs::exists(it->path() / "metadata.json")) continue;
    // A checkpoint being pruned (the spec keeps 3) loses its metadata.json before its folder goes:
    // one that is still there 2 s later is incomplete.
    for (int i = 0; i < 40 && fs::exists(it->path()); ++i) std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(fs::exists(it->path())) << n << " is incomplete";
  }

  // kill -9 of the holder leaves no lock behind: a rerun resumes from its newest checkpoint.
  testing::KillNow(first);
  daemons_.push_back(testing::Spawn(
      "train-3", {(testing::BinDir() / "meshrun").string(), "train", "-f", spec, "-o", "json"},
      dir_ / "train-3.log"));
  testing::Daemon& rerun = daemons_.back();
  const int had = Newest(ck);
  for (int i = 0; i < 1200 && Newest(ck) <= had && testing::Alive(rerun.pid); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(testing::Alive(rerun.pid)) << testing::ReadFile(rerun.log);
  EXPECT_GT(Newest(ck), had) << testing::ReadFile(rerun.log);
  testing::Stop(rerun, 10s);
}

TEST_F(OwnershipTest, AClusterJobOnAFolderARunHoldsFailsNamingIt) {
  const int port = testing::FreePort();
  ASSERT_TRUE(testing::Alive(StartCoordinator(port, dir_ / "state", "coordinator.log").pid));
  StartWorker(port, "w1", "w1.log");
  const fs::path ck = dir_ / "ck";
  const std::string spec = WriteSpec("held", 100000, ck);
  daemons_.push_back(testing::Spawn(
      "train", {(testing::BinDir() / "meshrun").string(), "train", "-f", spec, "-o", "json"},
      dir_ / "train.log"));
  testing::Daemon& holder = daemons_.back();
  for (int i = 0; i < 1200 && CompleteSteps(ck).empty() && testing::Alive(holder.pid); ++i) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(CompleteSteps(ck).empty()) << testing::ReadFile(holder.log);
  // The job's rank 0 finds the folder held: the job fails (no restarts) naming the holder.
  testing::CliResult r = Cli(port,
                             {"submit", "-f", spec, "--set", "train.steps=4", "--set",
                              "restart.max_restarts=0", "--skip-local-checks", "--follow"},
                             120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is in use by another run, pid " + std::to_string(holder.pid)),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(testing::Alive(holder.pid));
  // `logs --follow` of the failed job ends with its final state and exit 1, as `submit --follow`.
  const std::string job = testing::Lines(r.out).empty() ? "" : testing::Lines(r.out).front();
  ASSERT_EQ(job.rfind("job-", 0), 0u) << r.out;
  const testing::CliResult logs = Cli(port, {"logs", job, "--follow"});
  EXPECT_EQ(logs.exit_code, 1) << logs.out << logs.err;
  EXPECT_NE(logs.out.find("job " + job + " FAILED, restarts 0: "), std::string::npos) << logs.out;
}

TEST_F(OwnershipTest, ASecondWorkerUnderALiveNameIsRefusedAndARestartedOneTakesOver) {
  const int port = testing::FreePort();
  testing::Daemon& coordinator = StartCoordinator(port, dir_ / "state", "coordinator.log");
  ASSERT_TRUE(testing::Alive(coordinator.pid));
  auto ready = [&] {
    const json list = json::parse(Cli(port, {"workers", "-o", "json"}).out, nullptr, false);
    return list.is_array() && list.size() == 1u && list[0]["state"] == "READY";
  };
  testing::Daemon& first = StartWorker(port, "a", "a1.log");
  for (int i = 0; i < 300 && !ready(); ++i) std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(ready());

  testing::Daemon& second = StartWorker(port, "a", "a2.log");
  const int code = ExitCode(second, 30s);
  const std::string err = testing::ReadFile(second.log);
  EXPECT_EQ(code, 2) << "a second worker under a live name kept running: " << err;
  EXPECT_NE(err.find("error: --name: worker 'a' is already registered from 127.0.0.1, last seen "),
            std::string::npos)
      << err;
  EXPECT_TRUE(testing::Alive(first.pid));
  EXPECT_TRUE(ready());
  EXPECT_EQ(testing::ReadFile(first.log).find("registering again"), std::string::npos)
      << "the first worker lost its registration: " << testing::ReadFile(first.log);

  // kill -9: its session closes; a restarted worker under the name takes over at once.
  testing::KillNow(first);
  testing::Daemon& restarted = StartWorker(port, "a", "a3.log");
  std::this_thread::sleep_for(1s);
  for (int i = 0; i < 300 && !ready(); ++i) std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(ready());
  EXPECT_TRUE(testing::Alive(restarted.pid)) << testing::ReadFile(restarted.log);
  EXPECT_NE(testing::ReadFile(coordinator.log).find("worker 'a' registered again from"),
            std::string::npos)
      << testing::ReadFile(coordinator.log);
}

// SIGTERM between barriers and inside a checkpoint's barrier (bench/chaos/chaos_trial.h).
TEST_F(OwnershipTest, SigtermOfTheCoordinatorIsAsHarmlessAsKill9) {
  chaos::ChaosCluster::Options options;
  options.bin_dir = testing::BinDir();
  options.dir = dir_ / "chaos";
  fs::create_directories(options.dir);
  options.comm_timeout_s = 10;
  chaos::ChaosCluster cluster(options);
  const double reference = cluster.ReferenceLoss();
  ASSERT_FALSE(std::isnan(reference)) << "the undisturbed run failed";
  std::string why;
  ASSERT_TRUE(cluster.Start(&why)) << why;
  uint64_t seed = 31;
  for (chaos::Fault fault :
       {chaos::Fault::kTermCoordinator, chaos::Fault::kTermCoordinatorAtBarrier}) {
    const chaos::TrialResult t = cluster.RunTrial(fault, seed++, reference);
    EXPECT_TRUE(t.ok) << chaos::FaultName(fault) << ": " << t.why << " (follow exit "
                      << t.follow_exit << ")\n---- follow\n"
                      << t.transcript << "---- logs (tail)\n"
                      << t.logs.substr(t.logs.size() > 4000 ? t.logs.size() - 4000 : 0);
  }
  cluster.Stop();
}

}  // namespace
}  // namespace meshrun
