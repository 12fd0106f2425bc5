// Token streams for training and evaluation (docs/data.md): loads a UTF-8 text file, a folder
// of text files, or a `.bin` token file (llm.c with its 256-int32 header, or nanoGPT's raw
// uint16) into memory as int32 token ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshrun {

// The llm.c data file header: 256 little-endian int32, header[0] = magic, header[1] = version,
// header[2] = number of uint16 tokens that follow.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int kLlmcHeaderInts = 256;

// A whole token stream, owned in memory. Immutable after LoadTokens; safe to share between
// threads for reading. Built by LoadTokens, read by BatchSampler and the evaluator.
struct TokenStream {
  std::string path;    // as given to LoadTokens
  std::string format;  // resolved format: "text", "llmc" or "nanogpt" (never "auto")
  std::vector<int32_t> tokens;
  int32_t max_token_id = -1;  // largest id in `tokens` (check it against vocab_size)
  // For a text folder: the files that were read, in order, and the ones skipped with why.
  std::vector<std::string> files;
  std::vector<std::string> skipped;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// Loads `path` as `format` ("auto", "text", "llmc" or "nanogpt").
//  - text: a UTF-8 file, or a folder whose text files are concatenated in file-name order;
//    byte-level tokens 0..255.
//  - llmc: llm.c's header (magic 20240520, version 1, token count) followed by uint16 tokens.
//  - nanogpt: raw little-endian uint16 tokens.
//  - auto: the llm.c magic → llmc; else a `.bin` extension → nanogpt; else text.
// Errors (INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS) name the path, what is wrong and a fix.
// An empty stream is an error.
StatusOr<TokenStream> LoadTokens(const std::string& path, const std::string& format);

// True when `bytes` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF) with no NUL
// byte. On false, *bad_offset (when given) is the offset of the first offending byte.
bool IsUtf8Text(const std::string& bytes, size_t* bad_offset = nullptr);

}  // namespace meshrun
