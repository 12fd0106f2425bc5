// What `meshrun tokenize`'s two paths share (client/tokenize_command.cc, the streamed text path,
// and client/tokenize_instruction.cc, instruction data with masks): the command's flags, its
// inputs listed as files, and the errors both word alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshrun {
class Tokenizer;
}  // namespace meshrun

namespace meshrun::client {

struct TokenizeFlags {
  std::string tokenizer, output;
  std::vector<std::string> inputs;
  std::string field = "text";
  std::string prefix = "shard";
  int64_t shard_tokens = 0;
  int64_t chunk_bytes = 1 << 20;
  int threads = 0;
  bool quiet = false;
  // Instruction data (docs/data.md "Making token files with masks"): records rendered with this
  // template (as data.template), a .mask file beside the ids; --seq-len lays samples out in
  // training windows (one per window, or packed with --pack).
  std::string chat_template;
  bool masks = false;
  int seq_len = 0;
  bool pack = false;
};

struct InputFile {
  std::string path;
  int64_t size = 0;
  bool jsonl = false;
};

// The inputs as files in stream order: folders as data.train lists them (name order, a folder's
// files that are not UTF-8 skipped, JSONL files by their .jsonl extension), globs expanded in
// byte order of the names.
Status ListInputs(const std::vector<std::string>& inputs, int threads,
                  std::vector<InputFile>* files, std::vector<std::string>* skipped_all);

// The end-of-text error, as TokenizeTexts words it.
Status NoEndOfTextError(const std::string& between);

// A tokenizer's error `s` at `where` (a file, or FILE:LINE), keeping its field.
Status TokenizerError(const Status& s, const std::string& where);

// Instruction data: every record rendered (JSONL) or every text file as one target document,
// encoded in parallel over records, laid out (back to back, or in windows of --seq-len), and
// written as OUT.bin with OUT.mask beside it (one flag byte per token). Held in memory.
int RunInstructionTokenize(const TokenizeFlags& o, std::shared_ptr<const Tokenizer> tok,
                           int threads);

}  // namespace meshrun::client
