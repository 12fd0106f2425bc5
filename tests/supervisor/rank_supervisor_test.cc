// RankSupervisor with /bin/sh children: output lines, exit codes and signals, stop with grace
// (SIGTERM, then SIGKILL for a child that ignores it), launch failures, and the children's
// death with their supervisor (PR_SET_PDEATHSIG).
#include "supervisor/rank_supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Collects what the supervisor reports.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::map<RankKey, pid_t> started;
  std::map<RankKey, std::vector<std::string>> out, err;
  std::map<RankKey, RankExit> exits;
  std::vector<RankKey> exit_order;
  std::map<RankKey, std::vector<std::string>> frames;

  RankSupervisor::Callbacks Callbacks() {
    RankSupervisor::Callbacks c;
    c.on_started = [this](const RankKey& k, pid_t pid) {
      std::lock_guard<std::mutex> lock(mu);
      started[k] = pid;
      cv.notify_all();
    };
    c.on_line = [this](const RankKey& k, bool is_stderr, std::string line) {
      std::lock_guard<std::mutex> lock(mu);
      (is_stderr ? err : out)[k].push_back(std::move(line));
      cv.notify_all();
    };
    c.on_frame = [this](const RankKey& k, std::string frame) {
      std::lock_guard<std::mutex> lock(mu);
      frames[k].push_back(std::move(frame));
    };
    c.on_exited = [this](const RankKey& k, const RankExit& e) {
      std::lock_guard<std::mutex> lock(mu);
      exits[k] = e;
      exit_order.push_back(k);
      cv.notify_all();
    };
    return c;
  }
  bool WaitExits(size_t n, std::chrono::milliseconds timeout = 15s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return exits.size() >= n; });
  }
  bool WaitStarted(size_t n, std::chrono::milliseconds timeout = 15s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return started.size() >= n; });
  }
  bool WaitOutLines(const RankKey& k, size_t n, std::chrono::milliseconds timeout = 15s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return out[k].size() >= n; });
  }
};

RankSpawn Shell(const RankKey& key, const std::string& script,
                std::vector<std::string> env = {"PATH=/usr/bin:/bin"}) {
  RankSpawn s;
  s.key = key;
  s.argv = {"/bin/sh", "-c", script};
  s.env = std::move(env);
  return s;
}

bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  // A zombie no one reaps yet counts as gone.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

TEST(RankSupervisor, RelaysLinesAndExitCodes) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const RankKey ok{"job", 1, 0}, bad{"job", 1, 1};
  ASSERT_TRUE(sup.Start(Shell(ok, "echo one; echo two; echo warn >&2; printf 'tail'")).ok());
  ASSERT_TRUE(sup.Start(Shell(bad, "echo 'error: something broke' >&2; exit 3")).ok());
  ASSERT_TRUE(rec.WaitExits(2));
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_GT(rec.started[ok], 0);
  EXPECT_EQ(rec.out[ok], (std::vector<std::string>{"one", "two", "tail"}));
  EXPECT_EQ(rec.err[ok], (std::vector<std::string>{"warn"}));
  EXPECT_EQ(rec.exits[ok].exit_code, 0);
  EXPECT_EQ(rec.exits[ok].signal, 0);
  EXPECT_EQ(rec.exits[ok].error, "");
  EXPECT_FALSE(rec.exits[ok].stopped);
  EXPECT_EQ(rec.exits[bad].exit_code, 3);
  EXPECT_EQ(rec.exits[bad].error, "error: something broke");
  EXPECT_EQ(sup.running_count(), 0u);
}

// The typed channel of a rank: its input on stdin (larger than a pipe holds, so it is written
// as the child reads), its frames from fd 3, whole and in order, before its exit is reported.
TEST(RankSupervisor, InputOnStdinAndFramesFromTheReportChannel) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const RankKey key{"job", 1, 0};
  const std::string input(200000, 'a');
  // Echo stdin back as one frame (length 200000 = 0x030d40, little-endian), then a small one.
  RankSpawn s = Shell(key,
                      "printf '\\100\\015\\003\\000' >&3; cat >&3; "
                      "printf '\\002\\000\\000\\000ok' >&3; echo done");
  s.input = input;
  s.report_channel = true;
  ASSERT_TRUE(sup.Start(std::move(s)).ok());
  ASSERT_TRUE(rec.WaitExits(1));
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.exits[key].exit_code, 0) << rec.exits[key].error;
  ASSERT_EQ(rec.frames[key].size(), 2u);
  EXPECT_EQ(rec.frames[key][0], input);
  EXPECT_EQ(rec.frames[key][1], "ok");
  EXPECT_EQ(rec.out[key], (std::vector<std::string>{"done"}));
}

// A child that exits without reading its input does not take the supervisor down (EPIPE).
TEST(RankSupervisor, AChildThatIgnoresItsInputStillEnds) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const RankKey key{"job", 1, 0};
  RankSpawn s = Shell(key, "exit 4");
  s.input = std::string(1 << 20, 'x');
  ASSERT_TRUE(sup.Start(std::move(s)).ok());
  ASSERT_TRUE(rec.WaitExits(1));
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.exits[key].exit_code, 4);
}

TEST(RankSupervisor, ChildGetsExactlyTheGivenEnvironmentAndFolder) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const fs::path dir = fs::temp_directory_path() / ("sup-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  RankSpawn s = Shell({"job", 1, 0}, "echo \"$MESHRUN_RANK|$HOME|$(pwd)\"; read x; echo \"[$x]\"",
                      {"PATH=/usr/bin:/bin", "MESHRUN_RANK=7"});
  s.working_dir = dir.string();
  ASSERT_TRUE(sup.Start(s).ok());
  ASSERT_TRUE(rec.WaitExits(1));
  std::lock_guard<std::mutex> lock(rec.mu);
  // stdin is /dev/null: `read` gets nothing.
  EXPECT_EQ(rec.out[s.key], (std::vector<std::string>{"7||" + dir.string(), "[]"}));
  fs::remove_all(dir);
}

TEST(RankSupervisor, DeathBySignalIsReported) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const RankKey key{"job", 1, 0};
  ASSERT_TRUE(sup.Start(Shell(key, "echo started >&2; kill -9 $$")).ok());
  ASSERT_TRUE(rec.WaitExits(1));
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.exits[key].exit_code, -1);
  EXPECT_EQ(rec.exits[key].signal, SIGKILL);
  EXPECT_NE(rec.exits[key].error.find("SIGKILL"), std::string::npos) << rec.exits[key].error;
  EXPECT_NE(rec.exits[key].error.find("started"), std::string::npos) << rec.exits[key].error;
}

TEST(RankSupervisor, StopSendsTermThenKillAfterGrace) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const RankKey polite{"job", 2, 0}, stubborn{"job", 2, 1}, other{"job", 3, 0};
  ASSERT_TRUE(sup.Start(Shell(polite,
                              "trap 'echo bye; exit 0' TERM; echo ready; "
                              "while true; do sleep 0.05; done"))
                  .ok());
  ASSERT_TRUE(
      sup.Start(Shell(stubborn, "trap '' TERM; echo ready; while true; do sleep 0.05; done")).ok());
  ASSERT_TRUE(sup.Start(Shell(other, "echo ready; sleep 30")).ok());
  ASSERT_TRUE(rec.WaitOutLines(polite, 1));
  ASSERT_TRUE(rec.WaitOutLines(stubborn, 1));
  ASSERT_TRUE(rec.WaitOutLines(other, 1));
  EXPECT_EQ(sup.Stop("job", 2, 700ms), 2);
  ASSERT_TRUE(rec.WaitExits(2));
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_TRUE(rec.exits[polite].stopped);
  EXPECT_EQ(rec.exits[polite].exit_code, 0);
  EXPECT_EQ(rec.out[polite].back(), "bye");
  EXPECT_TRUE(rec.exits[stubborn].stopped);
  EXPECT_EQ(rec.exits[stubborn].signal, SIGKILL);
  // The stubborn one outlived the TERM and ended only by the KILL after the grace: it exited
  // after the polite one (the order of events, not a clock).
  ASSERT_EQ(rec.exit_order.size(), 2u);
  EXPECT_EQ(rec.exit_order[0], polite);
  EXPECT_EQ(rec.exit_order[1], stubborn);
  EXPECT_EQ(rec.exits.count(other), 0u) << "a stop order for attempt 2 left attempt 3 alone";
  EXPECT_EQ(sup.RunningRanks().size(), 1u);
}

TEST(RankSupervisor, LaunchFailuresAreReportedAsExits) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  RankSpawn missing;
  missing.key = {"job", 1, 0};
  missing.argv = {"/nonexistent/meshrun", "train"};
  ASSERT_TRUE(sup.Start(missing).ok());
  RankSpawn bad_dir = Shell({"job", 1, 1}, "true");
  bad_dir.working_dir = "/nonexistent/folder";
  ASSERT_TRUE(sup.Start(bad_dir).ok());
  ASSERT_TRUE(rec.WaitExits(2));
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_TRUE(rec.started.empty());
  EXPECT_EQ(rec.exits[missing.key].exit_code, -1);
  EXPECT_NE(rec.exits[missing.key].error.find("cannot execute /nonexistent/meshrun"),
            std::string::npos)
      << rec.exits[missing.key].error;
  EXPECT_NE(rec.exits[bad_dir.key].error.find("/nonexistent/folder"), std::string::npos)
      << rec.exits[bad_dir.key].error;
}

TEST(RankSupervisor, RefusesDuplicatesAndEmptyCommands) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  const RankKey key{"job", 1, 0};
  ASSERT_TRUE(sup.Start(Shell(key, "sleep 30")).ok());
  EXPECT_EQ(sup.Start(Shell(key, "true")).code(), StatusCode::kAlreadyExists);
  RankSpawn empty;
  empty.key = {"job", 1, 1};
  EXPECT_EQ(sup.Start(empty).code(), StatusCode::kInvalidArgument);
  sup.Shutdown(100ms);
  ASSERT_TRUE(rec.WaitExits(1));
  EXPECT_EQ(sup.Start(Shell({"job", 1, 2}, "true")).code(), StatusCode::kFailedPrecondition);
}

TEST(RankSupervisor, ShutdownStopsEveryChildAndItsGroup) {
  Recorder rec;
  RankSupervisor sup(rec.Callbacks());
  // The rank starts a grandchild in its process group; both must go.
  ASSERT_TRUE(sup.Start(Shell({"job", 1, 0}, "sleep 30 & echo $!; wait")).ok());
  ASSERT_TRUE(rec.WaitOutLines({"job", 1, 0}, 1));
  pid_t grandchild;
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    grandchild = std::stoi(rec.out[{"job", 1, 0}].front());
  }
  ASSERT_TRUE(Alive(grandchild));
  sup.Shutdown(2000ms);
  EXPECT_EQ(rec.exits.size(), 1u);
  for (int i = 0; i < 100 && Alive(grandchild); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(Alive(grandchild));
}

TEST(RankSupervisor, ChildrenDieWithTheirSupervisor) {
  const fs::path pid_file = fs::temp_directory_path() / ("sup-pdeath-" + std::to_string(getpid()));
  fs::remove(pid_file);
  const pid_t helper = fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {
    // A "worker" that dies without stopping its rank.
    RankSupervisor* sup = new RankSupervisor(RankSupervisor::Callbacks{});
    (void)sup->Start(Shell({"job", 1, 0}, "echo $$ > " + pid_file.string() + ".tmp; mv " +
                                              pid_file.string() + ".tmp " + pid_file.string() +
                                              "; exec sleep 60"));
    for (int i = 0; i < 200 && !fs::exists(pid_file); ++i) std::this_thread::sleep_for(20ms);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(helper, &status, 0), helper);
  ASSERT_TRUE(fs::exists(pid_file));
  pid_t rank = 0;
  std::ifstream(pid_file) >> rank;
  ASSERT_GT(rank, 0);
  for (int i = 0; i < 100 && Alive(rank); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(Alive(rank)) << "rank " << rank << " outlived its worker";
  fs::remove(pid_file);
}

}  // namespace
}  // namespace meshrun
