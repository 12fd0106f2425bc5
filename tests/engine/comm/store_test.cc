// Store semantics, the same for every implementation: Get waits and times out naming the
// key, Add is atomic across threads, Wait/Check, PrefixStore isolation, FileStore key encoding.
#include "engine/comm/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

namespace meshrun {
namespace {

using std::chrono::milliseconds;

// A fresh directory under the system temp dir; `name` may hold any characters.
std::string TempDir(std::string name) {
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  const auto base = std::filesystem::temp_directory_path() /
                    ("meshrun-store-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(base);
  return base.string();
}

enum class Kind { kMemory, kFile, kPrefix };

class StoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Kind::kMemory: store_ = std::make_shared<InMemoryStore>(); break;
      case Kind::kFile: {
        dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
        auto fs = FileStore::Create(dir_);
        ASSERT_TRUE(fs.ok()) << fs.status().ToString();
        store_ = *fs;
        break;
      }
      case Kind::kPrefix:
        store_ = std::make_shared<PrefixStore>("job/a", std::make_shared<InMemoryStore>());
        break;
    }
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::shared_ptr<Store> store_;
  std::string dir_;
};

TEST_P(StoreTest, SetThenGetReturnsBytesIncludingNul) {
  const std::string value("a\0b\xff", 4);
  ASSERT_TRUE(store_->Set("k", value).ok());
  auto got = store_->Get("k", milliseconds(100));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  ASSERT_TRUE(store_->Set("k", "second").ok());
  EXPECT_EQ(*store_->Get("k", milliseconds(100)), "second");
}

TEST_P(StoreTest, GetWaitsForTheKey) {
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(store_->Set("late/key", "v").ok());
  });
  auto got = store_->Get("late/key", milliseconds(5000));
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "v");
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  auto got = store_->Get("never", milliseconds(100));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("never"), std::string::npos) << got.status().ToString();
  EXPECT_NE(got.status().message().find("within 100 ms"), std::string::npos)
      << got.status().ToString();
  // It gave up because the key never came, not early: a key set afterwards is there.
  ASSERT_TRUE(store_->Set("never", "now").ok());
  EXPECT_TRUE(store_->Get("never", milliseconds(100)).ok());
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 8, kAdds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) {
        if (!store_->Add("counter", 1).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto v = store_->Add("counter", 0);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, kThreads * kAdds);
  EXPECT_EQ(*store_->Get("counter", milliseconds(10)), std::to_string(kThreads * kAdds));
  EXPECT_EQ(*store_->Add("counter", -kThreads * kAdds - 5), -5);
}

TEST_P(StoreTest, AddOnANonCounterFails) {
  ASSERT_TRUE(store_->Set("text", "hello").ok());
  auto v = store_->Add("text", 1);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
}

TEST_P(StoreTest, WaitAndCheck) {
  EXPECT_FALSE(*store_->Check({"a", "b"}));
  ASSERT_TRUE(store_->Set("a", "1").ok());
  EXPECT_FALSE(*store_->Check({"a", "b"}));
  Status s = store_->Wait({"a", "b"}, milliseconds(50));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("b'"), std::string::npos) << s.ToString();  // prefixed: 'job/a/b'
  EXPECT_EQ(s.message().find("a'"), std::string::npos) << "only missing keys are named";
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    ASSERT_TRUE(store_->Set("b", "2").ok());
  });
  EXPECT_TRUE(store_->Wait({"a", "b"}, milliseconds(5000)).ok());
  writer.join();
  EXPECT_TRUE(*store_->Check({"a", "b"}));
  EXPECT_TRUE(*store_->Check({}));
}

TEST_P(StoreTest, OddKeys) {
  const std::vector<std::string> keys = {
      "",  ".",      "..",       "a/../../b",           "%2F",
      "/", "sp ace", "\xc3\xbc", std::string(400, 'x'), std::string(400, 'x') + "y"};
  for (const std::string& key : keys) {
    ASSERT_TRUE(store_->Set(key, "v:" + key).ok()) << key;
  }
  for (const std::string& key : keys) {
    auto v = store_->Get(key, milliseconds(10));
    ASSERT_TRUE(v.ok()) << key;
    EXPECT_EQ(*v, "v:" + key);
  }
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest,
                         ::testing::Values(Kind::kMemory, Kind::kFile, Kind::kPrefix),
                         [](const auto& info) {
                           switch (info.param) {
                             case Kind::kMemory: return "InMemory";
                             case Kind::kFile: return "File";
                             case Kind::kPrefix: return "Prefix";
                           }
                           return "Unknown";
                         });

TEST(PrefixStoreTest, NamespacesAreIsolated) {
  auto base = std::make_shared<InMemoryStore>();
  PrefixStore a("comm/tp/0", base), b("comm/tp/1", base);
  ASSERT_TRUE(a.Set("rank_0", "A").ok());
  ASSERT_TRUE(b.Set("rank_0", "B").ok());
  EXPECT_EQ(*a.Get("rank_0", milliseconds(10)), "A");
  EXPECT_EQ(*b.Get("rank_0", milliseconds(10)), "B");
  EXPECT_EQ(*base->Get("comm/tp/0/rank_0", milliseconds(10)), "A");
  EXPECT_EQ(*a.Add("n", 2), 2);
  EXPECT_EQ(*b.Add("n", 5), 5);
  EXPECT_FALSE(*b.Check({"only_a"}));
  ASSERT_TRUE(a.Set("only_a", "x").ok());
  EXPECT_FALSE(*b.Check({"only_a"}));
  EXPECT_EQ(b.Get("only_a", milliseconds(20)).status().code(), StatusCode::kDeadlineExceeded);
  // Nesting composes.
  PrefixStore nested("inner", std::make_shared<PrefixStore>("outer", base));
  ASSERT_TRUE(nested.Set("k", "v").ok());
  EXPECT_EQ(*base->Get("outer/inner/k", milliseconds(10)), "v");
}

TEST(FileStoreTest, TwoInstancesOnOneDirectoryShareKeys) {
  const std::string dir = TempDir("shared");
  auto a = FileStore::Create(dir);
  auto b = FileStore::Create(dir);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Set("x/y", "1").ok());
  EXPECT_EQ(*(*b)->Get("x/y", milliseconds(10)), "1");
  // Temporary files never linger after a successful Set.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().rfind(".tmp", 0), std::string::npos) << entry.path();
  }
  std::filesystem::remove_all(dir);
}

TEST(FileStoreTest, UncreatableDirectoryIsAnError) {
  auto s = FileStore::Create("/proc/meshrun-cannot-create-this");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace meshrun
