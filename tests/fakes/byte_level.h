// GPT-2's ByteLevel alphabet (bytes_to_unicode) for tests that write a tokenizer.json: printable
// Latin-1 bytes stand for themselves, the other 68 bytes for U+0100… in byte order. Written here
// once, independently of engine/data/tokenizer.cc's, so a test's tokenizer checks the product's.
#pragma once

#include <string>

namespace meshrun::testing {

// The alphabet's character for byte b (0..255), as UTF-8.
inline std::string ByteLevelChar(int b) {
  auto direct = [](int k) {
    return (k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE;
  };
  int cp = b;
  if (!direct(b)) {
    cp = 256;
    for (int k = 0; k < b; ++k) cp += direct(k) ? 0 : 1;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

}  // namespace meshrun::testing
