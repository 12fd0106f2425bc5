// Tests for LoadTokens: every format, auto-detection, the text folder rules and the errors.
#include "engine/data/token_stream.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class TokenStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshrun_token_stream_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(bytes.data(), bytes.size());
    return p.string();
  }
  static std::string Le32(int32_t v) {
    std::string s(4, '\0');
    for (int i = 0; i < 4; ++i)
      s[i] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xFF);
    return s;
  }
  static std::string Le16(const std::vector<int>& tokens) {
    std::string s;
    for (int t : tokens) {
      s.push_back(static_cast<char>(t & 0xFF));
      s.push_back(static_cast<char>((t >> 8) & 0xFF));
    }
    return s;
  }
  static std::string LlmcFile(const std::vector<int>& tokens, int32_t magic = kLlmcMagic,
                              int32_t version = kLlmcVersion, int32_t count = -1) {
    std::string s =
        Le32(magic) + Le32(version) + Le32(count < 0 ? static_cast<int32_t>(tokens.size()) : count);
    s += std::string(4 * (kLlmcHeaderInts - 3), '\0');
    return s + Le16(tokens);
  }

  // Every token of `s`, through Read (token files are mapped, not held in `tokens`).
  static std::vector<int32_t> All(const TokenStream& s) {
    std::vector<int32_t> out(static_cast<size_t>(s.size()));
    EXPECT_TRUE(s.Read(0, s.size(), out.data()).ok());
    return out;
  }

  fs::path dir_;
};

TEST_F(TokenStreamTest, LlmcParsesExplicitAndAuto) {
  const std::vector<int> tokens = {50256, 1, 2, 40000, 7};
  const std::string path = Write("train.bin", LlmcFile(tokens));
  for (const char* format : {"llmc", "auto"}) {
    auto s = LoadTokens(path, format);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->format, "llmc");
    EXPECT_EQ(All(*s), std::vector<int32_t>(tokens.begin(), tokens.end()));
    EXPECT_EQ(*MaxTokenId(*s), 50256);
  }
}

TEST_F(TokenStreamTest, LlmcMagicIsDetectedWithoutBinExtension) {
  const std::string path = Write("tokens.dat", LlmcFile({3, 4, 5}));
  auto s = LoadTokens(path, "auto");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->format, "llmc");
  EXPECT_EQ(s->size(), 3);
}

TEST_F(TokenStreamTest, NanogptRawUint16) {
  const std::vector<int> tokens = {0, 65535, 300, 12};
  const std::string path = Write("val.bin", Le16(tokens));
  for (const char* format : {"nanogpt", "auto"}) {
    auto s = LoadTokens(path, format);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->format, "nanogpt");
    EXPECT_EQ(All(*s), std::vector<int32_t>(tokens.begin(), tokens.end()));
    EXPECT_EQ(*MaxTokenId(*s), 65535);
  }
}

TEST_F(TokenStreamTest, TextFileIsByteLevel) {
  const std::string text = "hi é\n";  // é is two bytes in UTF-8
  const std::string path = Write("a.txt", text);
  for (const char* format : {"text", "auto"}) {
    auto s = LoadTokens(path, format);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->format, "text");
    ASSERT_EQ(s->size(), 6);
    EXPECT_EQ(s->tokens[0], 'h');
    EXPECT_EQ(s->tokens[3], 0xC3);
    EXPECT_EQ(s->tokens[4], 0xA9);
    EXPECT_EQ(s->max_token_id, 0xC3);
  }
}

TEST_F(TokenStreamTest, TextFolderConcatenatesInNameOrderAndSkipsBinary) {
  Write("corpus/b.txt", "BB");
  Write("corpus/a.txt", "AA");
  Write("corpus/a.dat", std::string("\x00\x00\x00\x02\xff\x01", 6));  // fortune-style index
  Write("corpus/.hidden", "hidden");
  fs::create_directory_symlink(dir_ / "corpus", dir_ / "corpus" / "sub");      // a folder: skipped
  fs::create_symlink(dir_ / "corpus" / "a.txt", dir_ / "corpus" / "c-alias");  // duplicate
  for (const char* format : {"text", "auto"}) {
    auto s = LoadTokens((dir_ / "corpus").string(), format);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->format, "text");
    EXPECT_EQ(s->tokens, (std::vector<int32_t>{'A', 'A', 'B', 'B'}));
    EXPECT_EQ(s->files.size(), 2u);
    EXPECT_EQ(s->skipped.size(), 4u);  // .hidden, a.dat, c-alias, sub
  }
}

TEST_F(TokenStreamTest, FolderWithoutTextIsAnError) {
  Write("bin/x.dat", std::string("\x00\xff", 2));
  auto s = LoadTokens((dir_ / "bin").string(), "auto");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no non-empty UTF-8 text"), std::string::npos);
  EXPECT_NE(s.status().message().find("x.dat"), std::string::npos);
}

TEST_F(TokenStreamTest, LlmcBadMagicIsAnError) {
  const std::string path = Write("bad.bin", LlmcFile({1, 2}, /*magic=*/12345));
  auto s = LoadTokens(path, "llmc");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("bad magic 12345"), std::string::npos);
  EXPECT_NE(s.status().message().find(path), std::string::npos);
}

TEST_F(TokenStreamTest, LlmcBadVersionIsAnError) {
  auto s = LoadTokens(Write("v.bin", LlmcFile({1, 2}, kLlmcMagic, 7)), "auto");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("version 7"), std::string::npos);
}

TEST_F(TokenStreamTest, LlmcTruncatedIsAnError) {
  std::string bytes = LlmcFile({1, 2, 3, 4});
  bytes.resize(bytes.size() - 3);
  auto s = LoadTokens(Write("short.bin", bytes), "auto");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("truncated"), std::string::npos);
}

TEST_F(TokenStreamTest, LlmcShorterThanHeaderIsAnError) {
  auto s = LoadTokens(Write("tiny.bin", Le32(kLlmcMagic) + Le32(1)), "llmc");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("short file"), std::string::npos);
}

TEST_F(TokenStreamTest, LlmcZeroTokensIsAnError) {
  auto s = LoadTokens(Write("zero.bin", LlmcFile({})), "auto");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("empty"), std::string::npos);
}

TEST_F(TokenStreamTest, EmptyFilesAreErrors) {
  const std::string bin = Write("empty.bin", "");
  const std::string txt = Write("empty.txt", "");
  EXPECT_FALSE(LoadTokens(bin, "auto").ok());
  EXPECT_FALSE(LoadTokens(txt, "auto").ok());
  EXPECT_NE(LoadTokens(txt, "text").status().message().find("empty"), std::string::npos);
}

TEST_F(TokenStreamTest, NanogptOddSizeIsAnError) {
  auto s = LoadTokens(Write("odd.bin", "abc"), "nanogpt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("odd"), std::string::npos);
}

TEST_F(TokenStreamTest, BinaryAsTextIsAnErrorWithHint) {
  auto s = LoadTokens(Write("tokens.raw", std::string("\x01\x00\xff\x02", 4)), "auto");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not UTF-8"), std::string::npos);
  EXPECT_NE(s.status().message().find("hint"), std::string::npos);
}

TEST_F(TokenStreamTest, MissingPathAndUnknownFormat) {
  auto missing = LoadTokens((dir_ / "nope.bin").string(), "auto");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto unknown = LoadTokens(Write("x.txt", "x"), "parquet");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("parquet"), std::string::npos);
  EXPECT_FALSE(LoadTokens(dir_.string(), "llmc").ok());  // a folder is not a .bin file
}

TEST(Utf8Test, AcceptsAndRejects) {
  EXPECT_TRUE(IsUtf8Text("plain ascii\n"));
  EXPECT_TRUE(IsUtf8Text("\xE2\x82\xAC \xF0\x9F\x98\x80"));  // € 😀
  size_t bad = 0;
  EXPECT_FALSE(IsUtf8Text("ab\xC0\x80", &bad));  // overlong NUL
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(IsUtf8Text("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsUtf8Text("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsUtf8Text("\xE2\x82"));          // truncated
  EXPECT_FALSE(IsUtf8Text(std::string("a\0b", 3)));
}

}  // namespace
}  // namespace meshrun
