// Sharded, reshardable checkpoints (docs/checkpoints.md). A checkpoint is a folder
// `DIR/step-NNNNNNNN/` with one safetensors shard per rank (`rank-RRRRR.safetensors`), each
// holding slices (hyper-rectangles) of float tensors, and a `metadata.json` written last by
// rank 0. Any hyper-rectangle of any tensor can be read back, whatever mesh wrote it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshrun {

inline constexpr const char* kCheckpointFormat = "meshrun-checkpoint-v1";
inline constexpr const char* kCheckpointMetadataFile = "metadata.json";

// "step-00000042" and "DIR/step-00000042".
std::string StepDirName(int64_t step);
std::string StepDir(const std::string& dir, int64_t step);
// "rank-00003.safetensors".
std::string ShardFileName(int rank);

// One slice to save: the hyper-rectangle [offset, offset + shape) of tensor `tensor`, whose full
// shape is `global_shape`. `data` holds the slice row-major (product(shape) floats). A replicated
// tensor is a slice with offset 0 and shape == global_shape.
struct SliceRef {
  std::string tensor;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// One stored slice, as recorded in a shard's header and in metadata.json.
struct SliceInfo {
  std::string tensor;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  std::string key;  // the tensor's name inside the shard file
};

struct ShardInfo {
  int rank = 0;
  std::string file;  // relative to the step folder
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  std::vector<SliceInfo> slices;
};

struct MeshSizes {
  int dp_replicate = 1;
  int dp_shard = 1;
  int cp = 1;
  int tp = 1;
};

struct CheckpointMetadata {
  std::string format = kCheckpointFormat;
  int64_t step = 0;
  int world_size = 1;
  MeshSizes mesh;
  std::string job_spec_yaml;        // the resolved job spec
  std::string trainer_json = "{}";  // free-form JSON object (data position, RNG state, ...)
  std::map<std::string, std::vector<int64_t>> tensors;  // global shape of every tensor
  std::vector<ShardInfo> shards;                        // ordered by rank
  // The run that wrote it (docs/checkpoints.md "Ownership"): a cluster job's id; "" for a
  // standalone run and for checkpoints written before owners were recorded ("owner" absent
  // from metadata.json). checkpoint.keep prunes only the writer's own folders.
  std::string owner;
};

// Writes `step_dir/rank-RRRRR.safetensors` atomically, creating step_dir if needed. Slice data
// is stored as F32 under a key naming tensor and offset; the shard's __metadata__ holds the
// slice table (so WriteMetadata can rebuild it from the files). `info` (optional) receives the
// shard's file name, size, CRC-32 and slices. INVALID_ARGUMENT for slices outside their tensor,
// mismatched ranks, or the same slice twice.
// `owner` goes into the shard's __metadata__ too, so that a save that never got its
// metadata.json still tells whose it is.
Status WriteShard(const std::string& step_dir, int rank, const std::vector<SliceRef>& slices,
                  ShardInfo* info = nullptr, const std::string& owner = "");

// Writes `step_dir/metadata.json` atomically; call it last, on one rank, after every shard is
// written. When `metadata.shards` is empty the shard table is built from the files
// rank-00000 … rank-(world_size − 1) in step_dir (size, CRC-32 and slice table of each), and
// `tensors` likewise when empty. Checks that every tensor is fully covered by the slices
// (FAILED_PRECONDITION otherwise), so a checkpoint that could not be loaded is never marked
// complete. trainer_json must be a JSON object.
Status WriteMetadata(const std::string& step_dir, const CheckpointMetadata& metadata);

// Parses `step_dir/metadata.json`.
StatusOr<CheckpointMetadata> ReadMetadata(const std::string& step_dir);
// Parses the text of a metadata.json (`path` names it in errors); what ReadMetadata does after
// reading the file. Corrupt input is DATA_LOSS (FAILED_PRECONDITION for another format), never
// a crash; used by the fuzz target.
StatusOr<CheckpointMetadata> ParseMetadata(std::string_view text, const std::string& path);

// Whether step_dir holds a complete checkpoint: metadata.json parses and every shard file
// exists with exactly the recorded size and (with verify_crc) CRC-32. OK when complete;
// otherwise FAILED_PRECONDITION (or NOT_FOUND without metadata) saying what is wrong.
Status CheckComplete(const std::string& step_dir, bool verify_crc = true);

struct LatestCheckpoint {
  std::string step_dir;
  int64_t step = 0;
  CheckpointMetadata metadata;
};

// The newest complete checkpoint under `dir` (folders step-N with N ≥ 0, newest first).
// Each newer incomplete one adds a warning naming it, why, and what is loaded instead, e.g.
// "checkpoint step-00000010 is incomplete: rank-00001.safetensors has 123 bytes, expected 4567;
// falling back to step-00000005". NOT_FOUND when there is none (warnings still filled).
StatusOr<LatestCheckpoint> FindLatestComplete(const std::string& dir,
                                              std::vector<std::string>* warnings);

// Deletes the oldest complete checkpoints beyond the newest `keep` (keep ≥ 1), and incomplete
// ones older than the newest complete one (left by crashed saves). Incomplete folders newer than
// the newest complete one are kept (a save may be in progress). Completeness here checks sizes,
// not CRCs, so pruning does not read every checkpoint. `deleted` (optional) lists what went.
// Only folders of `owner` (CheckpointOwner) are counted or deleted: a run never prunes another
// job's checkpoints in a shared folder; owner "" (a standalone run) prunes the unmarked ones.
Status PruneCheckpoints(const std::string& dir, int keep,
                        std::vector<std::string>* deleted = nullptr, const std::string& owner = "");

// Who wrote the checkpoint folder step_dir: metadata.json's owner, else (a save that did not
// finish) the owner its shard files carry; "" when unmarked or unknown.
std::string CheckpointOwner(const std::string& step_dir);

class SafetensorsFile;

// Reads any hyper-rectangle of any tensor of one checkpoint, assembling it from the stored
// slices of whatever shards hold it (so a different mesh can load it: resharding). Owns the
// open shard files. Immutable after Open; ReadSlice is thread-safe. Used by resume, eval and
// export.
class CheckpointReader {
 public:
  // Reads metadata.json and opens every shard's header. Does not verify CRCs (use
  // CheckComplete / FindLatestComplete for that).
  static StatusOr<CheckpointReader> Open(const std::string& step_dir);

  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;
  ~CheckpointReader();

  const CheckpointMetadata& metadata() const { return metadata_; }
  const std::string& step_dir() const { return step_dir_; }
  bool HasTensor(const std::string& tensor) const { return metadata_.tensors.count(tensor) > 0; }
  // NOT_FOUND for an unknown tensor.
  StatusOr<std::vector<int64_t>> GlobalShape(const std::string& tensor) const;

  // Writes the hyper-rectangle [offset, offset + shape) of `tensor` to `out` (row-major,
  // product(shape) floats). NOT_FOUND for an unknown tensor, OUT_OF_RANGE outside the tensor,
  // DATA_LOSS when the stored slices do not cover the whole request.
  Status ReadSlice(const std::string& tensor, const std::vector<int64_t>& offset,
                   const std::vector<int64_t>& shape, float* out) const;
  // The whole tensor.
  Status ReadTensor(const std::string& tensor, float* out) const;

 private:
  struct StoredSlice {
    size_t file = 0;  // index into files_
    SliceInfo info;
  };
  CheckpointReader() = default;

  std::string step_dir_;
  CheckpointMetadata metadata_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;     // by shard index
  std::map<std::string, std::vector<StoredSlice>> slices_;  // tensor → its stored slices
};

}  // namespace meshrun
