// The pre-tokenizer regexes run under PCRE2's match and depth limits: a tokenizer.json whose
// pattern backtracks catastrophically fails with an error naming data.tokenizer and the
// pattern instead of spinning for minutes, while the GPT-2 and Llama 3 patterns still split
// ordinary text and long whitespace runs (which make them backtrack once per byte).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/data/tokenizer.h"
#include "tests/fakes/byte_level.h"

namespace meshrun {
namespace {

using testing::ByteLevelChar;

using json = nlohmann::json;

constexpr const char* kLimitsLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Ids 0..255 are the bytes (no merges): a Split on `pattern` (Isolated), then ByteLevel; or,
// with an empty pattern, ByteLevel with its own GPT-2 regex.
std::shared_ptr<const Tokenizer> ByteTokenizer(const std::string& pattern) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b;
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", pattern.empty()}};
  if (!pattern.empty()) {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", pattern}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             pre}}};
  }
  const json j = {{"version", "1.0"},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", pre},
                  {"added_tokens", json::array()},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  auto t = Tokenizer::FromJson(j.dump(), "", "test/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : nullptr;
}

// About `bytes` of words, a comma after every fifth: (\w+\s?)*$ tries every way to split each
// run of words at every start position, each below PCRE2's default limit of 10^7 steps, so
// without a tighter limit it ran for 15 s on 20 KB (and minutes on more) before matching.
std::string CommaWords(size_t bytes) {
  const std::string words = "hello world this is some text, ";
  std::string text;
  while (text.size() < bytes) text += words;
  return text;
}

void ExpectLimitError(const std::string& pattern, const std::string& text) {
  auto t = ByteTokenizer(pattern);
  ASSERT_NE(t, nullptr);
  StatusOr<std::vector<int32_t>> ids = t->Encode(text);
  ASSERT_FALSE(ids.ok()) << pattern << " split " << text.size() << " bytes";
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = ids.status().message();
  EXPECT_EQ(m.rfind("data.tokenizer: the pre-tokenizer pattern '" + pattern + "' exceeded the ", 0),
            0u)
      << m;
  EXPECT_NE(m.find("limit"), std::string::npos) << m;
  EXPECT_NE(m.find("(hint: "), std::string::npos) << m;
}

TEST(TokenizerLimitsTest, NestedQuantifierOnTwentyKilobytesFailsWithTheLimitError) {
  ExpectLimitError("(a+)+$", std::string(20000, 'a') + "!");
  ExpectLimitError(R"((\w+\s?)*$)", CommaWords(20000));
}

TEST(TokenizerLimitsTest, ControlBytesOfAPatternAreEscapedInTheError) {
  auto t = ByteTokenizer("(a+)+\x01$");
  ASSERT_NE(t, nullptr);
  StatusOr<std::vector<int32_t>> ids = t->Encode(std::string(20000, 'a') + "\x01!");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("'(a+)+\\x01$'"), std::string::npos)
      << ids.status().message();
}

// What the limit must never refuse: ordinary text, and a megabyte of spaces before a word, on
// which Llama 3's \s*[\r\n]+ backtracks once per space.
TEST(TokenizerLimitsTest, GptTwoAndLlamaThreePatternsSplitLongInputs) {
  const std::string spaces = std::string(1 << 20, ' ') + "x";
  const std::string words = CommaWords(1 << 20);
  for (const std::string pattern : {std::string(), std::string(kLimitsLlama3Pattern)}) {
    auto t = ByteTokenizer(pattern);
    ASSERT_NE(t, nullptr);
    for (const std::string* text : {&spaces, &words}) {
      StatusOr<std::vector<int32_t>> ids = t->Encode(*text);
      ASSERT_TRUE(ids.ok()) << (pattern.empty() ? "gpt2" : "llama3") << ": "
                            << ids.status().message();
      EXPECT_EQ(ids->size(), text->size());  // one id per byte: no merges
      EXPECT_EQ(t->Decode(*ids), *text);
    }
  }
}

}  // namespace
}  // namespace meshrun
