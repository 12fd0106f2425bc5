// WorkerDaemon with confined paths (--data-root, --checkpoint-root) against the in-process fake
// coordinator: an assignment naming a path outside the roots (absolute elsewhere, `..`, a
// symlink out, a checkpoint.dir in a data root) is reported as never started with the field in
// the error, and no process runs; one inside runs, and its rank is told the spec as sent with
// the roots beside it (decision 0048).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "proto/spec_convert.h"
#include "tests/worker/fake_coordinator.h"
#include "worker/worker_daemon.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::FakeCoordinator;
using testing::FakeServer;
using Ups = std::vector<v1::WorkerSessionRequest>;

class WorkerPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("worker-paths-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data" / "corpus");
    fs::create_directories(dir_ / "ckpt");
    fs::create_directories(dir_ / "secret");
    std::ofstream(dir_ / "data" / "corpus" / "train.txt") << "hello";
    std::ofstream(dir_ / "secret" / "key") << "key";
    fs::create_symlink(dir_ / "secret", dir_ / "data" / "out");
    fs::create_symlink(dir_ / "data" / "corpus", dir_ / "data" / "in");
    server_ = std::make_unique<FakeServer>(&fake_);
    ASSERT_TRUE(server_->ok());

    WorkerConfig config;
    config.name = "w1";
    config.slots = 8;
    config.work_dir = (dir_ / "work").string();
    config.meshrun_binary = MESHRUN_FAKE_RANK;  // tests/fakes/fake_rank.cc
    config.default_grace = 2s;
    config.session.backoff_initial = 50ms;
    // The operator's limits: one core, 64 GiB, one variable passed on by name.
    config.cores = 1;
    config.memory_bytes = int64_t{64} << 30;
    config.rank_env_pass = {"PASSED_BY_OPERATOR"};
    setenv("CLOUD_SECRET_KEY", "hunter2", 1);
    setenv("PASSED_BY_OPERATOR", "yes", 1);
    auto paths = PathPolicy::Create({(dir_ / "data").string()}, {(dir_ / "ckpt").string()});
    ASSERT_TRUE(paths.ok()) << paths.status().ToString();
    config.paths = *paths;
    daemon_ = std::make_unique<WorkerDaemon>(config, testing::StubFor(server_->address()), nullptr);
    daemon_->Start();
    ASSERT_TRUE(fake_.WaitForOpens(1));
  }
  void TearDown() override {
    daemon_.reset();
    server_.reset();
    fs::remove_all(dir_);
  }

  std::string Real(const std::string& relative) const {
    return fs::weakly_canonical(dir_ / relative).string();
  }

  // One rank of a 1-rank job `job_id` whose spec the caller adjusts.
  v1::WorkerSessionResponse Assign(const std::string& job_id,
                                   const std::function<void(JobSpec&)>& adjust) {
    JobSpec spec;
    spec.name = "t";
    spec.data.train = Real("data") + "/corpus/train.txt";
    adjust(spec);
    v1::WorkerSessionResponse m;
    v1::RankAssignment* a = m.mutable_assign();
    a->set_job_id(job_id);
    a->set_attempt(1);
    a->set_rank(0);
    a->set_world_size(1);
    a->set_local_world_size(1);
    *a->mutable_spec() = JobSpecToProto(spec);
    a->mutable_store()->set_address("127.0.0.1:7777");
    return m;
  }

  static const v1::RankExited* ExitOf(const Ups& ups, const std::string& job_id) {
    for (const auto& u : ups) {
      if (u.has_rank_exited() && u.rank_exited().job_id() == job_id) return &u.rank_exited();
    }
    return nullptr;
  }
  static bool Started(const Ups& ups, const std::string& job_id) {
    for (const auto& u : ups) {
      if (u.has_rank_started() && u.rank_started().job_id() == job_id) return true;
    }
    return false;
  }

  // Sends the assignment and returns its RankExited (waits for it).
  v1::RankExited Run(const v1::WorkerSessionResponse& m) {
    const std::string id = m.assign().job_id();
    fake_.SendDown(m);
    EXPECT_TRUE(fake_.WaitFor([&](const Ups& ups) { return ExitOf(ups, id) != nullptr; }));
    const Ups ups = fake_.up();
    const v1::RankExited* e = ExitOf(ups, id);
    return e != nullptr ? *e : v1::RankExited();
  }

  FakeCoordinator fake_;
  std::unique_ptr<FakeServer> server_;
  std::unique_ptr<WorkerDaemon> daemon_;
  fs::path dir_;
};

TEST_F(WorkerPathsTest, EscapingPathsAreRefusedAndNoProcessStarts) {
  struct Case {
    std::string job_id, field;
    std::function<void(JobSpec&)> adjust;
  };
  const std::vector<Case> cases = {
      {"job-abs", "data.train", [](JobSpec& s) { s.data.train = "/etc/passwd"; }},
      {"job-dotdot", "data.val", [&](JobSpec& s) { s.data.val = Real("data") + "/../secret/key"; }},
      {"job-link", "data.train", [&](JobSpec& s) { s.data.train = Real("data") + "/out/key"; }},
      {"job-ckpt", "checkpoint.dir",
       [&](JobSpec& s) { s.checkpoint.dir = Real("data") + "/ckpt"; }},
      {"job-init", "model.init_from", [&](JobSpec& s) { s.model.init_from = Real("secret"); }},
  };
  for (const Case& c : cases) {
    const v1::RankExited e = Run(Assign(c.job_id, c.adjust));
    EXPECT_EQ(e.exit_code(), -1) << c.job_id;
    EXPECT_EQ(e.error().rfind(c.field + ": ", 0), 0u) << c.job_id << ": " << e.error();
    EXPECT_NE(e.error().find("is outside the allowed"), std::string::npos) << e.error();
    EXPECT_FALSE(Started(fake_.up(), c.job_id)) << c.job_id;
    // Nothing was prepared for it: no attempt folder and no process.
    EXPECT_FALSE(fs::exists(dir_ / "work" / c.job_id)) << c.job_id;
  }
}

TEST_F(WorkerPathsTest, PathsInsideRunAndTheRankGetsTheSpecAsSent) {
  const v1::WorkerSessionResponse m = Assign("job-ok", [](JobSpec& s) {
    s.data.train = "in/train.txt";  // relative: the first data root; via a link within
    s.checkpoint.dir = "run-1";     // relative: the first checkpoint root
  });
  const v1::RankExited e = Run(m);
  EXPECT_EQ(e.exit_code(), 0) << e.error();
  EXPECT_TRUE(Started(fake_.up(), "job-ok"));
  const fs::path attempt = dir_ / "work" / "job-ok" / "1";
  EXPECT_TRUE(fs::exists(attempt / "ran-0"));
  // Checked here, forwarded unchanged (decision 0048): the rank joins relative paths to the
  // roots it is given beside the spec (rank/spec_intake.h).
  std::ifstream in(attempt / "spec-0", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  EXPECT_EQ(bytes.str(), m.assign().spec().SerializeAsString());
  EXPECT_FALSE(fs::exists(attempt / "spec.yaml"));
}

// ---- What the spec may not override of the operator's limits ----

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Attack: a data folder inside the root holding a symlink to a file outside it.
TEST_F(WorkerPathsTest, SymlinkInsideADataFolderPointingOutIsRefused) {
  fs::create_directories(dir_ / "data" / "texts");
  std::ofstream(dir_ / "data" / "texts" / "a.txt") << "text";
  fs::create_symlink(dir_ / "secret" / "key", dir_ / "data" / "texts" / "b.txt");
  const v1::RankExited e =
      Run(Assign("job-folder-link", [&](JobSpec& s) { s.data.train = Real("data") + "/texts"; }));
  EXPECT_EQ(e.exit_code(), -1);
  EXPECT_EQ(e.error().rfind("data.train: " + Real("data") + "/texts/b.txt is a symlink to " +
                                Real("secret") + "/key, which is outside",
                            0),
            0u)
      << e.error();
  EXPECT_FALSE(Started(fake_.up(), "job-folder-link"));
}

// Attack: resources.threads 300 (and 2^31−1) on a worker started with --cores 1.
TEST_F(WorkerPathsTest, ThreadsAreClampedToTheWorkersCores) {
  for (int threads : {300, 1024}) {
    const std::string id = "job-threads-" + std::to_string(threads);
    const v1::RankExited e = Run(Assign(id, [&](JobSpec& s) { s.resources.threads = threads; }));
    EXPECT_EQ(e.exit_code(), 0) << e.error();
    const fs::path attempt = dir_ / "work" / id / "1";
    EXPECT_NE(ReadFile(attempt / "start-0").find("threads=1\n"), std::string::npos)
        << ReadFile(attempt / "start-0");
    EXPECT_NE(ReadFile(attempt / "env-0").find("OMP_NUM_THREADS=1\n"), std::string::npos);
  }
  // Over the spec's own bound (which the coordinator and the rank check; the worker does not
  // validate specs again): clamped like any other, so the rank is told 1.
  const v1::RankExited e =
      Run(Assign("job-threads-max", [](JobSpec& s) { s.resources.threads = 2147483647; }));
  EXPECT_EQ(e.exit_code(), 0) << e.error();
  EXPECT_NE(ReadFile(dir_ / "work" / "job-threads-max" / "1" / "start-0").find("threads=1\n"),
            std::string::npos);
}

// Attack: model sizes of 2^31−1, which ended in bad_alloc inside the rank.
TEST_F(WorkerPathsTest, ModelThatCannotFitIsRefusedBeforeTheRankStarts) {
  const v1::RankExited e = Run(Assign("job-huge", [](JobSpec& s) {
    s.model.n_layer = 2147483647;
    s.model.vocab_size = 2147483647;
  }));
  EXPECT_EQ(e.exit_code(), -1);
  EXPECT_EQ(e.error().rfind("model: ", 0), 0u) << e.error();
  EXPECT_NE(e.error().find("--memory-bytes"), std::string::npos) << e.error();
  EXPECT_FALSE(Started(fake_.up(), "job-huge"));
  EXPECT_FALSE(fs::exists(dir_ / "work" / "job-huge"));
}

// Attack: a secret in the worker's environment reached its ranks.
TEST_F(WorkerPathsTest, RanksGetAnAllowListedEnvironment) {
  const v1::RankExited e = Run(Assign("job-env", [](JobSpec&) {}));
  EXPECT_EQ(e.exit_code(), 0) << e.error();
  const std::string env = ReadFile(dir_ / "work" / "job-env" / "1" / "env-0");
  EXPECT_EQ(env.find("CLOUD_SECRET_KEY"), std::string::npos) << env;
  EXPECT_NE(env.find("PASSED_BY_OPERATOR=yes\n"), std::string::npos) << env;
  EXPECT_NE(env.find("PATH="), std::string::npos) << env;
  // The roots travel in RankStart; nothing of the protocol travels in the environment.
  const std::string start = ReadFile(dir_ / "work" / "job-env" / "1" / "start-0");
  EXPECT_NE(start.find("data_roots=1\n"), std::string::npos) << start;
  EXPECT_EQ(env.find("MESHRUN_"), std::string::npos) << env;
}

}  // namespace
}  // namespace meshrun
