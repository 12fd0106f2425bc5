// EscapeText, EscapeJsonText and IsPlainText (see escape.h): one UTF-8 decoder, one rule for
// which characters are unsafe.
#include "common/escape.h"

namespace meshrun {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// The code point at text[i] and its length in bytes; length 0 when the bytes there are not valid
// UTF-8 (truncated, overlong, a stray continuation byte, a surrogate, above U+10FFFF).
struct Decoded {
  uint32_t code_point = 0;
  size_t length = 0;
};

Decoded DecodeAt(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return {c, 1};
  size_t extra = 0;
  uint32_t cp = 0;
  if ((c & 0xe0) == 0xc0) {
    extra = 1, cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    extra = 2, cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    extra = 3, cp = c & 0x07;
  } else {
    return {};
  }
  if (i + extra >= text.size()) return {};
  for (size_t k = 1; k <= extra; ++k) {
    const auto cc = static_cast<unsigned char>(text[i + k]);
    if ((cc & 0xc0) != 0x80) return {};
    cp = (cp << 6) | (cc & 0x3f);
  }
  static constexpr uint32_t kMinForLength[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {};
  return {cp, extra + 1};
}

// A code point a terminal or a log reader acts on (tab aside, decided by the caller).
bool IsUnsafe(uint32_t cp) {
  return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f) || IsBidiControl(cp);
}

void AppendByte(std::string& out, unsigned char byte) {
  out += "\\x";
  out += kHex[byte >> 4];
  out += kHex[byte & 0xf];
}

void AppendCodePoint(std::string& out, uint32_t cp) {
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 0xf];
}

}  // namespace

bool IsBidiControl(uint32_t cp) {
  return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

std::string EscapeText(std::string_view text, bool keep_tab) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = DecodeAt(text, i);
    if (d.length == 0) {  // not UTF-8: each byte on its own
      AppendByte(out, static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    const bool unsafe = IsUnsafe(d.code_point) && !(keep_tab && d.code_point == '\t');
    if (!unsafe) {
      out.append(text.substr(i, d.length));
    } else if (d.code_point < 0x80) {
      AppendByte(out, static_cast<unsigned char>(d.code_point));
    } else {
      AppendCodePoint(out, d.code_point);
    }
    i += d.length;
  }
  return out;
}

std::string EscapeJsonText(std::string_view dumped) {
  std::string out;
  out.reserve(dumped.size());
  for (size_t i = 0; i < dumped.size();) {
    const Decoded d = DecodeAt(dumped, i);
    if (d.length == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    // C0 controls cannot occur raw in JSON text but between tokens (whitespace): left as is.
    if (d.code_point >= 0x7f && IsUnsafe(d.code_point)) {
      AppendCodePoint(out, d.code_point);
    } else {
      out.append(dumped.substr(i, d.length));
    }
    i += d.length;
  }
  return out;
}

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = DecodeAt(text, i);
    if (d.length == 0) {
      AppendByte(out, static_cast<unsigned char>(text[i]));
      ++i;
    } else {
      out.append(text.substr(i, d.length));
      i += d.length;
    }
  }
  return out;
}

std::string_view CutUtf8(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  // text[cut] is the first byte left out: while it continues a sequence, leave that out too.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return text.substr(0, cut);
}

bool IsPlainText(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Decoded d = DecodeAt(text, i);
    if (d.length == 0 || IsUnsafe(d.code_point)) return false;
    i += d.length;
  }
  return true;
}

}  // namespace meshrun
