// DirLock: one holder per folder, the refused one told who holds it, the lock gone with the
// holder (a child killed with -9 included), and the folder created when missing.
#include "common/dir_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class DirLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshrun_dir_lock_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(DirLockTest, OneHolderAndTheRefusedOneNamesIt) {
  DirLockHolder me = ThisProcess("rank 0");
  me.job_id = "job-000007";
  me.attempt = 2;
  auto first = DirLock::TryAcquire((dir_ / "new").string(), me);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(fs::exists(dir_ / "new" / kDirLockFile));
  DirLockHolder holder;
  auto second = DirLock::TryAcquire((dir_ / "new").string(), ThisProcess("other"), &holder);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(holder.pid, getpid());
  EXPECT_EQ(holder.what, "rank 0");
  EXPECT_EQ(holder.job_id, "job-000007");
  EXPECT_EQ(holder.attempt, 2);
  const std::string described = holder.Describe();
  EXPECT_EQ(described.rfind("pid " + std::to_string(getpid()) + " on ", 0), 0u) << described;
  EXPECT_NE(described.find("(rank 0, job job-000007 attempt 2, since 20"), std::string::npos)
      << described;
  first->reset();  // released: the next one gets it
  EXPECT_TRUE(DirLock::TryAcquire((dir_ / "new").string(), ThisProcess("other")).ok());
}

TEST_F(DirLockTest, AHolderKilledWithSigkillLeavesNoLock) {
  fs::create_directories(dir_);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto lock = DirLock::TryAcquire(dir_.string(), ThisProcess("child"));
    const char ok = lock.ok() ? '1' : '0';
    (void)!write(ready[1], &ok, 1);
    pause();
    _exit(0);
  }
  char got = 0;
  ASSERT_EQ(read(ready[0], &got, 1), 1);
  ASSERT_EQ(got, '1');
  DirLockHolder holder;
  EXPECT_EQ(DirLock::TryAcquire(dir_.string(), ThisProcess("parent"), &holder).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(holder.pid, child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(DirLock::TryAcquire(dir_.string(), ThisProcess("parent")).ok());
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace meshrun
