// Tests for SentencePiece-style BPE (engine/data/sentencepiece_bpe.cc) on a hand-written
// tokenizer.json: characters looked up whole, merges by rank, byte fallback to <0xNN>, unk
// (fused or not), the Mistral normalizer Sequence against the Metaspace pre-tokenizer and its
// prepend schemes, normalized added tokens, decoding, and what is refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/data/tokenizer.h"

namespace meshrun {
namespace sentencepiece_bpe_test {  // named: the unity batch holds other tests' helpers

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kMeta = "\xE2\x96\x81";  // ▁

// <unk> <s> </s> = 0 1 2; <0x00>…<0xFF> = 3…258; ▁ h e l l o … = 259…; merges in rank order.
json SpmTokenizer(bool byte_fallback, bool fuse_unk) {
  json vocab = json::object();
  vocab["<unk>"] = 0, vocab["<s>"] = 1, vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int id = 259;
  for (const std::string c :
       {kMeta, std::string("h"), std::string("e"), std::string("l"), std::string("o"),
        std::string("w"), std::string("r"), std::string("d"), std::string("\xC3\xA9")}) {
    vocab[c] = id++;  // ▁ 259, h 260, e 261, l 262, o 263, w 264, r 265, d 266, é 267
  }
  const std::vector<std::pair<std::string, std::string>> merges = {{"l", "l"},        // 268
                                                                   {"h", "e"},        // 269
                                                                   {kMeta, "h"},      // 270
                                                                   {"he", "ll"},      // 271
                                                                   {"hell", "o"},     // 272
                                                                   {kMeta, "hello"},  // 273
                                                                   {kMeta, "w"},      // 274
                                                                   {"o", "r"}};       // 275
  json m = json::array();
  for (const auto& [a, b] : merges) {
    m.push_back(a + " " + b);
    vocab[a + b] = id++;
  }
  json added = json::array();
  for (int k = 0; k < 3; ++k) {
    added.push_back({{"id", k},
                     {"content", k == 0   ? "<unk>"
                                 : k == 1 ? "<s>"
                                          : "</s>"},
                     {"special", true},
                     {"normalized", false}});
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", kMeta}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", byte_fallback},
        {"fuse_unk", fuse_unk},
        {"vocab", vocab},
        {"merges", m}}}};
}

json Metaspace(const std::string& scheme, bool split) {
  json j = SpmTokenizer(true, true);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", split}};
  return j;
}

std::shared_ptr<const Tokenizer> Make(const json& j) {
  auto t = Tokenizer::FromJson(j.dump(), "", "test");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : nullptr;
}

Ids Encode(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? *ids : Ids{};
}

TEST(SentencePieceBpeTest, MergesByRankOnTheNormalizedText) {
  auto t = Make(SpmTokenizer(true, true));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 276);
  EXPECT_EQ(t->end_of_text_id(), 2);
  // "▁hello": (l,l) r0, (h,e) r1, then (▁,h) r2 is stale, (he,ll) r3, (hell,o) r4, (▁,hello) r5.
  EXPECT_EQ(Encode(*t, "hello"), (Ids{273}));
  // One word (no pre-tokenizer): "▁hello▁world" → ▁hello ▁w or l d.
  EXPECT_EQ(Encode(*t, "hello world"), (Ids{273, 274, 275, 262, 266}));
  // "lll": the leftmost pair of equal rank merges first.
  EXPECT_EQ(Encode(*t, "lll"), (Ids{259, 268, 262}));
  // Runs of spaces are runs of ▁; tabs and newlines are characters like others (here bytes).
  EXPECT_EQ(Encode(*t, "h  h\t\n"), (Ids{270, 259, 270, 3 + '\t', 3 + '\n'}));
  EXPECT_EQ(t->Decode(Encode(*t, "hello world")), "hello world");
}

TEST(SentencePieceBpeTest, ByteFallbackForCharactersNotInTheVocabulary) {
  auto t = Make(SpmTokenizer(true, true));
  ASSERT_NE(t, nullptr);
  // é is a piece; 😀 (F0 9F 98 80) is not: its bytes as <0xNN>.
  EXPECT_EQ(Encode(*t, "h\xC3\xA9\xF0\x9F\x98\x80"),
            (Ids{270, 267, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
  EXPECT_EQ(t->Decode({270, 267, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}),
            "h\xC3\xA9\xF0\x9F\x98\x80");
  // A run of byte tokens that is not UTF-8: one U+FFFD per token.
  EXPECT_EQ(t->Decode({260, 3 + 0xF0, 3 + 0x9F}), "h\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_FALSE(t->Encode("bad \xFF").ok());
}

TEST(SentencePieceBpeTest, UnknownCharactersWithoutByteFallback) {
  auto fused = Make(SpmTokenizer(false, true));
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(Encode(*fused,
                   "h\xF0\x9F\x98\x80\xF0\x9F\x98\x80"
                   "e"),
            (Ids{270, 0, 261}));
  auto apart = Make(SpmTokenizer(false, false));
  ASSERT_NE(apart, nullptr);
  EXPECT_EQ(Encode(*apart,
                   "h\xF0\x9F\x98\x80\xF0\x9F\x98\x80"
                   "e"),
            (Ids{270, 0, 0, 261}));
}

TEST(SentencePieceBpeTest, PrependAndMetaspaceSchemes) {
  // The normalizer prepends ▁ to every segment, also after an added token.
  auto mistral = Make(SpmTokenizer(true, true));
  ASSERT_NE(mistral, nullptr);
  EXPECT_EQ(Encode(*mistral, "<s>hello</s>"), (Ids{1, 273, 2}));
  // Metaspace first: only at the start of the text.
  auto first = Make(Metaspace("first", true));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(Encode(*first, "hello"), (Ids{273}));
  EXPECT_EQ(Encode(*first, "<s>hello"), (Ids{1, 272}));
  // split: before each ▁, so "▁▁world" is "▁" and "▁world".
  EXPECT_EQ(Encode(*first, "hello  world"), (Ids{273, 259, 274, 275, 262, 266}));
  auto always = Make(Metaspace("always", true));
  ASSERT_NE(always, nullptr);
  EXPECT_EQ(Encode(*always, "<s>hello"), (Ids{1, 273}));
  auto never = Make(Metaspace("never", false));
  ASSERT_NE(never, nullptr);
  EXPECT_EQ(Encode(*never, "hello world"), (Ids{272, 274, 275, 262, 266}));
}

TEST(SentencePieceBpeTest, NormalizedAddedTokensMatchTheirNormalizedContent) {
  json j = SpmTokenizer(true, true);
  for (json& a : j["added_tokens"]) a["normalized"] = true;
  auto t = Make(j);
  ASSERT_NE(t, nullptr);
  // <s> is matched as "▁<s>" in "▁h▁<s>h": after a space, not glued to a word.
  EXPECT_EQ(Encode(*t, "h <s>h"), (Ids{270, 1, 260}));
  EXPECT_EQ(Encode(*t, "h<s>"), (Ids{270, 3 + '<', 3 + 's', 3 + '>'}));
  EXPECT_EQ(t->end_of_text_id(), 2);
}

TEST(SentencePieceBpeTest, GemmaSplitOnAReplacedSpaceIsNoSplit) {
  json j = SpmTokenizer(true, true);
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}};
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"String", " "}}},
                        {"behavior", "MergedWithPrevious"},
                        {"invert", false}};
  auto t = Make(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Encode(*t, "hello world"), (Ids{272, 274, 275, 262, 266}));
  // A Split on anything the normalizer leaves in place is refused.
  j["pre_tokenizer"]["pattern"]["String"] = "o";
  EXPECT_FALSE(Tokenizer::FromJson(j.dump(), "", "x").ok());
}

TEST(SentencePieceBpeTest, RefusesWhatItCannotReproduce) {
  json nfkc = SpmTokenizer(true, true);
  nfkc["normalizer"] = {{"type", "NFKC"}};
  auto t = Tokenizer::FromJson(nfkc.dump(), "", "x/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("data.tokenizer: x/tokenizer.json: normalizer NFKC is not "
                                      "supported (hint: "),
            std::string::npos)
      << t.status().message();
  json regex = SpmTokenizer(true, true);
  regex["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", kMeta}};
  EXPECT_FALSE(Tokenizer::FromJson(regex.dump(), "", "x").ok());
  json split = Metaspace("first", true);
  split["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({split["pre_tokenizer"], {{"type", "Digits"}}})}};
  EXPECT_FALSE(Tokenizer::FromJson(split.dump(), "", "x").ok());
}

}  // namespace sentencepiece_bpe_test
}  // namespace meshrun
