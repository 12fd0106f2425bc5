// Byte-level BPE from a Hugging Face `tokenizer.json` (docs/data.md "Tokenizers"): the ids that
// the `tokenizers` library computes for GPT-2- and Llama-3-style tokenizers: added and special
// tokens split out first, then the pre-tokenizer (ByteLevel and Split regexes, run by PCRE2 with
// Unicode classes), then merges by rank on each pre-token, with a cache of pre-token → ids.
// SentencePiece-style BPE (Llama 2, Mistral, Gemma: byte fallback, ▁ for spaces) is read too
// (sentencepiece_bpe.cc).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace meshrun {

// The files of a tokenizer folder: `tokenizer.json` is required; `meshrun export` copies the
// others beside the model when they exist.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                                  "special_tokens_map.json"};

class TokenizerEncoder;

// A loaded tokenizer. Immutable after Load: Encode/Decode may run from many threads at once, each
// with its own TokenizerEncoder (which holds the cache and the regex match state).
class Tokenizer {
 public:
  // Reads DIR/tokenizer.json (and DIR/tokenizer_config.json for `eos_token`, when present)
  // through confined opens. Errors (INVALID_ARGUMENT) name the file, what is unsupported or
  // malformed, and a fix.
  static StatusOr<std::shared_ptr<const Tokenizer>> Load(const std::string& dir);
  // The same from the files' text; `origin` names them in errors.
  static StatusOr<std::shared_ptr<const Tokenizer>> FromJson(const std::string& tokenizer_json,
                                                             const std::string& config_json,
                                                             const std::string& origin);

  // Largest id (BPE vocabulary and added tokens) + 1: model.vocab_size is at least this (more
  // is padding).
  int32_t vocab_size() const { return vocab_size_; }
  // The token put between the files of a folder (docs/data.md), or -1 when the tokenizer has
  // none: `eos_token` of tokenizer_config.json, else the first added token among
  // <|endoftext|>, <|end_of_text|>, </s>, <eos>.
  int32_t end_of_text_id() const { return end_of_text_id_; }
  // A 64-bit digest of tokenizer.json's bytes (part of the token cache's key).
  uint64_t digest() const { return digest_; }

  // Ids of `text` (UTF-8; INVALID_ARGUMENT otherwise), as `tokenizers`' encode(text,
  // add_special_tokens=False). Convenience for short strings; bulk work uses a TokenizerEncoder.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // The bytes of `ids` joined (ByteLevel decoding; added tokens as their content; SentencePiece
  // style: ▁ as a space, <0xNN> runs as bytes, the decoder's leading space stripped). Ids out of
  // range decode to nothing.
  std::string Decode(const std::vector<int32_t>& ids) const;
  std::string DecodeOne(int32_t id) const;

  // The first position p >= `from` at which `text` may be cut, encoding text[0, p) and
  // text[p, ...) apart giving exactly the ids of the whole (`meshrun tokenize` cuts large texts
  // there to encode the pieces in parallel), or npos when there is none. A cut is only made
  // after a lone '\n' between two printable ASCII characters (the second not the first byte of
  // an added token), and only for pre-tokenizers whose patterns never put a newline and the
  // character after it into one piece nor look past such a newline: GPT-2's, Llama 3's and
  // Qwen 2's, without add_prefix_space, and no added token holding a newline. Any other
  // tokenizer has no cut (npos): its texts are encoded whole.
  size_t SafeCut(std::string_view text, size_t from) const;

  ~Tokenizer();

 private:
  friend class TokenizerEncoder;
  struct Regex;
  struct PreStep {
    enum Kind { kSplit, kByteLevel } kind;
    std::shared_ptr<Regex> regex;   // kSplit, or kByteLevel with use_regex
    bool remove_matches = false;    // Split behavior "Removed"
    bool add_prefix_space = false;  // kByteLevel
  };
  struct AddedToken {
    std::string content;  // SentencePiece style with normalized: the content normalized
    int32_t id;
    bool lstrip, rstrip;
    bool normalized = false;  // matched in the normalized text (SentencePiece style only)
  };
  // A normalizer step of SentencePiece-style files: Prepend(`prepend`) when `prepend` is set
  // (to a non-empty piece), else Replace(String `from` → `to`).
  struct NormStep {
    std::string prepend, from, to;
  };
  struct Merge {
    int32_t rank;
    int32_t id;
  };

  Tokenizer() = default;

  std::vector<PreStep> steps_;
  std::vector<AddedToken> added_;  // longest first
  bool added_first_byte_[256] = {};
  int32_t byte_id_[256];                        // id of each single byte, -1 when missing
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) → rank, result
  std::unordered_map<std::string, int32_t> word_ids_;  // byte string → id (ignore_merges)
  std::vector<std::string> id_bytes_;                  // id → its bytes
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  int32_t vocab_size_ = 0;
  int32_t end_of_text_id_ = -1;
  uint64_t digest_ = 0;

  // SentencePiece-style BPE (engine/data/sentencepiece_bpe.cc; docs/data.md): vocabulary keys
  // are text (word_ids_), each character is looked up whole, then its UTF-8 bytes as <0xNN>
  // tokens (byte_fallback), then unk (consecutive ones fused with fuse_unk).
  bool spm_ = false;
  std::vector<NormStep> normalizer_;
  std::vector<AddedToken> normalized_added_;  // normalized: true, longest first
  bool metaspace_ = false;                    // the Metaspace pre-tokenizer
  std::string meta_replacement_;
  enum { kPrependNever, kPrependFirst, kPrependAlways } meta_prepend_ = kPrependAlways;
  bool meta_split_ = true;
  bool byte_fallback_ = false, fuse_unk_ = false;
  int32_t fallback_id_[256];            // id of <0xNN>, -1 when missing
  std::vector<int16_t> fallback_byte_;  // id → its byte when a <0xNN> token, else -1
  bool decode_strip_space_ = false;     // the decoder strips one leading space
  bool norm_first_byte_[256] = {};      // first bytes of normalized_added_
  std::string SpmDecode(const std::vector<int32_t>& ids) const;
  // Reads the SentencePiece-style parts of `j` (normalizer, Metaspace, byte fallback, decoder)
  // into `t`; `bad` errors as FromJson's.
  static Status SpmParse(const nlohmann::json& j, const std::string& origin, Tokenizer* t);
};

// One thread's encoder: the pre-token cache and the regex match data. Not thread-safe; make one
// per thread. Keeps a pointer to the tokenizer, which must outlive it.
class TokenizerEncoder {
 public:
  explicit TokenizerEncoder(const Tokenizer* tokenizer);
  ~TokenizerEncoder();
  TokenizerEncoder(const TokenizerEncoder&) = delete;
  TokenizerEncoder& operator=(const TokenizerEncoder&) = delete;

  // Appends the ids of `text` to `out`. INVALID_ARGUMENT when `text` is not UTF-8, or when a
  // pre-tokenizer pattern exceeds PCRE2's match or depth limit at one start position (20,000
  // steps plus 4 per byte left in the piece; docs/data.md): "data.tokenizer: the pre-tokenizer
  // pattern '…' exceeded the match limit …".
  Status Encode(std::string_view text, std::vector<int32_t>* out);

 private:
  struct MatchData;
  Status EncodeSegment(std::string_view segment, std::vector<int32_t>* out);
  Status PreTokenize(std::string_view segment);
  void EncodeWord(std::string_view word, std::vector<int32_t>* out);
  void MergeWord(std::string_view word, std::vector<int32_t>* out);
  void RunMerges(std::vector<int32_t>* out);  // merges sym_id_ by rank, appends the result
  // SentencePiece style (sentencepiece_bpe.cc).
  Status SpmEncode(std::string_view text, std::vector<int32_t>* out);
  void SpmSegment(std::string_view segment, bool at_start, std::vector<int32_t>* out);
  void SpmPiece(std::string_view piece, bool at_start, std::vector<int32_t>* out);
  void SpmWord(std::string_view word, std::vector<int32_t>* out);

  const Tokenizer* tok_;
  std::vector<std::unique_ptr<MatchData>> match_;                         // one per regex step
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache_;  // word → ids span
  std::vector<int32_t> cache_ids_;
  std::vector<std::string_view> pieces_, next_pieces_;
  std::deque<std::string> owned_;  // pieces made by add_prefix_space (stable addresses)
  // MergeWord's scratch.
  std::vector<int32_t> sym_id_, sym_prev_, sym_next_;
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Candidate> heap_;
  std::string spm_key_, spm_norm_, spm_piece_;  // SentencePiece style's scratch
};

}  // namespace meshrun
