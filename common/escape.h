// EscapeText: the one escaping of text that came over the network (a client's reason, a worker's
// error or path, a rank's log line) before it reaches a terminal or a log line, and IsPlainText,
// the check of names and other one-line fields that the coordinator accepts (docs/security.md
// "What clients print"). Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace meshrun {

// What a terminal or a log reader would act on, written out as printable ASCII:
//  - C0 controls (ESC, BEL, newline, CR; tab unless `keep_tab`) and DEL as `\xNN`;
//  - C1 controls U+0080..U+009F (UTF-8 encoded; U+009B is a one-character CSI) as `\u00NN`;
//  - bidirectional controls (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069) and the
//    line and paragraph separators U+2028, U+2029 as `\uNNNN`;
//  - every byte that is not part of valid UTF-8 (a raw 0x9b, a truncated or overlong sequence,
//    a surrogate) as `\xNN`.
// Everything else is unchanged, backslashes included, so escaping twice changes nothing more and
// a line stays one line. `keep_tab`: tabs of log lines stay; table cells pass false.
std::string EscapeText(std::string_view text, bool keep_tab = true);

// `dumped`: JSON text (nlohmann's dump with invalid UTF-8 replaced) with DEL, the C1, bidi and
// separator code points above written as `\uNNNN` escapes; they only occur inside JSON strings,
// where the escape means the same character. Bytes that are not valid UTF-8 become `\ufffd`.
std::string EscapeJsonText(std::string_view dumped);

// True when `text` is valid UTF-8 and holds nothing EscapeText would escape, tab included: the
// test for names, addresses, labels and reasons the coordinator keeps and shows.
bool IsPlainText(std::string_view text);

// `text` with each byte that is not part of valid UTF-8 written as `\xNN`, nothing else changed:
// what a proto3 string (which must be UTF-8, or the receiver cannot parse the message) can carry
// of arbitrary bytes, such as a rank's output.
std::string ValidUtf8(std::string_view text);

// The first `max_bytes` of `text` or fewer: never ends inside a UTF-8 sequence.
std::string_view CutUtf8(std::string_view text, size_t max_bytes);

// One of the bidirectional controls or separators above (a code point, not its encoding).
bool IsBidiControl(uint32_t code_point);

}  // namespace meshrun
