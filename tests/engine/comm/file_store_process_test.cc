// FileStore across real processes: a value set by one process is seen by another's waiting Get,
// and Add stays atomic when two processes hammer one counter.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/comm/store.h"
#include "tests/engine/comm/fork_util.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;

class FileStoreProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("meshrun-filestore-proc-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(FileStoreProcessTest, GetWaitsForAnotherProcessesSet) {
  auto pids = testing::ForkRanks(2, [&](int rank) {
    auto store = FileStore::Create(dir_);
    if (!store.ok()) return 10;
    if (rank == 0) {
      std::this_thread::sleep_for(milliseconds(100));
      return (*store)->Set("greeting/from/0", "hello").ok() ? 0 : 11;
    }
    auto v = (*store)->Get("greeting/from/0", milliseconds(5000));
    if (!v.ok()) {
      std::fprintf(stderr, "%s\n", v.status().ToString().c_str());
      return 12;
    }
    return *v == "hello" ? 0 : 13;
  });
  EXPECT_EQ(testing::WaitAll(pids, milliseconds(10000)), (std::vector<int>{0, 0}));
}

TEST_F(FileStoreProcessTest, AddIsAtomicAcrossProcesses) {
  constexpr int kAdds = 300;
  auto pids = testing::ForkRanks(2, [&](int rank) {
    auto store = FileStore::Create(dir_);
    if (!store.ok()) return 10;
    for (int i = 0; i < kAdds; ++i) {
      if (!(*store)->Add("counter", 1).ok()) return 11;
    }
    return (*store)->Set("done/" + std::to_string(rank), "1").ok() ? 0 : 12;
  });
  EXPECT_EQ(testing::WaitAll(pids, milliseconds(15000)), (std::vector<int>{0, 0}));
  auto store = FileStore::Create(dir_);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->Wait({"done/0", "done/1"}, milliseconds(100)).ok());
  auto v = (*store)->Get("counter", milliseconds(100));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::to_string(2 * kAdds));
}

}  // namespace
}  // namespace meshrun
