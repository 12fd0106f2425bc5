// Token files mapped, never loaded whole (docs/data.md "Shards and memory"): a folder or a glob
// of llm.c (uint16, uint32) or nanoGPT shards is the stream their concatenation is; a sparse
// multi-gigabyte file opens without reading it; malformed shards are named with the offset;
// confinement holds for every shard.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/confined_file.h"
#include "common/path_policy.h"
#include "engine/data/batch_sampler.h"
#include "engine/data/token_stream.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class ShardedStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshrun_sharded_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    InstallFileRoots(FileRoots{});
    fs::remove_all(dir_);
  }

  std::string Write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(bytes.data(), bytes.size());
    return p.string();
  }
  static std::string Le(uint32_t v, int width) {
    std::string s(width, '\0');
    for (int i = 0; i < width; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
    return s;
  }
  static std::string Raw(const std::vector<int32_t>& tokens, int width) {
    std::string s;
    for (int32_t t : tokens) s += Le(static_cast<uint32_t>(t), width);
    return s;
  }
  static std::string Llmc(const std::vector<int32_t>& tokens, int width, int32_t magic = kLlmcMagic,
                          int32_t count = -1) {
    std::string s = Le(magic, 4) + Le(width == 4 ? kLlmcVersionUint32 : kLlmcVersion, 4) +
                    Le(count < 0 ? static_cast<uint32_t>(tokens.size()) : count, 4);
    s += std::string(4 * (kLlmcHeaderInts - 3), '\0');
    return s + Raw(tokens, width);
  }
  static std::vector<int32_t> Tokens(int n, int32_t modulo, int32_t salt) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919u + salt) % modulo);
    return t;
  }
  static std::vector<int32_t> All(const TokenStream& s) {
    std::vector<int32_t> out(static_cast<size_t>(s.size()));
    EXPECT_TRUE(s.Read(0, s.size(), out.data()).ok());
    return out;
  }
  // Every window the sampler gives for a few steps, in both orders.
  static std::vector<int32_t> Windows(const TokenStream& s, int seq_len) {
    std::vector<int32_t> out;
    for (Order order : {Order::kSequential, Order::kShuffled}) {
      auto sampler = BatchSampler::Create(&s, seq_len, 4, 1234, order);
      EXPECT_TRUE(sampler.ok()) << sampler.status().ToString();
      if (!sampler.ok()) return out;
      std::vector<int32_t> in(4 * seq_len), tg(4 * seq_len);
      for (int step = 0; step < 25; ++step) {
        EXPECT_TRUE(sampler->Fill(step, 0, 4, in.data(), tg.data()).ok());
        out.insert(out.end(), in.begin(), in.end());
        out.insert(out.end(), tg.begin(), tg.end());
      }
    }
    return out;
  }
  static std::string Message(const StatusOr<TokenStream>& s) {
    return s.ok() ? std::string("ok") : s.status().message();
  }

  fs::path dir_;
};

// Shards of uneven sizes (windows of 16 cross their boundaries) against one file of the same
// tokens: the same stream, the same windows, read through a folder, a glob and auto.
TEST_F(ShardedStreamTest, FolderAndGlobOfShardsAreTheConcatenatedFile) {
  struct Case {
    const char* format;  // of the shards
    int width;
    int32_t modulo;
  };
  for (const Case c :
       {Case{"llmc", 2, 65536}, Case{"llmc", 4, 128256}, Case{"nanogpt", 2, 50257}}) {
    SCOPED_TRACE(std::string(c.format) + " width " + std::to_string(c.width));
    const std::string sub = std::string(c.format) + std::to_string(c.width);
    const std::vector<int> sizes = {37, 5, 100, 1, 58};
    std::vector<int32_t> all;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<int32_t> t = Tokens(sizes[i], c.modulo, static_cast<int32_t>(i * 31));
      all.insert(all.end(), t.begin(), t.end());
      const std::string bytes =
          std::string(c.format) == "llmc" ? Llmc(t, c.width) : Raw(t, c.width);
      Write(sub + "/shards/train_00" + std::to_string(i) + ".bin", bytes);
    }
    Write(sub + "/shards/manifest.json", "{\"shards\": 5}");  // as meshrun tokenize writes
    Write(sub + "/shards/.partial.bin", "x");                 // hidden: skipped
    const std::string one = Write(
        sub + "/one.bin", std::string(c.format) == "llmc" ? Llmc(all, c.width) : Raw(all, c.width));
    auto whole = LoadTokens(one, c.format);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    ASSERT_TRUE(whole->tokens.empty());  // mapped, not loaded
    EXPECT_EQ(All(*whole), all);
    const std::string folder = (dir_ / sub / "shards").string();
    for (const std::string& path :
         {folder, folder + "/train_*.bin", folder + "/train_00[0-4].bin"}) {
      for (const char* format : {c.format, "auto"}) {
        SCOPED_TRACE(path + " as " + format);
        auto s = LoadTokens(path, format);
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        EXPECT_EQ(s->format, c.format);
        EXPECT_EQ(s->files.size(), sizes.size());
        EXPECT_EQ(s->size(), static_cast<int64_t>(all.size()));
        EXPECT_EQ(All(*s), all);
        EXPECT_EQ(Windows(*s, 16), Windows(*whole, 16));
        auto resolved = ResolveDataFormat(path, format);
        ASSERT_TRUE(resolved.ok());
        EXPECT_EQ(*resolved, c.format);
        // A window across the boundary of train_000 (37 tokens) and train_001.
        std::vector<int32_t> w(10);
        ASSERT_TRUE(s->Read(33, 10, w.data()).ok());
        EXPECT_EQ(w, std::vector<int32_t>(all.begin() + 33, all.begin() + 43));
      }
    }
  }
}

TEST_F(ShardedStreamTest, IdsAtOrAboveTheVocabularyAreRefusedOnRead) {
  const std::string path = Write("v/a.bin", Llmc({1, 2, 3, 300, 4}, 2));
  LoadOptions o;
  o.vocab_size = 256;
  auto s = LoadTokens(path, "auto", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();  // ids are not scanned at load
  std::vector<int32_t> out(5);
  EXPECT_TRUE(s->Read(0, 3, out.data()).ok());
  const Status bad = s->Read(1, 4, out.data());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("token id 300 at offset 1030 of " + path), std::string::npos)
      << bad.message();
  EXPECT_NE(bad.message().find("vocab_size(256)"), std::string::npos);
  EXPECT_EQ(s->Read(3, 3, out.data()).code(), StatusCode::kOutOfRange);
}

// Ten gigabytes of nanoGPT tokens that occupy no disk (a sparse file): opening reads the size
// only, so it takes far less memory than the data and reads the last window on demand.
TEST_F(ShardedStreamTest, SparseTenGigabyteFileOpensWithoutReadingIt) {
  const std::string path = (dir_ / "big.bin").string();
  constexpr off_t kBytes = off_t{10} << 30;
  {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const int rc = ::ftruncate(fd, kBytes);
    ::close(fd);
    if (rc != 0) GTEST_SKIP() << "this file system cannot hold a 10 GiB sparse file";
  }
  auto rss_kb = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1L;
  };
  const long before = rss_kb();
  const auto t0 = std::chrono::steady_clock::now();
  auto s = LoadTokens(path, "auto");
  const double open_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->size(), kBytes / 2);
  std::vector<int32_t> w(1025, -1);
  ASSERT_TRUE(s->Read(s->size() - 1025, 1025, w.data()).ok());
  EXPECT_EQ(w, std::vector<int32_t>(1025, 0));
  const long grew_kb = rss_kb() - before;
  std::printf("10 GiB sparse file: opened in %.6f s, RSS grew %ld KiB\n", open_s, grew_kb);
  EXPECT_LT(grew_kb, 16 * 1024);  // a few pages, against 10 GiB (and 20 GiB as int32)
}

TEST_F(ShardedStreamTest, MalformedShardsAreNamedWithTheOffset) {
  const std::string good = Llmc({1, 2, 3, 4}, 2);
  struct Case {
    std::string bytes;
    const char* format;
    std::vector<std::string> expect;
  };
  std::string stray = good + "x";
  std::string more = Llmc({1, 2, 3, 4}, 2, kLlmcMagic, 9);
  const Case cases[] = {
      {Llmc({1, 2}, 2, 0x12345678), "auto", {"bad magic 305419896 (0x12345678) at offset 0"}},
      {Llmc({1, 2}, 2, 0x12345678), "llmc", {"bad magic 305419896 (0x12345678) at offset 0"}},
      {stray, "llmc", {"1 stray byte(s) at offset 1032", "whole 2-byte tokens"}},
      {more, "llmc", {"says 9 tokens at offset 8", "truncated"}},
      {std::string(3, '\1'), "nanogpt", {"odd size (a stray byte at offset 2)"}},
      {Le(kLlmcMagic, 4) + Le(1, 4), "llmc", {"short file: 8 bytes", "at offset 0"}},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string sub = "bad" + std::to_string(n++);
    Write(sub + "/s_000.bin", good);
    const std::string bad = Write(sub + "/s_001.bin", c.bytes);
    Write(sub + "/s_002.bin", good);
    for (const std::string& path : {(dir_ / sub).string(), (dir_ / sub / "s_*.bin").string()}) {
      auto s = LoadTokens(path, c.format);
      const std::string m = Message(s);
      EXPECT_EQ(m.rfind(bad + ": ", 0), 0u) << m;  // the shard first
      for (const std::string& e : c.expect) EXPECT_NE(m.find(e), std::string::npos) << m;
    }
  }
  auto none = LoadTokens((dir_ / "bad0" / "x_*.bin").string(), "auto");
  EXPECT_NE(Message(none).find("x_*.bin: the glob matches no files"), std::string::npos)
      << Message(none);
  fs::create_directories(dir_ / "empty");
  auto empty = LoadTokens((dir_ / "empty").string(), "llmc");
  EXPECT_NE(Message(empty).find("holds no .bin token files"), std::string::npos) << Message(empty);
  // One stream has one format: under auto a nanoGPT shard among llm.c shards is read as llm.c,
  // and named.
  const std::string raw = Write("mixed/a.bin", Raw({1, 2, 3, 4, 5, 6, 7, 8}, 2));
  Write("mixed/b.bin", good);
  EXPECT_EQ(Message(LoadTokens((dir_ / "mixed").string(), "auto")).rfind(raw + ": short file", 0),
            0u)
      << Message(LoadTokens((dir_ / "mixed").string(), "auto"));
}

// Every shard is opened through the rank's confined open: one whose link leads outside the
// roots is refused, naming it, even though the folder (and the glob) lie inside.
TEST_F(ShardedStreamTest, AShardOutsideTheRootsIsRefused) {
  Write("data/shards/a_000.bin", Llmc({1, 2, 3}, 2));
  const std::string outside = Write("outside/secret.bin", Llmc({9, 9, 9}, 2));
  fs::create_symlink(outside, dir_ / "data" / "shards" / "a_001.bin");
  for (const std::string& path :
       {(dir_ / "data" / "shards").string(), (dir_ / "data" / "shards" / "a_*.bin").string()}) {
    InstallFileRoots(FileRoots{});
    auto open = LoadTokens(path, "auto");
    ASSERT_TRUE(open.ok()) << open.status().ToString();  // unconfined: the secret is read
    EXPECT_EQ(All(*open), (std::vector<int32_t>{1, 2, 3, 9, 9, 9}));
    FileRoots roots;
    roots.confined = true;
    roots.data = {fs::canonical(dir_ / "data").string()};
    InstallFileRoots(roots);
    auto s = LoadTokens(path, "auto");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kPermissionDenied) << s.status().ToString();
    EXPECT_NE(s.status().message().find("secret.bin"), std::string::npos) << Message(s);
  }
}

// The worker checks a glob by name like any path: inside the data roots it passes (each shard
// is then checked by the rank's confined open, above); outside it is refused.
TEST_F(ShardedStreamTest, TheWorkersPolicyChecksAGlobByName) {
  Write("data/shards/a_000.bin", Llmc({1, 2, 3}, 2));
  auto policy = PathPolicy::Create({fs::canonical(dir_ / "data").string()}, {});
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  const std::string glob = (fs::canonical(dir_ / "data") / "shards" / "a_*.bin").string();
  auto inside = policy->Resolve("data.train", glob, PathPolicy::Access::kRead);
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  EXPECT_EQ(inside->real, glob);
  auto outside =
      policy->Resolve("data.train", (dir_ / "b_*.bin").string(), PathPolicy::Access::kRead);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("is outside the allowed data roots"), std::string::npos)
      << outside.status().message();
}

}  // namespace
}  // namespace meshrun
