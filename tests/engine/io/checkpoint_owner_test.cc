// checkpoint.keep in a shared folder: each run prunes only the checkpoints it wrote (the owner
// recorded in metadata.json and in every shard), never another job's, and unmarked folders
// (older meshrun, or a standalone run) only from a standalone run (docs/checkpoints.md
// "Ownership").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "engine/io/checkpoint.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class CheckpointOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("meshrun_checkpoint_owner_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A one-rank checkpoint of step `step` written by `owner`; without metadata.json when
  // `complete` is false (a save that never finished).
  void Save(int64_t step, const std::string& owner, bool complete = true) {
    const std::string step_dir = StepDir(dir_, step);
    const std::vector<float> w = {1, 2, 3, 4};
    ASSERT_TRUE(WriteShard(step_dir, 0, {{"w", {4}, {0}, {4}, w.data()}}, nullptr, owner).ok());
    if (!complete) return;
    CheckpointMetadata m;
    m.step = step;
    m.job_spec_yaml = "name: test\n";
    m.owner = owner;
    Status s = WriteMetadata(step_dir, m);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  bool Exists(int64_t step) const { return fs::exists(StepDir(dir_, step)); }

  std::string dir_;
};

TEST_F(CheckpointOwnerTest, OwnerIsRecordedInMetadataAndShards) {
  Save(1, "job-000007");
  Save(2, "job-000007", /*complete=*/false);
  Save(3, "");
  EXPECT_EQ(CheckpointOwner(StepDir(dir_, 1)), "job-000007");
  auto meta = ReadMetadata(StepDir(dir_, 1));
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->owner, "job-000007");
  EXPECT_EQ(CheckpointOwner(StepDir(dir_, 2)), "job-000007") << "from the shard's header";
  EXPECT_EQ(CheckpointOwner(StepDir(dir_, 3)), "");
}

// Attack: job B shares job A's checkpoint.dir with keep: 1; its saves must not delete A's.
TEST_F(CheckpointOwnerTest, KeepPrunesOnlyTheRunsOwnCheckpoints) {
  Save(1, "job-A");
  Save(2, "job-A");
  Save(3, "job-A", /*complete=*/false);  // A's crashed save, older than B's newest
  Save(4, "");                           // an unmarked checkpoint of an older meshrun
  Save(10, "job-B");
  Save(11, "job-B");
  std::vector<std::string> deleted;
  ASSERT_TRUE(PruneCheckpoints(dir_, 1, &deleted, "job-B").ok());
  EXPECT_EQ(deleted, std::vector<std::string>{StepDir(dir_, 10)});
  for (int64_t step : {1, 2, 3, 4, 11}) EXPECT_TRUE(Exists(step)) << step;

  // A prunes its own: step 1, and its crashed save older than its newest complete one.
  deleted.clear();
  ASSERT_TRUE(PruneCheckpoints(dir_, 1, &deleted, "job-A").ok());
  EXPECT_EQ(deleted, (std::vector<std::string>{StepDir(dir_, 1)}))
      << "step 3 is newer than A's newest complete (2): a save that may be in progress";
  EXPECT_TRUE(Exists(2));
  EXPECT_TRUE(Exists(3));
  EXPECT_TRUE(Exists(4));
  EXPECT_TRUE(Exists(11));
}

// Unmarked folders belong to whoever owns the folder: a standalone run (owner "") prunes them,
// and leaves the marked ones of cluster jobs alone.
TEST_F(CheckpointOwnerTest, StandaloneRunPrunesUnmarkedOnly) {
  Save(1, "");
  Save(2, "");
  Save(3, "job-A");
  Save(4, "");
  std::vector<std::string> deleted;
  ASSERT_TRUE(PruneCheckpoints(dir_, 1, &deleted).ok());
  EXPECT_EQ(deleted, (std::vector<std::string>{StepDir(dir_, 2), StepDir(dir_, 1)}));
  EXPECT_TRUE(Exists(3));
  EXPECT_TRUE(Exists(4));
}

}  // namespace
}  // namespace meshrun
