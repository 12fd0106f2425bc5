// EscapeControl: what `meshrun logs` and `submit --follow` print of rank output. Control
// characters a rank or a worker wrote cannot reach the reader's terminal.
#include <gtest/gtest.h>

#include "client/command.h"

namespace meshrun::client {
namespace {

TEST(EscapeControlTest, TerminalEscapesArePrintedAsText) {
  // Set the window title, clear the screen, ring the bell: all shown, none sent.
  EXPECT_EQ(EscapeControl("\x1b]0;owned\x07 \x1b[2J\x1b[H"), "\\x1b]0;owned\\x07 \\x1b[2J\\x1b[H");
  EXPECT_EQ(EscapeControl("a\rb\x7f\x01"), "a\\x0db\\x7f\\x01");
  // The C1 controls in UTF-8 (U+009B is a one-character CSI on some terminals).
  EXPECT_EQ(EscapeControl("x\xc2\x9b"
                          "31m"),
            "x\\u009b31m");
}

TEST(EscapeControlTest, OrdinaryTextIsUnchanged) {
  EXPECT_EQ(EscapeControl("step 3 loss 5.25\tlr 3e-4"), "step 3 loss 5.25\tlr 3e-4");
  EXPECT_EQ(EscapeControl("naïve — ünïcödé ✓ C:\\path"), "naïve — ünïcödé ✓ C:\\path");
  EXPECT_EQ(EscapeControl(""), "");
}

}  // namespace
}  // namespace meshrun::client
