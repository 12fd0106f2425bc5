// The check-then-open attack on confined paths (docs/security.md "Confined paths"): the worker
// checks a path by name (PathPolicy), then someone who can write inside a root swaps a folder on
// it for a symlink leading out, then the rank's engine opens it. With the worker's roots
// installed (as a rank does from the RankStart its worker writes) every read, write
// and deletion of the engine must be refused, and nothing outside may be read, created or removed.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/confined_file.h"
#include "common/crc32.h"
#include "common/path_policy.h"
#include "engine/data/token_stream.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "rank/rank_main.h"
#include "rank/rank_reports.h"
#include "worker/rank_protocol.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class PathSwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("meshrun-path-swap-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    // base/data/d/train.txt (inside), base/ckpt (the checkpoint root), base/outside (what the
    // attacker wants read, overwritten or deleted).
    fs::create_directories(base_ / "data" / "d");
    fs::create_directories(base_ / "ckpt" / "run");
    fs::create_directories(base_ / "outside" / "victim");
    Write(base_ / "data" / "d" / "train.txt", "inside text, safe to read");
    Write(base_ / "outside" / "train.txt", "SECRET outside the roots");
    auto policy = PathPolicy::Create({(base_ / "data").string()}, {(base_ / "ckpt").string()});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    policy_ = *policy;
  }
  void TearDown() override {
    InstallFileRoots(FileRoots{});
    fs::remove_all(base_);
  }

  static void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  static std::string Read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // The product's seam: the worker's RankStart for a rank (worker/rank_protocol.h, its roots
  // from `policy`), written to a pipe and read back as `meshrun __rank` reads its stdin.
  static v1::RankStart StartFromWorker(const PathPolicy& policy) {
    RankLaunchConfig launch;
    launch.meshrun_binary = "meshrun";
    launch.data_roots = policy.data_roots();
    launch.checkpoint_roots = policy.checkpoint_roots();
    const RankCommand command = BuildRankCommand(v1::RankAssignment(), launch);
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    EXPECT_EQ(::write(fds[1], command.input.data(), command.input.size()),
              static_cast<ssize_t>(command.input.size()));
    ::close(fds[1]);
    StatusOr<v1::RankStart> start = rank::ReadRankStart(fds[0]);
    ::close(fds[0]);
    EXPECT_TRUE(start.ok()) << start.status().ToString();
    return start.ok() ? *start : v1::RankStart();
  }

  // What a rank installs at start: the roots of the RankStart its worker wrote.
  void InstallAsRank() { rank::InstallRankFileRoots(StartFromWorker(policy_)); }

  // The attack: `dir` (checked by name) becomes a symlink to `target`.
  static void SwapForLink(const fs::path& dir, const fs::path& target) {
    fs::rename(dir, fs::path(dir.string() + ".moved"));
    fs::create_symlink(target, dir);
  }

  std::string Checked(const std::string& field, const fs::path& p, PathPolicy::Access access) {
    auto r = policy_.Resolve(field, p.string(), access);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->real : "";
  }

  static std::string Text(const TokenStream& s) {
    std::string out;
    for (int32_t t : s.tokens) out += static_cast<char>(t);
    return out;
  }

  fs::path base_;
  PathPolicy policy_;
};

TEST_F(PathSwapTest, RankStartCarriesTheWorkersRoots) {
  InstallAsRank();
  const FileRoots roots = InstalledFileRoots();
  EXPECT_TRUE(roots.confined);
  EXPECT_EQ(roots.data, policy_.data_roots());
  EXPECT_EQ(roots.checkpoint, policy_.checkpoint_roots());
  // An unconfined worker sends no roots, and its rank stays unconfined.
  const v1::RankStart unconfined = StartFromWorker(PathPolicy());
  EXPECT_FALSE(unconfined.has_file_roots());
  InstallFileRoots(FileRoots{});
  rank::InstallRankFileRoots(unconfined);
  EXPECT_FALSE(InstalledFileRoots().confined);
}

TEST_F(PathSwapTest, DataFolderSwappedAfterTheCheckIsRefused) {
  const std::string path =
      Checked("data.train", base_ / "data" / "d" / "train.txt", PathPolicy::Access::kRead);
  SwapForLink(base_ / "data" / "d", base_ / "outside");
  // Without the rank's roots the engine would read the secret: the window is real.
  auto unconfined = LoadTokens(path, "text");
  ASSERT_TRUE(unconfined.ok()) << unconfined.status().ToString();
  EXPECT_EQ(Text(*unconfined), "SECRET outside the roots");

  InstallAsRank();
  auto confined = LoadTokens(path, "text");
  ASSERT_FALSE(confined.ok());
  EXPECT_EQ(confined.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(confined.status().message().find("which is outside the allowed data roots"),
            std::string::npos)
      << confined.status().message();
  EXPECT_NE(confined.status().message().find((base_ / "outside" / "train.txt").string()),
            std::string::npos)
      << confined.status().message();
  // A symlink inside the roots stays allowed: the object opened is what is checked.
  fs::remove(base_ / "data" / "d");
  fs::create_symlink(base_ / "data" / "d.moved", base_ / "data" / "d");
  auto inside = LoadTokens(path, "text");
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  EXPECT_EQ(Text(*inside), "inside text, safe to read");
}

TEST_F(PathSwapTest, ResumeCheckpointSwappedAfterTheCheckIsRefused) {
  // A real checkpoint in the root, and a copy outside (say, another user's, or a forged one).
  const fs::path step = base_ / "ckpt" / "run" / "step-00000001";
  const std::vector<float> w = {1, 2, 3, 4};
  ASSERT_TRUE(WriteShard(step.string(), 0, {{"w", {4}, {0}, {4}, w.data()}}).ok());
  CheckpointMetadata m;
  m.step = 1;
  ASSERT_TRUE(WriteMetadata(step.string(), m).ok());
  fs::copy(base_ / "ckpt" / "run", base_ / "outside" / "forged", fs::copy_options::recursive);
  const std::string resume = Checked("resume_checkpoint", step, PathPolicy::Access::kRead);
  SwapForLink(base_ / "ckpt" / "run", base_ / "outside" / "forged");

  InstallAsRank();
  EXPECT_EQ(ReadMetadata(resume).status().code(), StatusCode::kPermissionDenied);
  Status complete = CheckComplete(resume);  // reported as an incomplete checkpoint, saying why
  EXPECT_FALSE(complete.ok());
  EXPECT_NE(complete.message().find("outside the allowed"), std::string::npos)
      << complete.ToString();
  const std::string shard = (fs::path(resume) / ShardFileName(0)).string();
  EXPECT_EQ(SafetensorsFile::Open(shard).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(DigestFile(shard).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckpointReader::Open(resume).status().code(), StatusCode::kPermissionDenied);
}

TEST_F(PathSwapTest, CheckpointWritesAfterTheSwapCreateNothingOutside) {
  const std::string dir =
      Checked("checkpoint.dir", base_ / "ckpt" / "run", PathPolicy::Access::kWrite);
  SwapForLink(base_ / "ckpt" / "run", base_ / "outside" / "victim");

  InstallAsRank();
  const std::vector<float> w = {1, 2};
  const std::string step = (fs::path(dir) / "step-00000002").string();
  Status shard = WriteShard(step, 0, {{"w", {2}, {0}, {2}, w.data()}});
  EXPECT_EQ(shard.code(), StatusCode::kPermissionDenied) << shard.ToString();
  Status file = WriteFileAtomic((fs::path(dir) / "notes.txt").string(), "x");
  EXPECT_EQ(file.code(), StatusCode::kPermissionDenied) << file.ToString();
  EXPECT_TRUE(fs::is_empty(base_ / "outside" / "victim"));  // not even an empty folder
  // Writes into the checkpoint root itself (not swapped) still work, and only there.
  EXPECT_TRUE(WriteFileAtomic((base_ / "ckpt" / "ok.txt").string(), "fine").ok());
  EXPECT_EQ(Read(base_ / "ckpt" / "ok.txt"), "fine");
  EXPECT_EQ(WriteFileAtomic((base_ / "data" / "d" / "x").string(), "no").code(),
            StatusCode::kPermissionDenied);  // data roots are read-only to ranks
}

TEST_F(PathSwapTest, PruningAfterTheSwapDeletesNothingOutside) {
  // The attacker's target: folders named like checkpoints outside the roots.
  for (const char* s : {"step-00000001", "step-00000002", "step-00000003"}) {
    fs::create_directories(base_ / "outside" / "victim" / s);
    Write(base_ / "outside" / "victim" / s / "precious", "keep me");
  }
  const std::string dir =
      Checked("checkpoint.dir", base_ / "ckpt" / "run", PathPolicy::Access::kWrite);
  SwapForLink(base_ / "ckpt" / "run", base_ / "outside" / "victim");

  InstallAsRank();
  std::vector<std::string> deleted;
  (void)PruneCheckpoints(dir, 1, &deleted);  // refused or nothing to do: either way, no deletion
  EXPECT_TRUE(deleted.empty());
  for (const char* s : {"step-00000001", "step-00000002", "step-00000003"}) {
    EXPECT_EQ(Read(base_ / "outside" / "victim" / s / "precious"), "keep me") << s;
  }
  Status removed = RemoveAllConfined((fs::path(dir) / "step-00000001").string());
  EXPECT_EQ(removed.code(), StatusCode::kPermissionDenied) << removed.ToString();
  EXPECT_TRUE(fs::exists(base_ / "outside" / "victim" / "step-00000001" / "precious"));
}

// The same attack as a race: a thread flips the folder between the real one and a link out as
// fast as it can, for a bounded 1.5 s, while the engine reads. Every read gives the inside text
// or is refused; none ever returns the secret.
TEST_F(PathSwapTest, RacingSwapsNeverLeakTheOutsideFile) {
  const std::string path =
      Checked("data.train", base_ / "data" / "d" / "train.txt", PathPolicy::Access::kRead);
  fs::create_symlink(base_ / "outside", base_ / "data" / "link");
  InstallAsRank();
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const fs::path d = base_ / "data" / "d", real = base_ / "data" / "d.real",
                   link = base_ / "data" / "link";
    std::error_code ec;
    while (!stop.load()) {
      fs::rename(d, real, ec);  // d is the real folder: move it away, put the link in
      fs::rename(link, d, ec);
      std::this_thread::yield();
      fs::rename(d, link, ec);  // and back
      fs::rename(real, d, ec);
    }
  });
  int inside = 0, refused = 0, missing = 0, leaked = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < until) {
    auto s = LoadTokens(path, "text");
    if (s.ok()) {
      const std::string text = Text(*s);
      if (text == "inside text, safe to read") ++inside;
      if (text.find("SECRET") != std::string::npos) ++leaked;
    } else if (s.status().code() == StatusCode::kPermissionDenied) {
      ++refused;
    } else {
      ++missing;  // caught between the two renames
    }
  }
  stop = true;
  swapper.join();
  std::printf("race: %d inside, %d refused, %d missing, %d leaked\n", inside, refused, missing,
              leaked);
  EXPECT_EQ(leaked, 0);
  EXPECT_GT(inside + refused + missing, 0);
}

}  // namespace
}  // namespace meshrun
