// Tests for Tokenizer (a tiny hand-built tokenizer.json): byte-level mapping, merges by rank,
// added tokens, the regex pre-tokenizers, decoding, and TokenizeTexts' end-of-text token,
// cache and llm.c version 2 files.
#include "engine/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/data/token_stream.h"
#include "tests/fakes/byte_level.h"

namespace meshrun {
namespace {

using testing::ByteLevelChar;

namespace fs = std::filesystem;
using json = nlohmann::json;

// Ids 0..255 are the bytes; then the merges below in rank order; then two added tokens.
json TinyTokenizer(const json& pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"},
      {"h", "e"},
      {"he", "ll"},
      {"hell", "o"},
      {ByteLevelChar(' '), "w"},
      {"o", "r"},
      {ByteLevelChar(' ') + "w", "or"}};
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(a + " " + b);
    vocab[a + b] = id++;
  }
  json added = json::array();
  added.push_back({{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}});
  added.push_back({{"id", 301}, {"content", "<|end|>"}, {"special", true}});
  return json{
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"added_tokens", added},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"ignore_merges", false}}}};
}

json ByteLevelPre(bool use_regex, bool prefix = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"use_regex", use_regex}};
}

std::shared_ptr<const Tokenizer> Make(const json& j) {
  auto t = Tokenizer::FromJson(j.dump(), "", "test");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(TokenizerTest, MergesByRankOverGpt2PreTokens) {
  auto t = Make(TinyTokenizer(ByteLevelPre(true)));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 302);
  EXPECT_EQ(t->end_of_text_id(), 300);
  // "hello" → he·ll → hell·o; " world" → " w"·"or"→" wor", then l, d.
  EXPECT_EQ(Ids(*t, "hello world"), (std::vector<int32_t>{259, 262, 'l', 'd'}));
  // "lll": (l,l) at 0 first (leftmost of equal rank), then the lone l.
  EXPECT_EQ(Ids(*t, "lll"), (std::vector<int32_t>{256, 'l'}));
  // The regex splits "hello!!" into "hello" and "!!"; no merge spans the two.
  EXPECT_EQ(Ids(*t, "hello!!"), (std::vector<int32_t>{259, '!', '!'}));
  EXPECT_EQ(t->Decode(Ids(*t, "héllo wörld\r\n\t  🙂")), "héllo wörld\r\n\t  🙂");
}

TEST(TokenizerTest, AddedTokensSplitFirst) {
  auto t = Make(TinyTokenizer(ByteLevelPre(true)));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hello<|endoftext|>hello<|end|>"), (std::vector<int32_t>{259, 300, 259, 301}));
  EXPECT_EQ(t->Decode({259, 300}), "hello<|endoftext|>");
}

TEST(TokenizerTest, ByteLevelWithoutRegexMergesAcrossSpaces) {
  // Without the regex the whole text is one pre-token: " w" can merge after "hello".
  auto t = Make(TinyTokenizer(ByteLevelPre(false)));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hello world"), (std::vector<int32_t>{259, 262, 'l', 'd'}));
  EXPECT_EQ(Ids(*t, "a  w"), (std::vector<int32_t>{'a', ' ', 260}));
}

TEST(TokenizerTest, PrefixSpaceAndSplitSequence) {
  auto prefixed = Make(TinyTokenizer(ByteLevelPre(true, /*prefix=*/true)));
  ASSERT_NE(prefixed, nullptr);
  EXPECT_EQ(Ids(*prefixed, "world"), (std::vector<int32_t>{262, 'l', 'd'}));
  json seq = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Split"},
                                      {"pattern", {{"Regex", R"(\p{N}{1,3}| ?\p{L}+|\s+|.)"}}},
                                      {"behavior", "Isolated"},
                                      {"invert", false}},
                                     ByteLevelPre(false)})}};
  auto split = Make(TinyTokenizer(seq));
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(Ids(*split, "12345 world"),
            (std::vector<int32_t>{'1', '2', '3', '4', '5', 262, 'l', 'd'}));
}

TEST(TokenizerTest, RefusesWhatItCannotReproduce) {
  json j = TinyTokenizer(ByteLevelPre(true));
  j["normalizer"] = {{"type", "NFC"}};
  auto t = Tokenizer::FromJson(j.dump(), "", "x/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("normalizer NFC is not supported"), std::string::npos);
  json w = TinyTokenizer({{"type", "Whitespace"}});
  EXPECT_FALSE(Tokenizer::FromJson(w.dump(), "", "x").ok());
  EXPECT_FALSE(Tokenizer::FromJson("{", "", "x").ok());
  auto bad_utf8 = Make(TinyTokenizer(ByteLevelPre(true)))->Encode("a\xff");
  EXPECT_FALSE(bad_utf8.ok());
}

class TokenizeTextsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshrun_tokenizer_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "text");
    fs::create_directories(dir_ / "tok");
    std::ofstream(dir_ / "tok" / "tokenizer.json") << TinyTokenizer(ByteLevelPre(true)).dump();
    std::ofstream(dir_ / "text" / "a.txt") << "hello";
    std::ofstream(dir_ / "text" / "b.txt") << "world";
    std::ofstream(dir_ / "text" / "c.dat") << std::string("\x01\xff", 2);  // skipped
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TokenizeTextsTest, FolderWithEndOfTextBetweenFilesAndACache) {
  LoadOptions o;
  o.tokenizer = (dir_ / "tok").string();
  o.cache_dir = (dir_ / "cache").string();
  auto s = LoadTokens((dir_ / "text").string(), "auto", o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{259, 300, 'w', 261, 'l', 'd'}));
  EXPECT_EQ(s->vocab_size, 302);
  EXPECT_FALSE(s->from_cache);
  ASSERT_TRUE(fs::exists(s->cache_path));
  auto again = LoadTokens((dir_ / "text").string(), "auto", o);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->from_cache);
  EXPECT_EQ(again->tokens, s->tokens);
  // Changed text: a new key, rebuilt.
  std::ofstream(dir_ / "text" / "b.txt") << "hello";
  auto changed = LoadTokens((dir_ / "text").string(), "auto", o);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(changed->from_cache);
  EXPECT_NE(changed->cache_path, s->cache_path);
  EXPECT_EQ(changed->tokens, (std::vector<int32_t>{259, 300, 259}));
}

TEST_F(TokenizeTextsTest, WideTokenFilesRoundTrip) {
  const std::string path = (dir_ / "wide.bin").string();
  ASSERT_TRUE(WriteLlmcTokens(path, {1, 70000, 128255}, 128256).ok());
  auto s = LoadTokens(path, "auto");
  ASSERT_TRUE(s.ok()) << s.status().message();
  std::vector<int32_t> ids(3);
  ASSERT_EQ(s->size(), 3);
  ASSERT_TRUE(s->Read(0, 3, ids.data()).ok());  // token files are mapped, read through Read
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 70000, 128255}));
  ASSERT_TRUE(WriteLlmcTokens(path, {1, 65534}, 65535).ok());
  EXPECT_EQ(fs::file_size(path), 256u * 4 + 2 * 2);
}

}  // namespace
}  // namespace meshrun
