// What the client prints of text from the coordinator: rank output (`logs`, `submit --follow`),
// table cells (`status`, `jobs`, `workers`), JSON (-o json) and error messages, each escaped with
// common/escape.h. The escaping itself is tested in tests/common/escape_test.cc.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "client/command.h"
#include "client/coordinator_client.h"

namespace meshrun::client {
namespace {

TEST(EscapeControlTest, TerminalEscapesArePrintedAsText) {
  // Set the window title, clear the screen, ring the bell: all shown, none sent.
  EXPECT_EQ(EscapeControl("\x1b]0;owned\x07 \x1b[2J\x1b[H"), "\\x1b]0;owned\\x07 \\x1b[2J\\x1b[H");
  EXPECT_EQ(EscapeControl("a\rb\x7f\x01"), "a\\x0db\\x7f\\x01");
  // The C1 controls in UTF-8 (U+009B is a one-character CSI on some terminals) and raw.
  EXPECT_EQ(EscapeControl("x\xc2\x9b"
                          "31m \x9b"),
            "x\\u009b31m \\x9b");
}

TEST(EscapeControlTest, OrdinaryTextIsUnchanged) {
  EXPECT_EQ(EscapeControl("step 3 loss 5.25\tlr 3e-4"), "step 3 loss 5.25\tlr 3e-4");
  EXPECT_EQ(EscapeControl("naïve — ünïcödé ✓ C:\\path"), "naïve — ünïcödé ✓ C:\\path");
  EXPECT_EQ(EscapeControl(""), "");
}

TEST(EscapeControlTest, TableCellsAreEscapedAndStayOneLine) {
  std::ostringstream out;
  PrintTable(
      out,
      {{"NAME", "ADDRESS"}, {"w\x1b[2J", "10.0.0.1\n10.0.0.2"}, {"w\xc2\x9b", "a\tb\xe2\x80\xae"}});
  EXPECT_EQ(out.str(),
            "NAME      ADDRESS\n"
            "w\\x1b[2J  10.0.0.1\\x0a10.0.0.2\n"
            "w\\u009b   a\\x09b\\u202e\n");
}

TEST(EscapeControlTest, JsonKeepsNoRawControls) {
  nlohmann::ordered_json value = {{"message", "a\x1b\x7f\xc2\x9b\xe2\x80\xae"},
                                  {"path", "bad \xff byte"}};
  // nlohmann alone would throw on the invalid byte (here U+FFFD) and leave DEL, C1 and bidi
  // raw.
  EXPECT_EQ(DumpJson(value),
            "{\"message\":\"a\\u001b\\u007f\\u009b\\u202e\",\"path\":\"bad \xef\xbf\xbd byte\"}");
  EXPECT_EQ(nlohmann::ordered_json::parse(DumpJson(value))["message"],
            "a\x1b\x7f\xc2\x9b\xe2\x80\xae");
}

TEST(EscapeControlTest, ErrorMessagesAreEscaped) {
  ::testing::internal::CaptureStderr();
  const int code = ReportError(InvalidArgumentError("reason: 'x\x1b[2J\xc2\x9b\nforged' bad"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, kExitInvalidInput);
  EXPECT_EQ(err, "error: reason: 'x\\x1b[2J\\u009b forged' bad\n");
}

}  // namespace
}  // namespace meshrun::client
