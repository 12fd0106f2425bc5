// Token files mapped read-only, never loaded whole (docs/data.md "Shards and memory"): one file,
// or shards read in file-name order as one concatenated stream. Opening reads only each shard's
// header and size; ids are converted from uint16/uint32 to int32 only for the tokens read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshrun {

// One mapped shard: tokens [first, first + count) of the stream.
struct TokenShard {
  std::string path;
  std::string format;        // "llmc" or "nanogpt"
  int width = 2;             // bytes per token: 2 (uint16) or 4 (uint32)
  uint64_t data_offset = 0;  // byte offset of the first token (1024 for llm.c, 0 for nanoGPT)
  int64_t count = 0;
  int64_t first = 0;
  const unsigned char* base = nullptr;  // the mapping of the whole file
  uint64_t map_bytes = 0;
};

// Shards mapped with PROT_READ, MAP_SHARED (the page cache is shared by every rank on a node),
// each opened through OpenConfined (the confined-path check holds per shard) and its descriptor
// closed once mapped. Immutable; safe to read from several threads.
class MappedTokens {
 public:
  // Maps `files` in the order given; `formats[i]` is "llmc" or "nanogpt". Errors name the shard,
  // the byte offset and a fix: a bad magic or version, a header token count that disagrees with
  // the size, a size that is not header + whole tokens, an empty shard.
  static StatusOr<std::shared_ptr<const MappedTokens>> Open(
      const std::vector<std::string>& files, const std::vector<std::string>& formats);
  ~MappedTokens();
  MappedTokens(const MappedTokens&) = delete;
  MappedTokens& operator=(const MappedTokens&) = delete;

  int64_t size() const { return size_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  // The largest id any shard's width can hold (65535 when every shard is uint16).
  int64_t width_max_id() const { return width_max_id_; }

  // Tokens [begin, begin + count) as int32 into `out` (OUT_OF_RANGE outside the stream). An id
  // over INT32_MAX, or at or above `id_limit` when id_limit > 0, is INVALID_ARGUMENT naming the
  // shard, the token's byte offset in it, and model.vocab_size.
  Status Read(int64_t begin, int64_t count, int32_t* out, int32_t id_limit = 0) const;

 private:
  MappedTokens() = default;
  std::vector<TokenShard> shards_;
  int64_t size_ = 0;
  int64_t width_max_id_ = 0;
};

// The `.mask` files beside token shards (docs/data.md "Masks"): a 16-byte header (magic
// "MRMASK01", uint32 version 1, uint32 window seq_len or 0), then one flag byte per token of the
// shard. Mapped read-only like the ids; immutable, safe to read from several threads.
inline constexpr char kMaskMagic[8] = {'M', 'R', 'M', 'A', 'S', 'K', '0', '1'};
inline constexpr int kMaskHeaderBytes = 16;
class MappedFlags {
 public:
  // Maps `files[i]`, which must hold `counts[i]` flags (its shard's token count). Errors name
  // the file, the offset and a fix. All files must name the same seq_len.
  static StatusOr<std::shared_ptr<const MappedFlags>> Open(const std::vector<std::string>& files,
                                                           const std::vector<int64_t>& counts);
  ~MappedFlags();
  MappedFlags(const MappedFlags&) = delete;
  MappedFlags& operator=(const MappedFlags&) = delete;

  int64_t size() const { return size_; }
  int seq_len() const { return seq_len_; }
  Status Read(int64_t begin, int64_t count, uint8_t* out) const;

 private:
  MappedFlags() = default;
  struct Part {
    std::string path;
    const unsigned char* base = nullptr;
    uint64_t map_bytes = 0;
    int64_t first = 0, count = 0;
  };
  std::vector<Part> parts_;
  int64_t size_ = 0;
  int seq_len_ = 0;
};
// The mask file of a token file: X.bin → X.mask.
std::string MaskPathOf(const std::string& token_path);

// Parses a shard's first bytes and size as `format` (no mapping): the width, data offset and
// token count, or the error Open would give. `head` holds min(size, 1024) bytes of the file.
Status ParseTokenShard(const std::string& path, const std::string& format, uint64_t size,
                       const unsigned char* head, TokenShard* out);

}  // namespace meshrun
