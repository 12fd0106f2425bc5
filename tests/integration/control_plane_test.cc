// The control plane end to end: a real meshrun-coordinator and meshrun-workers on loopback, jobs
// driven through the `meshrun` client (submit, status -o json, cancel, logs). Covers a job that
// succeeds with every rank placed; cancel; a SIGKILLed rank, a SIGKILLed worker daemon and a
// SIGKILLed coordinator (each recovered: the job still SUCCEEDS, with the final loss of an
// uninterrupted run where it restarts); and malformed, oversized and out-of-order requests,
// after which the coordinator keeps serving. Every wait is bounded.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "meshrun/v1/coordinator.grpc.pb.h"
#include "tests/client/cli_runner.h"
#include "tests/integration/daemons.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using testing::kCorpus;

using testing::Alive;
using testing::BinDir;
using testing::Daemon;
using testing::FreePort;
using testing::KillNow;
using testing::Spawn;
using testing::Stop;
using testing::WaitExit;

// The tiny model on a 4-rank mesh (dp_shard 2 x tp 2), a checkpoint every 10 steps.
std::string Spec(const fs::path& checkpoints, int steps, int every, int max_restarts) {
  return "name: cp-test\n"
         "model: {arch: gpt2, n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}\n"
         "parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 2}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-3, min_lr: 1.0e-4, "
         "warmup_steps: 2, seed: 1337}\n"
         "data: {train: " +
         std::string(kCorpus) +
         ", format: text}\n"
         "checkpoint: {dir: " +
         checkpoints.string() + ", every: " + std::to_string(every) +
         ", keep: 2}\n"
         "restart: {max_restarts: " +
         std::to_string(max_restarts) + "}\n";
}

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(BinDir() / bin)) {
        GTEST_SKIP() << (BinDir() / bin) << " is not built";
      }
    }
    if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing (apt-get install fortunes)";
    char pattern[] = "/tmp/meshrun_control_plane_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    port_ = FreePort();
    address_ = "127.0.0.1:" + std::to_string(port_);
  }

  void TearDown() override {
    for (Daemon& w : workers_) Stop(w);
    Stop(coordinator_, 10s);
    if (HasFailure() || std::getenv("MESHRUN_KEEP_TEST_LOGS") != nullptr) {
      // Leave the logs for a look; name them in the output.
      std::cerr << "logs kept in " << dir_ << std::endl;
      for (const auto& entry : fs::directory_iterator(dir_)) {
        if (entry.path().extension() != ".log") continue;
        std::cerr << "---- " << entry.path().filename() << " (last lines)\n";
        const std::vector<std::string> lines = testing::Lines(testing::ReadFile(entry.path()));
        for (size_t i = lines.size() > 30 ? lines.size() - 30 : 0; i < lines.size(); ++i) {
          std::cerr << lines[i] << '\n';
        }
      }
    } else if (!dir_.empty()) {
      fs::remove_all(dir_);
    }
  }

  void StartCoordinator(int heartbeat_timeout_s = 3, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {(BinDir() / "meshrun-coordinator").string(),
                                     "--listen",
                                     address_,
                                     "--state-dir",
                                     (dir_ / "state").string(),
                                     "--heartbeat-timeout",
                                     std::to_string(heartbeat_timeout_s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    coordinator_ = Spawn("coordinator", argv, dir_ / "coordinator.log");
    // Ready when it answers.
    for (int i = 0; i < 200; ++i) {
      if (Cli({"workers", "-o", "json"}, 5).exit_code == 0) return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "the coordinator did not answer on " << address_;
  }

  void StartWorker(const std::string& name, int slots = 2) {
    workers_.push_back(Spawn(name,
                             {(BinDir() / "meshrun-worker").string(), "--coordinator", address_,
                              "--name", name, "--slots", std::to_string(slots), "--work-dir",
                              (dir_ / "work" / name).string(), "--cores", "1", "--grace", "2"},
                             dir_ / (name + ".log")));
  }

  // Coordinator + `n` workers of 2 slots, all READY.
  void StartCluster(int n, int heartbeat_timeout_s = 3) {
    StartCoordinator(heartbeat_timeout_s);
    for (int i = 1; i <= n; ++i) StartWorker("worker-" + std::to_string(i));
    ASSERT_TRUE(WaitWorkers(n, "READY")) << Cli({"workers"}).out;
  }

  bool WaitWorkers(int n, const std::string& state, std::chrono::seconds timeout = 30s) {
    const Clock::time_point give_up = Clock::now() + timeout;
    while (Clock::now() < give_up) {
      testing::CliResult r = Cli({"workers", "-o", "json"}, 5);
      if (r.exit_code == 0) {
        int count = 0;
        for (const json& w : json::parse(r.out)) count += w["state"] == state;
        if (count >= n) return true;
      }
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  testing::CliResult Cli(std::vector<std::string> args, int timeout_s = 30) {
    args.push_back("--coordinator");
    args.push_back(address_);
    return testing::RunCli(BinDir() / "meshrun", args, dir_ / "cli.err", timeout_s);
  }

  std::string WriteSpec(const std::string& name, int steps, int every, int max_restarts) {
    const fs::path path = dir_ / (name + ".yaml");
    std::ofstream(path) << Spec(dir_ / (name + "-checkpoints"), steps, every, max_restarts);
    return path.string();
  }

  std::string Submit(const std::string& spec) {
    testing::CliResult r = Cli({"submit", "-f", spec, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return "";
    return json::parse(r.out)["job_id"].get<std::string>();
  }

  json Status(const std::string& job) {
    testing::CliResult r = Cli({"status", job, "-o", "json"}, 10);
    if (r.exit_code != 0) return json();
    return json::parse(r.out, nullptr, false);
  }

  // Polls `status` until pred holds (true) or the time is up (false); `last` keeps the last.
  bool WaitStatus(const std::string& job, const std::function<bool(const json&)>& pred,
                  std::chrono::seconds timeout, json* last) {
    const Clock::time_point give_up = Clock::now() + timeout;
    while (Clock::now() < give_up) {
      *last = Status(job);
      if (last->is_object() && pred(*last)) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  bool WaitState(const std::string& job, const std::string& state, std::chrono::seconds timeout,
                 json* last) {
    return WaitStatus(
        job, [&](const json& s) { return s["state"] == state; }, timeout, last);
  }

  // The final loss of the same spec trained standalone (`meshrun train --nproc 4`), trained once
  // per step count for the whole suite (the killed-rank and killed-worker tests share it).
  double UninterruptedFinalLoss(int steps) {
    static std::map<int, double> trained;
    auto it = trained.find(steps);
    if (it != trained.end()) return it->second;
    const double loss = TrainUninterrupted(steps);
    if (!std::isnan(loss)) trained[steps] = loss;
    return loss;
  }
  double TrainUninterrupted(int steps) {
    const fs::path path = dir_ / "reference.yaml";
    std::ofstream(path) << Spec(dir_ / "reference-checkpoints", steps, 10, 0);
    testing::CliResult r = testing::RunCli(
        BinDir() / "meshrun", {"train", "-f", path.string(), "--nproc", "4", "-o", "json"},
        dir_ / "reference.err", 300);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const std::string& line : testing::Lines(r.out)) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && j["event"] == "summary") return j["final_loss"].get<double>();
    }
    ADD_FAILURE() << "no summary line in the reference run: " << r.out;
    return NAN;
  }

  std::vector<pid_t> RankPids(const json& status) {
    std::vector<pid_t> pids;
    for (const json& r : status["ranks"]) pids.push_back(r["pid"].get<int>());
    return pids;
  }

  Daemon* WorkerNamed(const std::string& name) {
    for (Daemon& w : workers_) {
      if (w.name == name) return &w;
    }
    return nullptr;
  }

  fs::path dir_;
  int port_ = 0;
  std::string address_;
  Daemon coordinator_;
  std::vector<Daemon> workers_;
};

TEST_F(ControlPlaneTest, SubmittedJobSucceedsWithEveryRankPlaced) {
  StartCluster(2);
  const std::string job = Submit(WriteSpec("ok", 10, 5, 0));
  ASSERT_FALSE(job.empty());
  json s;
  ASSERT_TRUE(WaitState(job, "SUCCEEDED", 120s, &s)) << s.dump();
  EXPECT_EQ(s["job_id"], job);
  EXPECT_EQ(s["name"], "cp-test");
  EXPECT_EQ(s["attempt"], 1);
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_EQ(s["step"], 10);
  EXPECT_EQ(s["steps"], 10);
  EXPECT_GT(s["loss"].get<double>(), 0);
  EXPECT_GT(s["tokens_per_second"].get<double>(), 0);
  ASSERT_EQ(s["ranks"].size(), 4u);
  std::map<std::string, std::set<int>> tp_groups;  // worker -> the dp_shard coords it holds
  for (int g = 0; g < 4; ++g) {
    const json& r = s["ranks"][g];
    EXPECT_EQ(r["rank"], g);
    EXPECT_EQ(r["state"], "SUCCEEDED");
    // g = dp_shard·2 + tp on this mesh.
    EXPECT_EQ(r["coords"]["dp_replicate"], 0);
    EXPECT_EQ(r["coords"]["dp_shard"], g / 2);
    EXPECT_EQ(r["coords"]["cp"], 0);
    EXPECT_EQ(r["coords"]["tp"], g % 2);
    ASSERT_TRUE(r["worker"].is_string());
    tp_groups[r["worker"].get<std::string>()].insert(g / 2);
  }
  // A tp group never spans workers: each worker holds whole tp groups.
  EXPECT_EQ(tp_groups.size(), 2u);
  for (const auto& [worker, shards] : tp_groups) EXPECT_EQ(shards.size(), 1u) << worker;
  // The listing and the logs know it too.
  testing::CliResult jobs = Cli({"jobs", "-o", "json"});
  ASSERT_EQ(jobs.exit_code, 0);
  ASSERT_EQ(json::parse(jobs.out).size(), 1u);
  EXPECT_EQ(json::parse(jobs.out)[0]["state"], "SUCCEEDED");
  testing::CliResult logs = Cli({"logs", job, "--rank", "0"});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_NE(logs.out.find("checkpoint "), std::string::npos) << logs.out;
}

// parallelism.auto: submit plans for the registered workers (2 × 2 slots, their calibration)
// and the job runs the planner's first choice, which `meshrun plan --coordinator` shows too;
// status has the choice, the prediction and the measurement.
TEST_F(ControlPlaneTest, AutoParallelismRunsThePlannersFirstChoiceForTheWorkers) {
  StartCluster(2);
  std::string text = Spec(dir_ / "auto-checkpoints", 3, 0, 0);
  const std::string fixed =
      "parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 2}\n";
  ASSERT_NE(text.find(fixed), std::string::npos);
  text.replace(text.find(fixed), fixed.size(), "parallelism: {auto: true}\n");
  const fs::path path = dir_ / "auto.yaml";
  std::ofstream(path) << text;
  testing::CliResult plan = Cli({"plan", "-f", path.string(), "-o", "json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  json first;  // the first row with the spec's own settings (auto chooses the sizes only)
  for (const json& row : json::parse(plan.out)) {
    const json& m = row["mesh"];
    if (row["activation_checkpointing"] == "none" &&
        (m["cp"] == 1 || row["cp_comm_strategy"] == "allgather") &&
        (m["dp_shard"].get<int>() * m["cp"].get<int>() == 1 ||
         row["fsdp_reshard_after_forward"] == true)) {
      first = row;
      break;
    }
  }
  ASSERT_TRUE(first.is_object()) << plan.out;
  const std::string job = Submit(path.string());
  ASSERT_FALSE(job.empty());
  json s;
  ASSERT_TRUE(WaitState(job, "SUCCEEDED", 120s, &s)) << s.dump();
  EXPECT_EQ(s["mesh"], first["mesh"]) << s["auto_choice"];
  EXPECT_EQ(s["world_size"], 4);
  EXPECT_EQ(s["auto_choice"].get<std::string>().rfind("auto: chose ", 0), 0u) << s.dump();
  EXPECT_NEAR(s["predicted"]["step_seconds"].get<double>(), first["step_seconds"].get<double>(),
              1e-9 * first["step_seconds"].get<double>());
  EXPECT_EQ(s["predicted"]["peak_memory_bytes"], first["peak_memory_bytes"]);
  EXPECT_GT(s["measured"]["step_seconds"].get<double>(), 0);
  EXPECT_GT(s["measured"]["peak_memory_bytes"].get<double>(), 0);
  testing::CliResult text_status = Cli({"status", job});
  EXPECT_NE(text_status.out.find("auto:"), std::string::npos) << text_status.out;
  EXPECT_NE(text_status.out.find("predicted vs measured:"), std::string::npos) << text_status.out;
  // Sizes given beside auto are an error naming them, before anything is sent.
  testing::CliResult both = Cli({"submit", "-f", path.string(), "--set", "parallelism.tp_size=2"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("error: parallelism.tp_size: tp_size(2) given with parallelism.auto"),
            std::string::npos)
      << both.err;
}

TEST_F(ControlPlaneTest, FollowEndsWithTheFinalStateAndInvalidSpecsStayLocal) {
  StartCluster(2);
  testing::CliResult r = Cli({"submit", "-f", WriteSpec("follow", 6, 0, 0), "--follow"}, 180);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step 6/6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SUCCEEDED"), std::string::npos) << r.out;
  // Invalid input never reaches the coordinator: exit 2 with one error line.
  testing::CliResult bad =
      Cli({"submit", "-f", WriteSpec("bad", 6, 0, 0), "--set", "parallelism.tp_size=3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(testing::Lines(bad.err).size(), 1u) << bad.err;
  EXPECT_EQ(bad.err.rfind("error: ", 0), 0u) << bad.err;
  testing::CliResult unknown = Cli({"status", "no-such-job"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_EQ(unknown.err.rfind("error: ", 0), 0u) << unknown.err;
}

TEST_F(ControlPlaneTest, CancelStopsARunningJobsRanks) {
  StartCluster(2);
  const std::string job = Submit(WriteSpec("cancel", 5000, 0, 0));
  ASSERT_FALSE(job.empty());
  json s;
  ASSERT_TRUE(WaitStatus(
      job, [](const json& j) { return j["step"].get<int>() >= 1; }, 120s, &s))
      << s.dump();
  const std::vector<pid_t> pids = RankPids(s);
  ASSERT_EQ(pids.size(), 4u);
  for (pid_t pid : pids) EXPECT_TRUE(Alive(pid)) << pid;
  // jobs --state filters (case-insensitive).
  const json running = json::parse(Cli({"jobs", "--state", "running", "-o", "json"}).out);
  ASSERT_EQ(running.size(), 1u) << running.dump();
  EXPECT_EQ(running[0]["job_id"], job);
  EXPECT_TRUE(json::parse(Cli({"jobs", "--state", "SUCCEEDED", "-o", "json"}).out).empty());
  // logs: a rank the job does not have is an error, not silence; -o json is one object a line.
  testing::CliResult no_rank = Cli({"logs", job, "--rank", "9"});
  EXPECT_EQ(no_rank.exit_code, 2) << no_rank.err;
  EXPECT_EQ(
      no_rank.err.rfind("error: --rank: 9 is not a rank of " + job + ", which has 4 ranks", 0), 0u)
      << no_rank.err;
  testing::CliResult logs_json = Cli({"logs", job, "-o", "json"});
  EXPECT_EQ(logs_json.exit_code, 0) << logs_json.err;
  for (const std::string& line : testing::Lines(logs_json.out)) {
    const json l = json::parse(line, nullptr, false);
    EXPECT_TRUE(l.is_object() && l.contains("rank") && l.contains("text")) << line;
  }
  // Ctrl-C of `submit --follow` stops following, not the job, and says so (exit 130).
  {
    const fs::path log = dir_ / "follow.log";
    Daemon follow =
        Spawn("follow",
              {(BinDir() / "meshrun").string(), "submit", "-f", WriteSpec("followed", 5000, 0, 0),
               "--follow", "--coordinator", address_},
              log);
    const Clock::time_point until = Clock::now() + 20s;
    while (testing::ReadFile(log).find("job-") == std::string::npos && Clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
    std::this_thread::sleep_for(300ms);
    ASSERT_EQ(kill(follow.pid, SIGINT), 0);
    int status = 0;
    const Clock::time_point wait_until = Clock::now() + 10s;
    while (waitpid(follow.pid, &status, WNOHANG) == 0 && Clock::now() < wait_until) {
      std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(WIFEXITED(status)) << testing::ReadFile(log);
    EXPECT_EQ(WEXITSTATUS(status), 130) << testing::ReadFile(log);
    const std::string text = testing::ReadFile(log);
    const size_t at = text.find("stopped following job-");
    ASSERT_NE(at, std::string::npos) << text;
    const std::string followed = text.substr(at + 18, text.find(';', at) - at - 18);
    EXPECT_NE(text.find("it keeps running on the coordinator (hint: meshrun status " + followed),
              std::string::npos)
        << text;
    const json state = Status(followed);
    EXPECT_TRUE(state["state"] == "PENDING" || state["state"] == "RUNNING") << state.dump();
    EXPECT_EQ(Cli({"cancel", followed}).exit_code, 0);
  }
  testing::CliResult c = Cli({"cancel", job});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  ASSERT_TRUE(WaitState(job, "CANCELLED", 10s, &s)) << s.dump();
  const Clock::time_point give_up = Clock::now() + 20s;
  for (pid_t pid : pids) {
    while (Alive(pid) && Clock::now() < give_up) std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(Alive(pid)) << "rank process " << pid << " outlived the cancel";
  }
  // A second cancel has nothing to do: it says how the job ended and succeeds.
  testing::CliResult again = Cli({"cancel", job});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("already ended CANCELLED; nothing to cancel"), std::string::npos)
      << again.err;
  // An id the coordinator does not know: one error line with the field first.
  testing::CliResult missing = Cli({"status", "job-999999"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err.rfind("error: job_id: job-999999 is not a job of this coordinator", 0), 0u)
      << missing.err;
  ASSERT_TRUE(WaitWorkers(2, "READY")) << "the slots were not freed";
}

TEST_F(ControlPlaneTest, KilledRankRestartsFromItsCheckpoint) {
  const double reference = UninterruptedFinalLoss(40);
  StartCluster(2);
  const std::string job = Submit(WriteSpec("rank-kill", 40, 10, 1));
  ASSERT_FALSE(job.empty());
  json s;
  ASSERT_TRUE(WaitStatus(
      job, [](const json& j) { return j["step"].get<int>() >= 12; }, 120s, &s))
      << s.dump();
  const pid_t victim = s["ranks"][3]["pid"].get<int>();
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(WaitState(job, "SUCCEEDED", 240s, &s)) << s.dump();
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["attempt"], 2);
  EXPECT_EQ(s["step"], 40);
  EXPECT_NEAR(s["loss"].get<double>(), reference, 1e-6 * std::abs(reference));
  testing::CliResult logs = Cli({"logs", job, "--rank", "0"});
  EXPECT_NE(logs.out.find("resumed from"), std::string::npos) << logs.out;
}

TEST_F(ControlPlaneTest, KilledWorkerIsLostAndTheJobMovesOn) {
  const double reference = UninterruptedFinalLoss(40);
  StartCluster(3, /*heartbeat_timeout_s=*/3);
  const std::string job = Submit(WriteSpec("worker-kill", 40, 10, 1));
  ASSERT_FALSE(job.empty());
  json s;
  ASSERT_TRUE(WaitStatus(
      job, [](const json& j) { return j["step"].get<int>() >= 12; }, 120s, &s))
      << s.dump();
  const std::string victim_name = s["ranks"][3]["worker"].get<std::string>();
  std::vector<pid_t> victim_ranks;
  for (const json& r : s["ranks"]) {
    if (r["worker"] == victim_name) victim_ranks.push_back(r["pid"].get<int>());
  }
  Daemon* victim = WorkerNamed(victim_name);
  ASSERT_NE(victim, nullptr) << victim_name;
  KillNow(*victim);
  // Its ranks die with it (PR_SET_PDEATHSIG).
  const Clock::time_point give_up = Clock::now() + 10s;
  for (pid_t pid : victim_ranks) {
    while (Alive(pid) && Clock::now() < give_up) std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(Alive(pid)) << "rank " << pid << " outlived its worker";
  }
  ASSERT_TRUE(WaitWorkers(1, "LOST", 30s)) << Cli({"workers"}).out;
  ASSERT_TRUE(WaitState(job, "SUCCEEDED", 240s, &s)) << s.dump();
  EXPECT_EQ(s["restarts"], 1);
  for (const json& r : s["ranks"]) EXPECT_NE(r["worker"], victim_name);
  EXPECT_NEAR(s["loss"].get<double>(), reference, 1e-6 * std::abs(reference));
}

TEST_F(ControlPlaneTest, CoordinatorRestartLosesNoJob) {
  StartCluster(2, /*heartbeat_timeout_s=*/10);
  // The running job is followed by a `submit --follow` that must ride out the restart. No
  // checkpoint before the end: a store barrier never straddles the restart.
  Daemon follow =
      Spawn("follow",
            {(BinDir() / "meshrun").string(), "submit", "-f",
             WriteSpec("restart-running", 60, 0, 1), "--follow", "--coordinator", address_},
            dir_ / "follow.log");
  std::string running;
  for (int i = 0; i < 200 && running.empty(); ++i) {
    const std::vector<std::string> lines = testing::Lines(testing::ReadFile(dir_ / "follow.log"));
    if (!lines.empty() && lines[0].rfind("job-", 0) == 0) running = lines[0];
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(running.empty()) << testing::ReadFile(dir_ / "follow.log");
  json s;
  ASSERT_TRUE(WaitStatus(
      running, [](const json& j) { return j["step"].get<int>() >= 3; }, 120s, &s))
      << s.dump();
  // A second job waits for slots.
  const std::string pending = Submit(WriteSpec("restart-pending", 5, 0, 0));
  ASSERT_FALSE(pending.empty());
  KillNow(coordinator_);
  StartCoordinator(10);
  // Both jobs are still known, and both finish.
  testing::CliResult jobs = Cli({"jobs", "-o", "json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  std::set<std::string> ids;
  for (const json& j : json::parse(jobs.out)) ids.insert(j["job_id"].get<std::string>());
  EXPECT_EQ(ids, (std::set<std::string>{running, pending}));
  ASSERT_TRUE(WaitState(running, "SUCCEEDED", 240s, &s)) << s.dump();
  EXPECT_EQ(s["step"], 60);
  ASSERT_TRUE(WaitState(pending, "SUCCEEDED", 120s, &s)) << s.dump();
  // The follower saw it through: exit 0 after the final state.
  int status = -1;
  const Clock::time_point give_up = Clock::now() + 60s;
  while (waitpid(follow.pid, &status, WNOHANG) == 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(50ms);
  }
  const std::string followed = testing::ReadFile(dir_ / "follow.log");
  ASSERT_TRUE(WIFEXITED(status)) << followed;
  EXPECT_EQ(WEXITSTATUS(status), 0) << followed;
  EXPECT_NE(followed.find("step 60/60"), std::string::npos) << followed;
  EXPECT_NE(followed.find("SUCCEEDED"), std::string::npos) << followed;
}

// A worker with --data-root/--checkpoint-root hands its roots to its ranks, which check every
// object they open (common/confined_file.h): a job inside the roots reads its data, writes
// checkpoints (create, rename, make folders) and prunes old ones (keep: 2) as an unconfined one.
TEST_F(ControlPlaneTest, ConfinedRanksTrainAndCheckpointInsideTheRoots) {
  const fs::path ckroot = dir_ / "ckroot";
  fs::create_directories(ckroot);
  const std::string data_root = fs::path(kCorpus).parent_path().string();
  const std::vector<std::string> roots = {"--data-root", data_root, "--checkpoint-root",
                                          ckroot.string()};
  StartCoordinator(3, roots);
  std::vector<std::string> argv = {(BinDir() / "meshrun-worker").string(),
                                   "--coordinator",
                                   address_,
                                   "--name",
                                   "confined",
                                   "--slots",
                                   "4",
                                   "--work-dir",
                                   (dir_ / "work" / "confined").string(),
                                   "--cores",
                                   "1",
                                   "--grace",
                                   "2"};
  argv.insert(argv.end(), roots.begin(), roots.end());
  workers_.push_back(Spawn("confined", argv, dir_ / "confined.log"));
  ASSERT_TRUE(WaitWorkers(1, "READY")) << Cli({"workers"}).out;
  const fs::path spec = dir_ / "confined.yaml";
  std::ofstream(spec) << Spec(ckroot / "run", 12, 4, 0);
  const std::string job = Submit(spec.string());
  ASSERT_FALSE(job.empty());
  json s;
  ASSERT_TRUE(WaitState(job, "SUCCEEDED", 240s, &s)) << s.dump();
  EXPECT_EQ(s["step"], 12);
  std::set<std::string> kept;
  for (const auto& e : fs::directory_iterator(ckroot / "run")) {
    // .meshrun.lock: the run's lock on the folder (docs/checkpoints.md), not a checkpoint.
    if (e.path().filename() != ".meshrun.lock") kept.insert(e.path().filename().string());
  }
  EXPECT_EQ(kept, (std::set<std::string>{"step-00000008", "step-00000012"}));
  EXPECT_TRUE(fs::exists(ckroot / "run" / "step-00000012" / "metadata.json"));
}

// ---- Confined paths and limits through the CLI ------------------------------------------------

// A coordinator with --data-root/--checkpoint-root and tight limits, no workers (jobs stay
// PENDING): `meshrun submit` prints each refusal as one `error: <field or flag>: ...` line and
// exits 2 for a path outside the roots, 1 for a limit.
TEST_F(ControlPlaneTest, ConfinedPathsAndLimitsThroughTheCli) {
  fs::create_directories(dir_ / "data");
  fs::create_directories(dir_ / "ckpt");
  fs::copy_file(kCorpus, dir_ / "data" / "corpus.txt");
  StartCoordinator(
      3, {"--data-root", (dir_ / "data").string(), "--checkpoint-root", (dir_ / "ckpt").string(),
          "--submit-rate", "0.01", "--submit-burst", "5", "--max-pending-jobs", "1",
          "--max-request-bytes", "131072", "--max-spec-bytes", "65536"});
  const std::string spec = WriteSpec("confined", 4, 0, 0);
  const std::string inside = "--set=data.train=" + (dir_ / "data" / "corpus.txt").string();
  const std::string ckpt = "--set=checkpoint.dir=" + (dir_ / "ckpt" / "run").string();

  testing::CliResult r = Cli({"submit", "-f", spec, "--set=data.train=/etc/passwd", ckpt});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: data.train: /etc/passwd is outside the allowed data roots (", 0),
            0u)
      << r.err;
  // checkpoint.dir outside the checkpoint roots (WriteSpec's default folder).
  r = Cli({"submit", "-f", spec, inside});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: checkpoint.dir: ", 0), 0u) << r.err;
  // Inside: accepted, PENDING (no workers).
  r = Cli({"submit", "-f", spec, inside, ckpt, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Over --max-spec-bytes (64 KiB) but under --max-request-bytes (128 KiB): the handler says so.
  const fs::path big = dir_ / "big.yaml";
  std::ofstream(big) << testing::ReadFile(spec) << "# " << std::string(96 << 10, 'x') << "\n";
  r = Cli({"submit", "-f", big.string(), inside, ckpt});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: spec: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("--max-spec-bytes"), std::string::npos) << r.err;
  // Over --max-request-bytes: refused by gRPC before any handler (no token spent); the CLI
  // names the flag.
  const fs::path huge = dir_ / "huge.yaml";
  std::ofstream(huge) << testing::ReadFile(spec) << "# " << std::string(192 << 10, 'x') << "\n";
  r = Cli({"submit", "-f", huge.string(), inside, ckpt});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: request: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("--max-request-bytes"), std::string::npos) << r.err;
  // --max-pending-jobs 1.
  r = Cli({"submit", "-f", spec, inside, ckpt});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: --max-pending-jobs: 1 jobs are already PENDING", 0), 0u) << r.err;
  // The burst of 5 is spent (refusals count too): --submit-rate.
  r = Cli({"submit", "-f", spec, inside, ckpt});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: --submit-rate: more than 0.01 submissions per second", 0), 0u)
      << r.err;
  // Only the accepted job exists.
  const json jobs = json::parse(Cli({"jobs", "-o", "json"}).out, nullptr, false);
  ASSERT_TRUE(jobs.is_array());
  EXPECT_EQ(jobs.size(), 1u);
}

// ---- Bad requests straight at the API ---------------------------------------------------------

class BadRequestTest : public ControlPlaneTest {
 protected:
  void SetUp() override {
    ControlPlaneTest::SetUp();
    if (IsSkipped()) return;
    StartCoordinator();
    stub_ = v1::CoordinatorService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  grpc::StatusCode Submit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    return stub_->SubmitJob(&ctx, request, &response).error_code();
  }

  // Still serving: a cheap call answers.
  void ExpectServing() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::ListWorkersRequest request;
    v1::ListWorkersResponse response;
    EXPECT_TRUE(stub_->ListWorkers(&ctx, request, &response).ok());
  }

  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

TEST_F(BadRequestTest, MalformedRequestsAreInvalidArgument) {
  EXPECT_EQ(Submit(v1::JobSpec()), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectServing();
  v1::JobSpec spec;
  spec.set_name("bad-mesh");
  spec.mutable_model()->set_arch("gpt2");
  spec.mutable_model()->set_n_head(4);
  spec.mutable_parallelism()->set_tp_size(3);  // n_head 4 % 3 != 0
  EXPECT_EQ(Submit(spec), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectServing();
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest request;  // empty job_id
    v1::GetJobResponse response;
    EXPECT_EQ(stub_->GetJob(&ctx, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterWorkerRequest request;
    request.set_name("w");
    request.set_slots(0);
    request.set_device("cpu");
    v1::RegisterWorkerResponse response;
    EXPECT_EQ(stub_->RegisterWorker(&ctx, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::StoreGetRequest request;
    request.set_job_id("job");
    request.set_attempt(0);
    request.set_key("k");
    v1::StoreGetResponse response;
    EXPECT_EQ(stub_->StoreGet(&ctx, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::CancelJobRequest request;
    request.set_job_id("no-such-job");
    v1::CancelJobResponse response;
    EXPECT_EQ(stub_->CancelJob(&ctx, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  ExpectServing();
}

TEST_F(BadRequestTest, OversizedRequestsAreRefused) {
  v1::JobSpec spec;
  spec.set_source_yaml(std::string(8 << 20, 'x'));  // over any sane message limit
  // Over --max-request-bytes (4 MiB): gRPC refuses it before the handler sees it.
  EXPECT_EQ(Submit(spec), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectServing();
  // Under the request limit but over --max-spec-bytes (256 KiB).
  spec.set_source_yaml(std::string(300 << 10, 'x'));
  EXPECT_EQ(Submit(spec), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectServing();
  {
    grpc::ClientContext ctx;
    v1::StoreSetRequest request;
    request.set_job_id("job");
    request.set_attempt(1);
    request.set_key(std::string(1 << 20, 'k'));
    v1::StoreSetResponse response;
    EXPECT_FALSE(stub_->StoreSet(&ctx, request, &response).ok());
  }
  ExpectServing();
}

TEST_F(BadRequestTest, OutOfOrderSessionMessagesAreFailedPrecondition) {
  {
    // The first message must be `open`.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub_->WorkerSession(&ctx);
    v1::WorkerSessionRequest beat;
    beat.mutable_heartbeat()->set_free_slots(1);
    stream->Write(beat);
    stream->WritesDone();
    v1::WorkerSessionResponse response;
    while (stream->Read(&response)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  ExpectServing();
  // `open` twice on one stream.
  v1::RegisterWorkerResponse reg;
  {
    grpc::ClientContext ctx;
    v1::RegisterWorkerRequest request;
    request.set_name("w-order");
    request.set_slots(1);
    request.set_device("cpu");
    request.set_address("127.0.0.1");
    ASSERT_TRUE(stub_->RegisterWorker(&ctx, request, &reg).ok());
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub_->WorkerSession(&ctx);
    v1::WorkerSessionRequest open;
    open.mutable_open()->set_worker_id(reg.worker_id());
    open.mutable_open()->set_session_token(reg.session_token());
    stream->Write(open);
    v1::WorkerSessionResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_TRUE(response.has_accepted());
    stream->Write(open);
    stream->WritesDone();
    while (stream->Read(&response)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    // A wrong token.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub_->WorkerSession(&ctx);
    v1::WorkerSessionRequest open;
    open.mutable_open()->set_worker_id(reg.worker_id());
    open.mutable_open()->set_session_token("not-the-token");
    stream->Write(open);
    stream->WritesDone();
    v1::WorkerSessionResponse response;
    while (stream->Read(&response)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  ExpectServing();
}

}  // namespace
}  // namespace meshrun
