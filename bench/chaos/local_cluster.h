// The local cluster that the chaos and elastic trials run on (chaos_trial.h, elastic_trial.h): a
// coordinator on a free loopback port and named workers, spawned from the built binaries, and
// `meshrun` commands against it, each bounded by coreutils `timeout`. No gtest here.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/integration/daemons.h"

namespace meshrun::chaos {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct CliResult {
  int exit_code = -1;
  std::string out;
};

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::string Quote(const std::string& arg) {
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Owns the coordinator and worker processes it spawns (stopped when it goes). Not thread-safe;
// the trial that drives it calls it from one thread.
class LocalCluster {
 public:
  // `dir` holds the state folder, the work folders and every daemon's log; the coordinator runs
  // with --heartbeat-timeout `heartbeat_timeout_s` and --restart-backoff `restart_backoff` (s).
  LocalCluster(fs::path bin_dir, fs::path dir, int heartbeat_timeout_s, std::string restart_backoff)
      : bin_dir_(std::move(bin_dir)),
        dir_(std::move(dir)),
        heartbeat_timeout_s_(heartbeat_timeout_s),
        restart_backoff_(std::move(restart_backoff)) {}
  ~LocalCluster() { Stop(); }
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::string& address() const { return address_; }

  // `meshrun ARGS… --coordinator ADDRESS`: its exit code and stdout.
  CliResult Cli(std::vector<std::string> args, int timeout_s = 10) const {
    args.insert(args.begin(), (bin_dir_ / "meshrun").string());
    args.push_back("--coordinator");
    args.push_back(address_);
    return Run(args, timeout_s);
  }

  // `meshrun status JOB -o json` (null when it fails).
  json Status(const std::string& job) const {
    CliResult r = Cli({"status", job, "-o", "json"});
    if (r.exit_code != 0) return json();
    return json::parse(r.out, nullptr, false);
  }

  void Stop() {
    for (testing::Daemon& w : workers_) testing::Stop(w, 5s);
    workers_.clear();
    testing::Stop(coordinator_, 5s);
  }

 protected:
  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  static CliResult Run(const std::vector<std::string>& argv, int timeout_s) {
    std::string command = "timeout " + std::to_string(timeout_s);
    for (const std::string& a : argv) {
      command += ' ';
      command += Quote(a);
    }
    command += " 2>/dev/null";
    CliResult r;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return r;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) r.out.append(buf, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }

  // The summary's final_loss of `meshrun train -f SPEC --nproc NPROC -o json` (NAN: none): the
  // undisturbed run a trial's loss is held to.
  double TrainFinalLoss(const fs::path& spec, int nproc) const {
    const CliResult r = Run({(bin_dir_ / "meshrun").string(), "train", "-f", spec.string(),
                             "--nproc", std::to_string(nproc), "-o", "json"},
                            300);
    for (const std::string& line : Lines(r.out)) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && j["event"] == "summary" && j["final_loss"].is_number()) {
        return j["final_loss"].get<double>();
      }
    }
    return NAN;
  }

  // A coordinator on the cluster's address (a free loopback port, chosen the first time) and
  // state folder, answering within 20 s; else false with `why`.
  bool StartCoordinator(std::string* why) {
    fs::create_directories(dir_);
    if (address_.empty()) address_ = "127.0.0.1:" + std::to_string(testing::FreePort());
    coordinator_ = testing::Spawn(
        "coordinator",
        {(bin_dir_ / "meshrun-coordinator").string(), "--listen", address_, "--state-dir",
         (dir_ / "state").string(), "--heartbeat-timeout", std::to_string(heartbeat_timeout_s_),
         "--restart-backoff", restart_backoff_},
        dir_ / "coordinator.log");
    const Clock::time_point give_up = Clock::now() + 20s;
    while (Clock::now() < give_up) {
      if (Cli({"workers", "-o", "json"}, 5).exit_code == 0) return true;
      std::this_thread::sleep_for(50ms);
    }
    *why = "the coordinator did not answer on " + address_;
    return false;
  }

  // A worker `name` with `slots` 1-core slots (replacing a stopped one of the same name).
  void StartWorker(const std::string& name, int slots) {
    workers_.erase(std::remove_if(workers_.begin(), workers_.end(),
                                  [&](const testing::Daemon& d) { return d.name == name; }),
                   workers_.end());
    workers_.push_back(
        testing::Spawn(name,
                       {(bin_dir_ / "meshrun-worker").string(), "--coordinator", address_, "--name",
                        name, "--slots", std::to_string(slots), "--work-dir",
                        (dir_ / "work" / name).string(), "--cores", "1", "--grace", "2"},
                       dir_ / (name + ".log")));
  }

  std::string address_;
  testing::Daemon coordinator_;
  std::vector<testing::Daemon> workers_;

 private:
  fs::path bin_dir_, dir_;
  int heartbeat_timeout_s_;
  std::string restart_backoff_;
};

}  // namespace meshrun::chaos
