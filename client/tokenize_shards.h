// The shards of `meshrun tokenize --shard-tokens` (docs/data.md "Making token files"): the writer
// that cuts the ids into llm.c files, and the -o folder's manifest.json, which lists the complete
// shards with where each ends in the input, so that an interrupted run resumes after the last.
// The command's reader and encoders are in client/tokenize_command.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshrun {
class DirLock;
}  // namespace meshrun

namespace meshrun::client {

// manifest.json's "format".
inline constexpr char kShardManifestFormat[] = "meshrun-tokens";

// A place in the inputs: a chunk's first byte (a resumed run starts at the chunk that holds the
// end of its last complete shard).
struct InputPosition {
  int file = 0;
  int64_t offset = 0;
  int64_t line = 1;  // JSONL: the line number of `offset`
};

// Where a shard ends in the input: the chunk that holds its last token, and how many tokens of
// that chunk's output (the end-of-text token before it included) are in this or earlier shards.
struct ShardEnd {
  InputPosition chunk;
  int64_t skip = 0;
  bool emitted_before = false;  // whether a document was written before that chunk
};

struct ShardRecord {
  std::string file;
  int64_t tokens = 0;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  ShardEnd end;
};

// Writes the ids in order into llm.c files of at most `max_tokens` ids each: `.NAME.partial`
// while written, renamed to NAME when full (or at the end), then `on_shard` (the manifest).
// Not thread-safe: the command's writing thread owns it.
class ShardWriter {
 public:
  ShardWriter(int32_t vocab_size, int64_t max_tokens, std::function<std::string(int)> name,
              std::function<Status(const ShardRecord&)> on_shard, int first_index);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  int64_t written() const { return total_; }
  int shards() const { return index_; }
  bool open() const { return fd_ >= 0; }

  // Appends ids[0, n), cutting shards as they fill; `chunk_start` says where the current chunk
  // starts and `chunk_done` how many of its output tokens were written before ids[0].
  Status Write(const int32_t* ids, int64_t n, const ShardEnd& chunk_start, int64_t chunk_done);

  // The last, partly filled shard (if any).
  Status Finish(const ShardEnd& end);

 private:
  Status Open();
  Status Flush();
  Status Close(const ShardEnd& end);

  const bool wide_;
  const int64_t max_;
  std::function<std::string(int)> name_;
  std::function<Status(const ShardRecord&)> on_shard_;
  int index_;
  int fd_ = -1;
  std::string temp_, final_;
  std::string buf_;
  int64_t count_ = 0, total_ = 0;
};

// The -o folder of a sharded run, held (DirLock) for as long as this lives: its manifest.json
// (the run's fixed `head`, the complete shards, and whether the run is complete) and what a run
// takes over from an interrupted one. Not thread-safe: the command's writing thread owns it.
class ShardFolder {
 public:
  // Creates and locks `dir`, removes an interrupted run's leftovers (.PREFIX_*.partial shards,
  // manifest temporaries) and reads its manifest: the listed shards whose size and CRC-32 still
  // match are kept, up to the first that does not. Then writes the manifest (incomplete) unless
  // the run it found had completed. INVALID_ARGUMENT for a folder that cannot be created, is in
  // use by another run, holds another run's manifest (a different `head`), a file that is not a
  // manifest, or other files and no manifest.
  static StatusOr<std::unique_ptr<ShardFolder>> Open(const std::string& dir,
                                                     const std::string& prefix,
                                                     nlohmann::json head);
  ~ShardFolder();

  const std::string& manifest_path() const { return manifest_path_; }
  const std::vector<ShardRecord>& shards() const { return shards_; }
  // The run found had completed and its shards are intact: nothing to write.
  bool complete() const { return complete_; }
  // Tokens in the shards taken over, and where the last of them ends (nothing: the start).
  int64_t done_tokens() const { return done_tokens_; }
  const ShardEnd& resume() const { return resume_; }

  // A shard is complete: listed, and the manifest rewritten (incomplete).
  Status Add(const ShardRecord& shard);
  Status WriteManifest(bool complete);

 private:
  ShardFolder(std::string dir, nlohmann::json head);

  std::string dir_, manifest_path_;
  nlohmann::json head_;
  std::unique_ptr<DirLock> lock_;
  std::vector<ShardRecord> shards_;
  bool complete_ = false;
  int64_t done_tokens_ = 0;
  ShardEnd resume_;
};

}  // namespace meshrun::client
