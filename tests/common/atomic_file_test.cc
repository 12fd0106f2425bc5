// Tests for atomic writes and CRC-32.
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/crc32.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshrun_atomic_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string Slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  size_t Entries() const {
    return std::distance(fs::directory_iterator(dir_), fs::directory_iterator());
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, WriteReplacesAndLeavesNoTemporary) {
  const std::string path = (dir_ / "f.txt").string();
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second version").ok());
  EXPECT_EQ(Slurp(path), "second version");
  EXPECT_EQ(Entries(), 1u);
}

TEST_F(AtomicFileTest, StreamingWriterCommitsOrAbandons) {
  const std::string path = (dir_ / "big.bin").string();
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(w->Append("abc").ok());
    ASSERT_TRUE(w->Append("def").ok());
    EXPECT_TRUE(fs::exists(w->temp_path()));
    EXPECT_FALSE(fs::exists(path));  // nothing visible before Commit
    EXPECT_EQ(w->bytes_written(), 6u);
    EXPECT_EQ(w->crc32(), Crc32("abcdef", 6));
    ASSERT_TRUE(w->Commit().ok());
  }
  EXPECT_EQ(Slurp(path), "abcdef");
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("partial").ok());
    // Dropped without Commit: the old file stays, the temporary goes.
  }
  EXPECT_EQ(Slurp(path), "abcdef");
  EXPECT_EQ(Entries(), 1u);
}

TEST_F(AtomicFileTest, MissingFolderIsAnError) {
  Status s = WriteFileAtomic((dir_ / "no" / "such" / "f").string(), "x");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

TEST(Crc32Test, KnownValues) {
  EXPECT_EQ(Crc32("", 0), 0u);
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32(fox.data(), fox.size()), 0x414FA339u);
  // Incremental == one shot, at every split point (exercises the 8-byte path and the tail).
  for (size_t split = 0; split <= fox.size(); ++split) {
    EXPECT_EQ(Crc32Update(Crc32(fox.data(), split), fox.data() + split, fox.size() - split),
              0x414FA339u);
  }
}

TEST_F(AtomicFileTest, DigestFileMatchesCrc) {
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  const std::string path = (dir_ / "d.bin").string();
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  auto d = DigestFile(path);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->bytes, data.size());
  EXPECT_EQ(d->crc32, Crc32(data.data(), data.size()));
  EXPECT_FALSE(DigestFile((dir_ / "missing").string()).ok());
}

}  // namespace
}  // namespace meshrun
