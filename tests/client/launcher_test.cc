// The standalone launcher (client/launcher.h) with real `/bin/sh` ranks: environment, output
// relaying, failure and signal handling, no orphans. Launch runs in a forked child whose
// stdout and stderr go to files, so each test sees exactly what a user would; every wait is
// bounded.
#include "client/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> ErrorLines(const std::string& text) {
  std::vector<std::string> errors;
  for (const std::string& line : Lines(text)) {
    if (line.rfind("error: ", 0) == 0) errors.push_back(line);
  }
  return errors;
}

// Alive and not a zombie (a rank orphaned by a killed launcher may linger as one until init
// reaps it; it no longer runs).
bool IsAlive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

struct Outcome {
  int exit_code = -1;  // 128 + signal when the launcher itself was killed
  bool timed_out = false;
  std::string out;
  std::string err;
};

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun-launcher-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (launcher_ > 0) {  // a test that failed half-way: do not leave the launcher behind
      kill(launcher_, SIGKILL);
      waitpid(launcher_, nullptr, 0);
    }
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // The rank command: `sh -c SCRIPT` with @DIR@ replaced by the test's folder. As a meshrun rank
  // reads its RankStart, each shell rank reads its place from its input (the launcher's one
  // route to a rank): "RANK WORLD STORE_DIR" into $RANK, $WORLD and $STORE.
  LaunchOptions Shell(std::string script, int nproc) {
    for (size_t at; (at = script.find("@DIR@")) != std::string::npos;) {
      script.replace(at, 5, dir_.string());
    }
    LaunchOptions options;
    options.argv = {"/bin/sh", "-c", "read RANK WORLD STORE\n" + script};
    options.nproc = nproc;
    options.rank_input = [nproc](int rank, const std::string& store_dir) {
      return std::to_string(rank) + " " + std::to_string(nproc) + " " + store_dir + "\n";
    };
    return options;
  }

  // Runs Launch(options) in a forked child with stdout and stderr in files.
  void Start(const LaunchOptions& options) {
    std::fflush(nullptr);
    const std::string out = (dir_ / "launcher.out").string();
    const std::string err = (dir_ / "launcher.err").string();
    launcher_ = fork();
    ASSERT_GE(launcher_, 0);
    if (launcher_ == 0) {
      const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out_fd < 0 || err_fd < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(99);
      _exit(Launch(options));
    }
  }

  // Waits for the launcher at most `bound`; SIGKILLs it when it takes longer.
  Outcome Wait(Clock::duration bound) {
    Outcome outcome;
    const Clock::time_point deadline = Clock::now() + bound;
    int status = 0;
    while (waitpid(launcher_, &status, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        outcome.timed_out = true;
        kill(launcher_, SIGKILL);
        waitpid(launcher_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    launcher_ = -1;
    outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status)
                                          : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    outcome.out = ReadFile(dir_ / "launcher.out");
    outcome.err = ReadFile(dir_ / "launcher.err");
    return outcome;
  }

  Outcome Run(const LaunchOptions& options, Clock::duration bound = seconds(20)) {
    Start(options);
    return Wait(bound);
  }

  // The pid a rank wrote to <dir>/pid.R (written to a temporary name and renamed), waiting
  // for the file at most `bound`; -1 when it never came.
  pid_t RankPid(int rank, Clock::duration bound = seconds(10)) {
    const fs::path path = dir_ / ("pid." + std::to_string(rank));
    const Clock::time_point deadline = Clock::now() + bound;
    while (!fs::exists(path)) {
      if (Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return static_cast<pid_t>(std::atoi(ReadFile(path).c_str()));
  }

  bool EventuallyDead(pid_t pid, Clock::duration bound = seconds(10)) {
    const Clock::time_point deadline = Clock::now() + bound;
    while (IsAlive(pid)) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return true;
  }

  fs::path dir_;
  pid_t launcher_ = -1;
};

// Shell fragments: a rank records its pid (atomically) and sleeps; `wait_for_pids N` waits (at
// most 10 s) until ranks 0..N-1 other than itself have recorded theirs.
constexpr char kShellHelpers[] = R"sh(
d=@DIR@
record_pid() { echo $$ > $d/tmp.$RANK; mv $d/tmp.$RANK $d/pid.$RANK; }
wait_for_pids() {
  for i in $(seq 200); do
    all=1
    for r in $(seq 0 $(($1 - 1))); do
      [ "$r" = "$RANK" ] || [ -f $d/pid.$r ] || all=0
    done
    [ $all = 1 ] && return 0
    sleep 0.05
  done
}
)sh";

TEST_F(LauncherTest, GivesEachRankItsInputAndPrefixesEveryLineButRankZeroStdout) {
  const Outcome o = Run(Shell(std::string(kShellHelpers) + R"sh(
echo "out $RANK of $WORLD"
echo "err $RANK" >&2
echo "$STORE" > $d/store.$RANK
ls -A "$STORE" | wc -l > $d/entries.$RANK
printf "no newline $RANK" >&2
)sh",
                              3));
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "out 0 of 3\n");  // rank 0's stdout, unchanged and alone
  for (const char* line :
       {"[rank 0] err 0", "[rank 1] out 1 of 3", "[rank 1] err 1", "[rank 2] out 2 of 3",
        "[rank 2] err 2", "[rank 0] no newline 0", "[rank 2] no newline 2"}) {
    EXPECT_NE(o.err.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << o.err;
  }
  EXPECT_EQ(o.err.find("out 0 of 3"), std::string::npos) << o.err;
  EXPECT_TRUE(ErrorLines(o.err).empty()) << o.err;

  const std::string store = ReadFile(dir_ / "store.0");
  EXPECT_EQ(store.rfind("/tmp/meshrun-run-", 0), 0u) << store;
  for (int r = 0; r < 3; ++r) {
    const std::string suffix = "." + std::to_string(r);
    EXPECT_EQ(ReadFile(dir_ / ("store" + suffix)), store);
    EXPECT_EQ(std::atoi(ReadFile(dir_ / ("entries" + suffix)).c_str()), 0);
  }
  // The run folder it created is gone.
  const fs::path store_path(store.substr(0, store.size() - 1));
  EXPECT_EQ(store_path.filename(), "store");
  EXPECT_FALSE(fs::exists(store_path.parent_path())) << store_path;
}

TEST_F(LauncherTest, KeepsAGivenRunDirButStartsWithAnEmptyStore) {
  const fs::path run_dir = dir_ / "run";
  fs::create_directories(run_dir / "store");
  std::ofstream(run_dir / "store" / "stale-key") << "old";
  LaunchOptions options = Shell(R"sh(ls -A "$STORE" | wc -l >&2)sh", 2);
  options.run_dir = run_dir.string();
  const Outcome o = Run(options);
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.err.find("[rank 0] 0\n"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("[rank 1] 0\n"), std::string::npos) << o.err;
  EXPECT_TRUE(fs::is_directory(run_dir / "store"));
}

TEST_F(LauncherTest, LongLinesFromManyRanksStayWhole) {
  const Outcome o = Run(Shell(R"sh(
line=$(printf '%0800d' 0)
i=0
while [ $i -lt 300 ]; do echo "r$RANK:$i:$line"; i=$((i + 1)); done
)sh",
                              4));
  ASSERT_FALSE(o.timed_out) << o.err.substr(0, 2000);
  EXPECT_EQ(o.exit_code, 0);
  const std::string zeros(800, '0');
  const std::vector<std::string> out = Lines(o.out);
  ASSERT_EQ(out.size(), 300u);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i], "r0:" + std::to_string(i) + ":" + zeros);
  }
  std::vector<int> seen(4, 0);
  for (const std::string& line : Lines(o.err)) {
    ASSERT_EQ(line.rfind("[rank ", 0), 0u) << line.substr(0, 100);
    const int rank = line[6] - '0';
    ASSERT_GE(rank, 1);
    ASSERT_LE(rank, 3);
    EXPECT_EQ(line, "[rank " + std::to_string(rank) + "] r" + std::to_string(rank) + ":" +
                        std::to_string(seen[rank]) + ":" + zeros);
    ++seen[rank];
  }
  EXPECT_EQ(seen, (std::vector<int>{0, 300, 300, 300}));
}

TEST_F(LauncherTest, AFailingRankStopsTheOthersAndIsNamedWithItsLastStderrLine) {
  LaunchOptions options = Shell(std::string(kShellHelpers) + R"sh(
case $RANK in
  1) wait_for_pids 3
     echo "loading data" >&2
     echo "error: data.train: /nope: no such file (hint: fix the path)" >&2
     exit 3 ;;
  2) trap "" TERM; record_pid; exec sleep 30 ;;  # ignores SIGTERM: needs the SIGKILL
  *) record_pid; exec sleep 30 ;;
esac
)sh",
                                3);
  options.grace = milliseconds(1000);
  options.rank_labels = {"rank 0 (dp_shard=0 tp=0)", "rank 1 (dp_shard=1 tp=0)",
                         "rank 2 (dp_shard=2 tp=0)"};
  Start(options);
  const pid_t pid0 = RankPid(0);
  const pid_t pid2 = RankPid(2);
  const Outcome o = Wait(seconds(15));  // far below the ranks' 30 s sleep
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 1) << o.err;
  const std::vector<std::string> errors = ErrorLines(o.err);
  ASSERT_EQ(errors.size(), 1u) << o.err;
  EXPECT_EQ(errors[0].rfind("error: rank 1 (dp_shard=1 tp=0) failed: exit code 3: data.train: "
                            "/nope: no such file (hint: fix the path) (hint: ",
                            0),
            0u)
      << errors[0];
  EXPECT_NE(o.err.find("[rank 1] loading data\n"), std::string::npos) << o.err;
  ASSERT_GT(pid0, 0);
  ASSERT_GT(pid2, 0);
  EXPECT_FALSE(IsAlive(pid0));
  EXPECT_FALSE(IsAlive(pid2));
}

TEST_F(LauncherTest, ARankKilledBySignalIsReported) {
  LaunchOptions options = Shell(std::string(kShellHelpers) + R"sh(
case $RANK in
  0) wait_for_pids 3; echo "about to die" >&2; kill -9 $$ ;;
  *) record_pid; exec sleep 30 ;;
esac
)sh",
                                3);
  options.grace = milliseconds(1000);
  const Outcome o = Run(options, seconds(10));
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 1) << o.err;
  const std::vector<std::string> errors = ErrorLines(o.err);
  ASSERT_EQ(errors.size(), 1u) << o.err;
  EXPECT_EQ(errors[0].rfind("error: rank 0 failed: killed by signal SIGKILL (9): about to die "
                            "(hint: ",
                            0),
            0u)
      << errors[0];
  for (int r : {1, 2}) EXPECT_FALSE(IsAlive(RankPid(r, seconds(0)))) << r;
}

TEST_F(LauncherTest, SigtermToTheLauncherStopsEveryRank) {
  LaunchOptions options = Shell(std::string(kShellHelpers) + R"sh(
[ $RANK = 1 ] && trap "" TERM
record_pid
exec sleep 30
)sh",
                                3);
  options.interrupt_grace = milliseconds(500);
  Start(options);
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) pids.push_back(RankPid(r));
  for (pid_t pid : pids) ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(launcher_, SIGTERM), 0);
  const Outcome o = Wait(seconds(15));
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 130) << o.err;
  const std::vector<std::string> errors = ErrorLines(o.err);
  ASSERT_EQ(errors.size(), 1u) << o.err;
  // sleep dies of the SIGTERM and rank 1 ignores it (then SIGKILL): none stopped cleanly.
  EXPECT_EQ(errors[0].rfind("error: interrupted (signal 15); stopped 3 ranks; rank(s) 0, 1, 2 did "
                            "not stop at a step boundary (hint: ",
                            0),
            0u)
      << errors[0];
  for (pid_t pid : pids) EXPECT_FALSE(IsAlive(pid)) << pid;
}

TEST_F(LauncherTest, RanksThatStopAtAStepBoundaryEndTheRunWith130AndNoError) {
  // A rank of `meshrun train` answers SIGTERM by finishing its step and exiting 130.
  LaunchOptions options = Shell(std::string(kShellHelpers) + R"sh(
trap "exit 130" TERM
record_pid
while :; do sleep 0.05; done
)sh",
                                2);
  Start(options);
  for (int r = 0; r < 2; ++r) ASSERT_GT(RankPid(r), 0);
  ASSERT_EQ(kill(launcher_, SIGINT), 0);
  const Outcome o = Wait(seconds(15));
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_TRUE(ErrorLines(o.err).empty()) << o.err;
  EXPECT_NE(o.err.find("interrupt: the ranks stop at the end of this step"), std::string::npos)
      << o.err;
}

TEST_F(LauncherTest, RanksDieWithAKilledLauncher) {
  LaunchOptions options = Shell(std::string(kShellHelpers) + "record_pid; exec sleep 30\n", 2);
  options.run_dir = (dir_ / "run").string();  // a SIGKILLed launcher cannot remove its own
  Start(options);
  const pid_t pid0 = RankPid(0);
  const pid_t pid1 = RankPid(1);
  ASSERT_GT(pid0, 0);
  ASSERT_GT(pid1, 0);
  ASSERT_EQ(kill(launcher_, SIGKILL), 0);
  const Outcome o = Wait(seconds(5));
  EXPECT_EQ(o.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(EventuallyDead(pid0));  // PR_SET_PDEATHSIG
  EXPECT_TRUE(EventuallyDead(pid1));
}

TEST_F(LauncherTest, InvalidInputFromARankExitsTwo) {
  LaunchOptions options = Shell(std::string(kShellHelpers) + R"sh(
case $RANK in
  1) wait_for_pids 2
     echo "error: model.n_head: 5 is not divisible by tp_size 2 (hint: pick 4)" >&2; exit 2 ;;
  *) record_pid; exec sleep 30 ;;
esac
)sh",
                                2);
  options.grace = milliseconds(1000);
  const Outcome o = Run(options, seconds(15));
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 2) << o.err;
  const std::vector<std::string> errors = ErrorLines(o.err);
  ASSERT_EQ(errors.size(), 1u) << o.err;
  EXPECT_EQ(
      errors[0].rfind("error: rank 1 failed: exit code 2: model.n_head: 5 is not divisible", 0), 0u)
      << errors[0];
}

TEST_F(LauncherTest, AnExecutableThatCannotRunFailsTheRank) {
  LaunchOptions options = Shell("true", 2);
  options.argv = {(dir_ / "no-such-program").string()};
  const Outcome o = Run(options);
  ASSERT_FALSE(o.timed_out) << o.err;
  EXPECT_EQ(o.exit_code, 1) << o.err;
  const std::vector<std::string> errors = ErrorLines(o.err);
  ASSERT_EQ(errors.size(), 1u) << o.err;
  EXPECT_NE(errors[0].find("failed: cannot execute "), std::string::npos) << errors[0];
}

TEST_F(LauncherTest, InvalidOptionsExitTwo) {
  LaunchOptions no_ranks = Shell("true", 0);
  Outcome o = Run(no_ranks);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.err.rfind("error: --nproc: must be at least 1 but is 0 (hint: ", 0), 0u) << o.err;

  LaunchOptions no_command;
  no_command.nproc = 2;
  o = Run(no_command);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(ErrorLines(o.err).size(), 1u) << o.err;

  LaunchOptions not_in_path = Shell("true", 2);
  not_in_path.argv = {"meshrun-no-such-program-anywhere"};
  o = Run(not_in_path);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.err.find("not found in PATH"), std::string::npos) << o.err;

  // A rank learns its place only from its input: there is no environment-variable mode.
  LaunchOptions no_input = Shell("true", 2);
  no_input.rank_input = nullptr;
  o = Run(no_input);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.err.rfind("error: launcher: no rank input (hint: ", 0), 0u) << o.err;
}

TEST(SelfExecutableTest, NamesThisTestBinary) {
  const std::string self = SelfExecutable();
  // tests/client's executable (meshrun_add_test_group in tests/client/CMakeLists.txt).
  EXPECT_EQ(fs::path(self).filename(), "client_tests");
  EXPECT_TRUE(fs::path(self).is_absolute());
  EXPECT_TRUE(fs::is_regular_file(self)) << self;
}

}  // namespace
}  // namespace meshrun::client
