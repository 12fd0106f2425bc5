// `meshrun train` interrupted and run again, as a user at a terminal would: SIGINT in the middle
// of a run stops every rank after the same step with a checkpoint and exit code 130 (for
// --nproc 1 and 2 alike), says where the run resumes, and the same command again ends at the
// uninterrupted run's final loss. A re-run of a finished run says so and reports its real loss.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

class InterruptTest : public meshrun::testing::MeshrunBinaryTest {
 protected:
  // 30 steps of a model big enough that a step takes a while (so SIGINT lands mid-run).
  std::vector<std::string> Args(int nproc, const fs::path& ckpt) const {
    std::vector<std::string> args = {
        "train", "-f",  (source_ / "examples/tiny.yaml").string(), "--nproc", std::to_string(nproc),
        "-o",    "json"};
    for (const std::string& kv :
         std::vector<std::string>{"train.steps=30", "model.d_model=128", "model.n_layer=2",
                                  "checkpoint.every=0", "checkpoint.dir=" + ckpt.string(),
                                  "parallelism.dp_shard_size=" + std::to_string(nproc)}) {
      args.push_back("--set");
      args.push_back(kv);
    }
    return args;
  }

  testing::CliResult Run(const std::vector<std::string>& args) {
    return testing::RunCli(binary_, args, temp_ / "stderr.txt", 300);
  }

  struct Interrupted {
    int exit_code = -1;
    int64_t steps_seen = 0;  // step lines printed before the signal was sent
    std::string out, err;
  };

  // Starts the command, sends SIGINT once `after_steps` step lines are out, waits (bounded).
  Interrupted RunAndInterrupt(const std::vector<std::string>& args, int after_steps) {
    Interrupted r;
    int out_pipe[2];
    EXPECT_EQ(pipe2(out_pipe, O_CLOEXEC), 0);
    const fs::path err_path = temp_ / "interrupt-stderr.txt";
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out_pipe[1], STDOUT_FILENO);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(err, STDERR_FILENO);
      std::vector<char*> argv;
      std::string bin = binary_.string();
      argv.push_back(bin.data());
      std::vector<std::string> copy = args;
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out_pipe[1]);
    const auto deadline = Clock::now() + std::chrono::seconds(240);
    bool signalled = false;
    char buffer[4096];
    while (Clock::now() < deadline) {
      pollfd p{out_pipe[0], POLLIN, 0};
      if (poll(&p, 1, 200) > 0) {
        const ssize_t n = read(out_pipe[0], buffer, sizeof(buffer));
        if (n <= 0) break;
        r.out.append(buffer, static_cast<size_t>(n));
      }
      if (!signalled) {
        int64_t steps = 0;
        for (const std::string& line : testing::Lines(r.out)) {
          if (line.find("\"event\":\"step\"") != std::string::npos) ++steps;
        }
        if (steps >= after_steps) {
          r.steps_seen = steps;
          kill(pid, SIGINT);
          signalled = true;
        }
      }
    }
    close(out_pipe[0]);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "meshrun train did not end within its bound";
        break;
      }
      usleep(20000);
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = testing::ReadFile(err_path);
    EXPECT_TRUE(signalled) << "the run ended before " << after_steps << " steps:\n" << r.err;
    return r;
  }

  static json Summary(const std::string& out) {
    const std::vector<std::string> lines = testing::Lines(out);
    if (lines.empty()) return json();
    return json::parse(lines.back(), nullptr, false);
  }

  void InterruptResumeMatches(int nproc) {
    const testing::CliResult whole = Run(Args(nproc, temp_ / "whole"));
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    const double expected = Summary(whole.out)["final_loss"].get<double>();

    const fs::path ckpt = temp_ / "interrupted";
    const Interrupted cut = RunAndInterrupt(Args(nproc, ckpt), 3);
    EXPECT_EQ(cut.exit_code, 130) << cut.err;
    const json s = Summary(cut.out);
    ASSERT_TRUE(s.is_object()) << cut.out;
    EXPECT_TRUE(s["interrupted"].get<bool>());
    const int64_t stopped = s["last_step"].get<int64_t>();
    // At most one step lost: it stopped after the step that was running when the signal came.
    EXPECT_GE(stopped, cut.steps_seen);
    EXPECT_LT(stopped, 30);
    char step_dir[32];
    std::snprintf(step_dir, sizeof(step_dir), "step-%08lld", static_cast<long long>(stopped));
    EXPECT_TRUE(fs::exists(ckpt / step_dir / "metadata.json")) << cut.err;
    EXPECT_NE(cut.err.find("interrupted: stopped after step " + std::to_string(stopped) + " of 30"),
              std::string::npos)
        << cut.err;
    EXPECT_NE(
        cut.err.find("run the same command again to resume from step " + std::to_string(stopped)),
        std::string::npos)
        << cut.err;

    const testing::CliResult again = Run(Args(nproc, ckpt));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    const json rs = Summary(again.out);
    EXPECT_EQ(rs["resumed_from_step"].get<int64_t>(), stopped);
    EXPECT_EQ(rs["steps"].get<int64_t>(), 30 - stopped);
    EXPECT_EQ(rs["final_loss"].get<double>(), expected);
  }
};

TEST_F(InterruptTest, CtrlCOfOneRankCheckpointsAndTheSameCommandFinishesTheRun) {
  InterruptResumeMatches(1);
}

TEST_F(InterruptTest, CtrlCOfTwoRanksCheckpointsAndTheSameCommandFinishesTheRun) {
  InterruptResumeMatches(2);
}

TEST_F(InterruptTest, ReRunOfAFinishedRunSaysSoAndReportsItsRealLoss) {
  const fs::path ckpt = temp_ / "done";
  std::vector<std::string> args = Args(1, ckpt);
  args.push_back("--set");
  args.push_back("train.steps=4");
  const testing::CliResult first = Run(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const double loss = Summary(first.out)["final_loss"].get<double>();

  const testing::CliResult again = Run(args);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const json s = Summary(again.out);
  EXPECT_EQ(s["steps"].get<int64_t>(), 0);
  EXPECT_EQ(s["final_loss"].get<double>(), loss);
  EXPECT_EQ(s["resumed_from_step"].get<int64_t>(), 4);
  EXPECT_NE(again.err.find("already holds this run's last step (4 of 4"), std::string::npos)
      << again.err;
  EXPECT_NE(again.err.find("--set checkpoint.dir=ANOTHER_DIR"), std::string::npos) << again.err;

  // Another model into the same folder: the hint names the ways out.
  args.push_back("--set");
  args.push_back("model.d_model=64");
  const testing::CliResult other = Run(args);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.err.find("checkpoint.dir=ANOTHER_DIR"), std::string::npos) << other.err;
  EXPECT_NE(other.err.find("checkpoint.resume=never"), std::string::npos) << other.err;
}

}  // namespace
}  // namespace meshrun
