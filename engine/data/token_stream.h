// Token streams for training and evaluation (docs/data.md): a UTF-8 text file or a folder of
// text files, loaded into memory as int32 token ids; or token files (llm.c with its 256-int32
// header, or nanoGPT's raw uint16) — one file, a folder or a glob of shards — mapped read-only
// and converted to int32 only for the windows read (engine/data/mapped_tokens.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/data/mapped_tokens.h"

namespace meshrun {

// The llm.c data file header: 256 little-endian int32, header[0] = magic, header[1] = version,
// header[2] = number of tokens that follow: uint16 in version 1, uint32 in version 2 (written for
// vocabularies over 65,535 ids).
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int32_t kLlmcVersionUint32 = 2;
inline constexpr int kLlmcHeaderInts = 256;

class Tokenizer;

// A token stream: text owned in memory (`tokens`), or token files mapped (`mapped`, `tokens`
// then empty). Immutable after LoadTokens; safe to share between threads for reading. Built by
// LoadTokens, read by BatchSampler and the evaluator through size() and Read().
struct TokenStream {
  std::string path;    // as given to LoadTokens
  std::string format;  // resolved format: "text", "llmc" or "nanogpt" (never "auto")
  std::vector<int32_t> tokens;
  // Token files: the mapped shards (one for a single file), in stream order.
  std::shared_ptr<const MappedTokens> mapped;
  // Largest id in `tokens` (check it against vocab_size); -1 for mapped files, whose ids are
  // not scanned at load (MaxTokenId scans; Read checks each id against id_limit).
  int32_t max_token_id = -1;
  // Mapped files: Read refuses an id at or above this (LoadOptions::vocab_size); 0: no limit.
  int32_t id_limit = 0;
  // The vocabulary the stream was made with: 256 for byte-level text, the tokenizer's for text
  // read with one; 0 for a token file (unknown: only max_token_id says anything).
  int32_t vocab_size = 0;
  // Text read with a tokenizer and a cache folder: the cache file, and whether it was read
  // (true) or written now (false).
  std::string cache_path;
  bool from_cache = false;
  // For a text folder: the files that were read, in order, and the ones skipped with why.
  std::vector<std::string> files;
  std::vector<std::string> skipped;
  // One flag byte per token (kTokenTarget, kTokenDocStart, kTokenPad of
  // engine/data/instruction.h): `flags` in memory (instruction JSONL), or `mapped_flags` (the
  // `.mask` files beside token files that `meshrun tokenize --template` writes). Neither: every
  // token is a loss target.
  std::vector<uint8_t> flags;
  std::shared_ptr<const MappedFlags> mapped_flags;
  // > 0: the stream is laid out in windows of this model.seq_len (samples padded or packed).
  int window_seq_len = 0;

  bool has_flags() const { return mapped_flags != nullptr || !flags.empty(); }
  // Flags of tokens [begin, begin + count) into `out` (OUT_OF_RANGE outside the stream; all
  // kTokenTarget when the stream has none).
  Status ReadFlags(int64_t begin, int64_t count, uint8_t* out) const;

  int64_t size() const { return mapped ? mapped->size() : static_cast<int64_t>(tokens.size()); }
  // Tokens [begin, begin + count) as int32 ids into `out`: the window access of the sampler
  // and the evaluator. OUT_OF_RANGE outside the stream; for mapped files, INVALID_ARGUMENT
  // naming the shard and byte offset of an id at or above id_limit.
  Status Read(int64_t begin, int64_t count, int32_t* out) const;
};

// The largest id of `stream` (reads every token: for small streams and tests); Read's error
// for the first id at or above id_limit.
StatusOr<int32_t> MaxTokenId(const TokenStream& stream);

// How text is read (docs/data.md "Tokenizers").
struct LoadOptions {
  // data.tokenizer: a Hugging Face tokenizer folder; text is then tokenized with it (with its
  // end-of-text token between the files of a folder). Empty: byte-level tokens.
  std::string tokenizer;
  // Where tokenized text is cached (a file named by the hash of the texts and tokenizer.json);
  // empty: no cache.
  std::string cache_dir;
  int threads = 0;  // tokenizing threads over files; 0: the hardware's
  // Called now and then from the tokenizing threads with (bytes done, bytes in all).
  std::function<void(int64_t, int64_t)> progress;
  // model.vocab_size: the id_limit of mapped token files; 0: none.
  int32_t vocab_size = 0;
  // Instruction JSONL (engine/data/instruction.h): data.template, model.seq_len, and whether
  // samples are packed (data.attention: document) or one per window.
  std::string chat_template;
  int seq_len = 0;
  bool pack = false;
};

// Loads `path` as `format` ("auto", "text", "llmc" or "nanogpt").
//  - text: a UTF-8 file, or a folder whose text files are concatenated in file-name order;
//    byte-level tokens 0..255.
//  - llmc: llm.c's header (magic 20240520, version 1 or 2, token count) followed by uint16
//    (version 1) or uint32 (version 2) tokens.
//  - nanogpt: raw little-endian uint16 tokens.
//  - auto: the llm.c magic → llmc; else a `.bin` extension → nanogpt; else text.
// llmc and nanogpt may name one file, a folder (its `*.bin` files) or a glob in the last path
// component (`DIR/train_*.bin`); the shards, in file-name order, are one stream, mapped and
// never read whole (only headers and sizes at load). Under auto a folder whose files are all
// `*.bin` (and an optional manifest.json) is token shards, each resolved as above.
// Errors (INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS) name the path (the shard), what is wrong and
// a fix. An empty stream is an error.
StatusOr<TokenStream> LoadTokens(const std::string& path, const std::string& format,
                                 const LoadOptions& options = {});

// Tokenizes text inputs (files, or folders read as above) with `tokenizer`, in parallel over the
// files, the end-of-text token between consecutive files (INVALID_ARGUMENT naming the fix when
// there are several files and the tokenizer has none). `options.tokenizer` is ignored.
StatusOr<TokenStream> TokenizeTexts(const std::vector<std::string>& inputs,
                                    std::shared_ptr<const Tokenizer> tokenizer,
                                    const LoadOptions& options);

// Writes `tokens` as an llm.c token file, atomically: version 1 (uint16) for vocabularies of up
// to 65,535 ids, version 2 (uint32) for larger ones.
Status WriteLlmcTokens(const std::string& path, const std::vector<int32_t>& tokens,
                       int32_t vocab_size);

// The format `path` loads as under `format` ("auto" resolved as LoadTokens does): "text",
// "llmc" or "nanogpt" (for shards: the first shard's). Errors as LoadTokens'.
StatusOr<std::string> ResolveDataFormat(const std::string& path, const std::string& format);

// The files a token-file path names, in stream order: itself, a folder's `*.bin` files
// (hidden files skipped), or a glob's matches (wildcards `*`, `?`, `[...]` in the last
// component only), sorted by file name byte by byte. INVALID_ARGUMENT for an empty folder or
// glob, naming the path.
StatusOr<std::vector<std::string>> TokenShardFiles(const std::string& path);
// True when `path` is a glob (a wildcard in its last component) that is not itself a file.
bool IsDataGlob(const std::string& path);

// How a job reads its streams: data.tokenizer, and the cache under checkpoint.dir/token-cache
// (none without a checkpoint.dir).
LoadOptions LoadOptionsOf(const JobSpec& spec);
inline constexpr const char* kTokenCacheFolder = "token-cache";

// The model's vocabulary against the stream's (INVALID_ARGUMENT naming both sizes): byte-level
// text needs exactly model.vocab_size 256; text read with data.tokenizer at most
// model.vocab_size ids (a larger model is padded: its ids above the tokenizer's are never
// produced); every id of a token file must be below it. `field` names the stream ("data.train").
Status CheckStreamVocab(const TokenStream& stream, const JobSpec& spec, const std::string& field);
// The stream holds at least one window of model.seq_len + 1 tokens (INVALID_ARGUMENT naming
// `field`, the count and the window): what the trainer needs of data.train and data.val.
Status CheckStreamWindow(const TokenStream& stream, const JobSpec& spec, const std::string& field);
// The same for text before it is read: the vocabulary text read under `spec` has (256 or the
// tokenizer's, loaded from data.tokenizer).
// When the vocabulary is padded, `note` (if given) receives PaddedVocabNote's line.
Status CheckTextVocab(const JobSpec& spec, const std::string& field, std::string* note = nullptr);
// "model.vocab_size 2048 > the tokenizer's 2000 ids: ids 2000–2047 are padding, never
// produced", or "" when the model is not larger than the tokenizer.
std::string PaddedVocabNote(int32_t tokenizer_vocab, int32_t model_vocab);

// Pieces shared with text_tokens.cc: the files ListTextFolder would read (before the UTF-8
// check), the error for a folder with none, a whole file read confined, an llm.c file loaded.
Status ListTextFolderForTokens(const std::string& dir, std::vector<std::string>* files,
                               std::vector<std::string>* skipped);
Status EmptyTextFolderError(const std::string& dir, const std::vector<std::string>& skipped);
Status ReadTextFile(const std::string& path, std::string* bytes);
StatusOr<TokenStream> LoadLlmcFile(const std::string& path);

// True when `bytes` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF) with no NUL
// byte. On false, *bad_offset (when given) is the offset of the first offending byte.
bool IsUtf8Text(const std::string& bytes, size_t* bad_offset = nullptr);

}  // namespace meshrun
