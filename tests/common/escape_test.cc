// EscapeText, EscapeJsonText and IsPlainText (common/escape.h): what reaches a terminal or a log
// line of text a client, a worker or a rank sent.
#include "common/escape.h"

#include <gtest/gtest.h>

#include <string>

namespace meshrun {
namespace {

TEST(EscapeTextTest, TerminalEscapesArePrintedAsText) {
  // Set the window title, clear the screen, ring the bell: all shown, none sent.
  EXPECT_EQ(EscapeText("\x1b]0;owned\x07 \x1b[2J\x1b[H"), "\\x1b]0;owned\\x07 \\x1b[2J\\x1b[H");
  EXPECT_EQ(EscapeText("a\rb\x7f\x01"), "a\\x0db\\x7f\\x01");
  // A newline cannot start a forged line.
  EXPECT_EQ(EscapeText("done\n2026-01-01 info forged"), "done\\x0a2026-01-01 info forged");
}

TEST(EscapeTextTest, C1ControlsInUtf8AndAsRawBytes) {
  // U+009B is a one-character CSI on some terminals; U+0080 and U+009F are the ends of C1.
  EXPECT_EQ(EscapeText("x\xc2\x9b"
                       "31m"),
            "x\\u009b31m");
  EXPECT_EQ(EscapeText("\xc2\x80|\xc2\x9f|\xc2\xa0"), "\\u0080|\\u009f|\xc2\xa0");
  // A raw 0x9b (not UTF-8) is a CSI to a terminal in an 8-bit locale.
  EXPECT_EQ(EscapeText("x\x9b"
                       "31m"),
            "x\\x9b31m");
}

TEST(EscapeTextTest, BidiControlsAndSeparators) {
  EXPECT_EQ(EscapeText("a\u202eb\u202ac\u202dd"), "a\\u202eb\\u202ac\\u202dd");
  EXPECT_EQ(EscapeText("\u2066\u2067\u2068\u2069"), "\\u2066\\u2067\\u2068\\u2069");
  EXPECT_EQ(EscapeText("\u200e\u200f\u061c"), "\\u200e\\u200f\\u061c");
  EXPECT_EQ(EscapeText("a\u2028b\u2029c"), "a\\u2028b\\u2029c");
  // Neighbours that are ordinary characters stay.
  EXPECT_EQ(EscapeText("\u2010\u2030\u2065\u206a\u061b"), "\u2010\u2030\u2065\u206a\u061b");
}

TEST(EscapeTextTest, InvalidUtf8IsEscapedBytewise) {
  EXPECT_EQ(EscapeText("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(EscapeText("a\xc3"), "a\\xc3");                           // truncated
  EXPECT_EQ(EscapeText("\xc0\x9b"), "\\xc0\\x9b");                    // overlong ESC-like form
  EXPECT_EQ(EscapeText("\xe0\x80\x9b"), "\\xe0\\x80\\x9b");           // overlong
  EXPECT_EQ(EscapeText("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(EscapeText("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(EscapeText("\xe2\x80"), "\\xe2\\x80");                    // a bidi control cut short
}

TEST(EscapeTextTest, OrdinaryTextIsUnchanged) {
  EXPECT_EQ(EscapeText("step 3 loss 5.25\tlr 3e-4"), "step 3 loss 5.25\tlr 3e-4");
  EXPECT_EQ(EscapeText("naïve — ünïcödé ✓ 日本 🚀 C:\\path"), "naïve — ünïcödé ✓ 日本 🚀 C:\\path");
  EXPECT_EQ(EscapeText(""), "");
}

TEST(EscapeTextTest, TabIsKeptOnlyWhenAsked) {
  EXPECT_EQ(EscapeText("a\tb"), "a\tb");
  EXPECT_EQ(EscapeText("a\tb", /*keep_tab=*/false), "a\\x09b");
}

TEST(EscapeTextTest, EscapingTwiceChangesNothingMore) {
  const std::string nasty = "\x1b[31m\n\r\t\x7f\xc2\x9b\x9b\xe2\x80\xae\xff ok \\x1b \xe2\x81\xa6";
  const std::string once = EscapeText(nasty);
  EXPECT_EQ(EscapeText(once), once);
  EXPECT_TRUE(IsPlainText(EscapeText(nasty, /*keep_tab=*/false)));
}

TEST(EscapeJsonTextTest, WritesUnsafeCodePointsAsJsonEscapes) {
  // What nlohmann's dump leaves raw: DEL, C1, bidi controls (and invalid bytes).
  EXPECT_EQ(EscapeJsonText("{\"t\":\"a\x7f\xc2\x9b\xe2\x80\xae\xe2\x81\xa9\"}"),
            "{\"t\":\"a\\u007f\\u009b\\u202e\\u2069\"}");
  EXPECT_EQ(EscapeJsonText("\"\x9b\""), "\"\\ufffd\"");
  EXPECT_EQ(EscapeJsonText("{\"t\":\"ünï ✓\"}\n"), "{\"t\":\"ünï ✓\"}\n");
}

TEST(Utf8Test, ValidUtf8EscapesOnlyWhatIsNotUtf8) {
  EXPECT_EQ(ValidUtf8("ok \x1b[2J ü \xc2\x9b"), "ok \x1b[2J ü \xc2\x9b");
  EXPECT_EQ(ValidUtf8("a\x9b b\xc3"), "a\\x9b b\\xc3");
}

TEST(Utf8Test, CutNeverSplitsACharacter) {
  EXPECT_EQ(CutUtf8("abc", 5), "abc");
  EXPECT_EQ(CutUtf8("abc", 2), "ab");
  EXPECT_EQ(CutUtf8("aü", 2), "a");             // ü is 2 bytes
  EXPECT_EQ(CutUtf8("a\xe2\x80\xae", 3), "a");  // a 3-byte character cut after 2
  EXPECT_EQ(CutUtf8("a\xe2\x80\xae", 4), "a\xe2\x80\xae");
  EXPECT_EQ(CutUtf8("🚀🚀", 5), "🚀");
}

TEST(IsPlainTextTest, RefusesWhatEscapeTextWouldChange) {
  EXPECT_TRUE(IsPlainText("worker-1.example.com:9000"));
  EXPECT_TRUE(IsPlainText("NVIDIA H200 ✓ ünï"));
  EXPECT_TRUE(IsPlainText(""));
  for (const std::string bad :
       {"a\x1b", "a\n", "a\t", "a\x7f", "a\xc2\x9b", "a\x9b", "a\xe2\x80\xae", "a\xe2\x81\xa6",
        "a\xd8\x9c", "a\xe2\x80\x8f", "a\xff"}) {
    EXPECT_FALSE(IsPlainText(bad)) << EscapeText(bad);
  }
}

}  // namespace
}  // namespace meshrun
