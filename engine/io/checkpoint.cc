// Checkpoint shards, metadata, completeness checks, pruning, and the resharding reader.
#include "engine/io/checkpoint.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "common/atomic_file.h"
#include "common/confined_file.h"
#include "common/crc32.h"
#include "engine/io/safetensors.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Keys of a shard file's __metadata__.
constexpr const char* kShardFormatKey = "meshrun.format";
constexpr const char* kShardRankKey = "meshrun.rank";
constexpr const char* kShardSlicesKey = "meshrun.slices";
constexpr const char* kShardOwnerKey = "meshrun.owner";

// Step folders are "step-" followed by the zero-padded step number.
constexpr const char* kStepPrefix = "step-";

std::string ShapeString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    s += i ? ", " : "";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SliceKey(const std::string& tensor, const std::vector<int64_t>& offset) {
  std::string key = tensor + "@";
  for (size_t i = 0; i < offset.size(); ++i) {
    key += i ? "," : "";
    key += std::to_string(offset[i]);
  }
  return key;
}

// A hyper-rectangle [lo, hi).
struct Box {
  std::vector<int64_t> lo, hi;
};

// Whether the union of `boxes` covers `region` (all boxes already clipped to it). On false,
// *missing is a corner of an uncovered part. Exact for overlapping boxes: the region is cut
// into the grid of cells formed by every box edge, and each cell is either inside a box or not.
bool Covers(const std::vector<Box>& boxes, const Box& region, std::vector<int64_t>* missing) {
  const size_t dims = region.lo.size();
  for (size_t d = 0; d < dims; ++d) {
    if (region.lo[d] >= region.hi[d]) return true;  // empty region
  }
  std::vector<std::vector<int64_t>> cuts(dims);
  for (size_t d = 0; d < dims; ++d) {
    cuts[d] = {region.lo[d], region.hi[d]};
    for (const Box& b : boxes) {
      cuts[d].push_back(b.lo[d]);
      cuts[d].push_back(b.hi[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  size_t cells = 1;
  std::vector<size_t> stride(dims, 1);
  for (size_t d = dims; d-- > 0;) {
    stride[d] = cells;
    cells *= cuts[d].size() - 1;
  }
  std::vector<char> covered(cells, 0);
  for (const Box& b : boxes) {
    std::vector<size_t> first(dims), last(dims);  // cell index range [first, last) per dim
    bool empty = false;
    for (size_t d = 0; d < dims; ++d) {
      first[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), b.lo[d]) - cuts[d].begin();
      last[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), b.hi[d]) - cuts[d].begin();
      if (first[d] >= last[d]) empty = true;
    }
    if (empty) continue;
    std::vector<size_t> idx = first;
    for (;;) {
      size_t cell = 0;
      for (size_t d = 0; d < dims; ++d) cell += idx[d] * stride[d];
      covered[cell] = 1;
      size_t d = dims;
      while (d-- > 0) {
        if (++idx[d] < last[d]) break;
        idx[d] = first[d];
      }
      if (d == static_cast<size_t>(-1)) break;
    }
  }
  for (size_t cell = 0; cell < cells; ++cell) {
    if (covered[cell]) continue;
    if (missing) {
      missing->assign(dims, 0);
      for (size_t d = 0; d < dims; ++d)
        (*missing)[d] = cuts[d][(cell / stride[d]) % (cuts[d].size() - 1)];
    }
    return false;
  }
  return true;
}

// Clips slice [offset, offset + shape) to `region`; false when they do not intersect.
bool Intersect(const std::vector<int64_t>& offset, const std::vector<int64_t>& shape,
               const Box& region, Box* out) {
  const size_t dims = offset.size();
  out->lo.resize(dims);
  out->hi.resize(dims);
  for (size_t d = 0; d < dims; ++d) {
    out->lo[d] = std::max(offset[d], region.lo[d]);
    out->hi[d] = std::min(offset[d] + shape[d], region.hi[d]);
    if (out->lo[d] >= out->hi[d]) return false;
  }
  return true;
}

Status CheckSliceBounds(const std::string& where, const std::vector<int64_t>& global_shape,
                        const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  if (offset.size() != global_shape.size() || shape.size() != global_shape.size()) {
    return InvalidArgumentError(where + ": offset " + ShapeString(offset) + " and shape " +
                                ShapeString(shape) + " do not match the tensor's " +
                                std::to_string(global_shape.size()) + " dims " +
                                ShapeString(global_shape));
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    // offset > global - shape, not offset + shape > global: a corrupt metadata.json can hold
    // offsets near INT64_MAX, and the sum would overflow
    // (fuzz/corpus/checkpoint_metadata/regress-*).
    if (offset[d] < 0 || shape[d] < 0 || global_shape[d] < 0 ||
        offset[d] > global_shape[d] - shape[d]) {
      return OutOfRangeError(where + ": slice at " + ShapeString(offset) + " of shape " +
                             ShapeString(shape) + " is outside the tensor's shape " +
                             ShapeString(global_shape));
    }
  }
  return OkStatus();
}

// Thrown by IntOf for a number that is not an integer of the wanted type.
struct BadInteger : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An integer of metadata (or a shard's slice table), range-checked. nlohmann's get<int>() of a
// float or of an integer out of int's range converts anyway (undefined behaviour for a float
// beyond the range, found by fuzz/checkpoint_metadata); here that is an error.
template <typename T>
T IntOf(const json& j) {
  if (j.is_number_unsigned()) {
    if (const auto v = j.get<uint64_t>(); std::in_range<T>(v)) return static_cast<T>(v);
  } else if (j.is_number_integer()) {
    if (const auto v = j.get<int64_t>(); std::in_range<T>(v)) return static_cast<T>(v);
  }
  throw BadInteger(j.dump() + " is not an integer in range");
}

std::vector<int64_t> ToInts(const json& j) {
  if (!j.is_array()) throw BadInteger(j.dump() + " is not an array of integers");
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (const json& v : j) out.push_back(IntOf<int64_t>(v));
  return out;
}

json SliceToJson(const SliceInfo& s) {
  return json{{"tensor", s.tensor}, {"key", s.key}, {"offset", s.offset}, {"shape", s.shape}};
}

SliceInfo SliceFromJson(const json& j) {
  SliceInfo s;
  s.tensor = j.at("tensor").get<std::string>();
  s.key = j.at("key").get<std::string>();
  s.offset = ToInts(j.at("offset"));
  s.shape = ToInts(j.at("shape"));
  return s;
}

// Reads a shard's slice table and the global shapes it records.
Status ScanShard(const std::string& step_dir, int rank, ShardInfo* shard,
                 std::map<std::string, std::vector<int64_t>>* shapes) {
  shard->rank = rank;
  shard->file = ShardFileName(rank);
  const std::string path = (fs::path(step_dir) / shard->file).string();
  auto digest = DigestFile(path);
  if (!digest.ok()) {
    return FailedPreconditionError(path +
                                   " is missing (hint: every rank writes its shard "
                                   "before rank 0 writes the metadata)");
  }
  shard->bytes = digest->bytes;
  shard->crc32 = digest->crc32;
  MESHRUN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  const auto it = file.metadata().find(kShardSlicesKey);
  if (it == file.metadata().end()) {
    return DataLossError(path + ": no slice table (" + kShardSlicesKey +
                         ") in the shard's metadata; not written by WriteShard");
  }
  try {
    const json table = json::parse(it->second);
    for (const json& j : table) {
      shard->slices.push_back(SliceFromJson(j));
      auto shape = ToInts(j.at("global_shape"));
      auto [pos, inserted] = shapes->emplace(shard->slices.back().tensor, shape);
      if (!inserted && pos->second != shape) {
        return FailedPreconditionError(path + ": tensor '" + pos->first + "' has global shape " +
                                       ShapeString(shape) + " here but " +
                                       ShapeString(pos->second) + " in another shard");
      }
    }
  } catch (const json::exception& e) {
    return DataLossError(path + ": the slice table is malformed: " + e.what());
  } catch (const BadInteger& e) {
    return DataLossError(path + ": the slice table is malformed: " + e.what());
  }
  return OkStatus();
}

// metadata.json, keys in reading order (format and step first, the long shard table last).
nlohmann::ordered_json MetadataToJson(const CheckpointMetadata& m,
                                      const nlohmann::ordered_json& trainer) {
  using ojson = nlohmann::ordered_json;
  ojson tensors = ojson::object();
  for (const auto& [name, shape] : m.tensors) tensors[name] = {{"shape", shape}};
  ojson shards = ojson::array();
  for (const ShardInfo& s : m.shards) {
    ojson slices = ojson::array();
    for (const SliceInfo& slice : s.slices) {
      slices.push_back({{"tensor", slice.tensor},
                        {"offset", slice.offset},
                        {"shape", slice.shape},
                        {"key", slice.key}});
    }
    shards.push_back({{"rank", s.rank},
                      {"file", s.file},
                      {"bytes", s.bytes},
                      {"crc32", s.crc32},
                      {"slices", std::move(slices)}});
  }
  ojson out{{"format", m.format},
            {"step", m.step},
            {"world_size", m.world_size},
            {"mesh",
             {{"dp_replicate", m.mesh.dp_replicate},
              {"dp_shard", m.mesh.dp_shard},
              {"cp", m.mesh.cp},
              {"tp", m.mesh.tp}}},
            {"job_spec", m.job_spec_yaml},
            {"trainer", trainer},
            {"tensors", std::move(tensors)},
            {"shards", std::move(shards)}};
  if (!m.owner.empty()) out["owner"] = m.owner;
  return out;
}

// The checkpoint steps under `dir`, newest first, as (step, folder path).
StatusOr<std::vector<std::pair<int64_t, std::string>>> ListSteps(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return NotFoundError("no checkpoint folder " + dir);
  }
  std::vector<std::pair<int64_t, std::string>> steps;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kStepPrefix, 0) != 0 || name.size() == 5 || name.size() > 5 + 18) continue;
    const std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    if (!it->is_directory(ec)) continue;
    steps.emplace_back(std::stoll(digits), it->path().string());
  }
  if (ec) return InternalError("cannot list " + dir + ": " + ec.message());
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  return steps;
}

// The reason a checkpoint is incomplete, or OK; fills *metadata when it parses.
Status Completeness(const std::string& step_dir, bool verify_crc, CheckpointMetadata* metadata) {
  auto m = ReadMetadata(step_dir);
  if (!m.ok()) {
    if (m.status().code() == StatusCode::kNotFound) {
      return NotFoundError("it has no metadata.json (the save did not finish)");
    }
    return FailedPreconditionError(m.status().message());
  }
  for (const ShardInfo& s : m->shards) {
    const std::string path = (fs::path(step_dir) / s.file).string();
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return FailedPreconditionError(s.file + " is missing");
    if (size != s.bytes) {
      return FailedPreconditionError(s.file + " has " + std::to_string(size) + " bytes, expected " +
                                     std::to_string(s.bytes));
    }
    if (verify_crc) {
      auto digest = DigestFile(path);
      if (!digest.ok()) return FailedPreconditionError(digest.status().message());
      if (digest->crc32 != s.crc32) {
        return FailedPreconditionError(s.file + " has CRC-32 " + Hex32(digest->crc32) +
                                       ", expected " + Hex32(s.crc32));
      }
    }
  }
  if (metadata) *metadata = std::move(m).value();
  return OkStatus();
}

Status CheckTensorCoverage(const CheckpointMetadata& m) {
  std::map<std::string, std::vector<Box>> boxes;
  for (const ShardInfo& s : m.shards) {
    for (const SliceInfo& slice : s.slices) {
      const auto shape = m.tensors.find(slice.tensor);
      if (shape == m.tensors.end()) {
        return InvalidArgumentError(s.file + " holds a slice of '" + slice.tensor +
                                    "', which is not among the checkpoint's tensors");
      }
      MESHRUN_RETURN_IF_ERROR(CheckSliceBounds(s.file + ": tensor '" + slice.tensor + "'",
                                               shape->second, slice.offset, slice.shape));
      Box b{slice.offset, slice.offset};
      for (size_t d = 0; d < b.hi.size(); ++d) b.hi[d] += slice.shape[d];
      boxes[slice.tensor].push_back(std::move(b));
    }
  }
  for (const auto& [name, shape] : m.tensors) {
    Box whole{std::vector<int64_t>(shape.size(), 0), shape};
    std::vector<int64_t> missing;
    if (!Covers(boxes[name], whole, &missing)) {
      return FailedPreconditionError("tensor '" + name + "' of shape " + ShapeString(shape) +
                                     " is not fully saved: element " + ShapeString(missing) +
                                     " is in no shard's slice");
    }
  }
  return OkStatus();
}

}  // namespace

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return buf;
}

std::string StepDir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / StepDirName(step)).string();
}

std::string ShardFileName(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

// ---- writing ----------------------------------------------------------------------------

Status WriteShard(const std::string& step_dir, int rank, const std::vector<SliceRef>& slices,
                  ShardInfo* info, const std::string& owner) {
  if (rank < 0) return InvalidArgumentError("WriteShard: negative rank " + std::to_string(rank));
  MESHRUN_RETURN_IF_ERROR(CreateDirectoriesConfined(step_dir));

  ShardInfo shard;
  shard.rank = rank;
  shard.file = ShardFileName(rank);
  std::vector<TensorToWrite> tensors;
  json table = json::array();
  std::set<std::string> keys;
  for (const SliceRef& s : slices) {
    const std::string where = shard.file + ": tensor '" + s.tensor + "'";
    if (s.tensor.empty()) return InvalidArgumentError(shard.file + ": a slice has no tensor name");
    MESHRUN_RETURN_IF_ERROR(CheckSliceBounds(where, s.global_shape, s.offset, s.shape));
    if (Product(s.shape) > 0 && s.data == nullptr) {
      return InvalidArgumentError(where + ": slice has no data");
    }
    SliceInfo slice{s.tensor, s.offset, s.shape, SliceKey(s.tensor, s.offset)};
    if (!keys.insert(slice.key).second) {
      return InvalidArgumentError(where + ": the slice at " + ShapeString(s.offset) +
                                  " is given twice");
    }
    tensors.push_back({slice.key, DType::kF32, s.shape, s.data});
    json j = SliceToJson(slice);
    j["global_shape"] = s.global_shape;
    table.push_back(std::move(j));
    shard.slices.push_back(std::move(slice));
  }
  std::map<std::string, std::string> meta = {{kShardFormatKey, kCheckpointFormat},
                                             {kShardRankKey, std::to_string(rank)},
                                             {kShardSlicesKey, table.dump()}};
  if (!owner.empty()) meta[kShardOwnerKey] = owner;
  const std::string path = (fs::path(step_dir) / shard.file).string();
  MESHRUN_RETURN_IF_ERROR(WriteSafetensors(path, tensors, meta, &shard.bytes, &shard.crc32));
  if (info) *info = std::move(shard);
  return OkStatus();
}

Status WriteMetadata(const std::string& step_dir, const CheckpointMetadata& metadata) {
  CheckpointMetadata m = metadata;
  const std::string path = (fs::path(step_dir) / kCheckpointMetadataFile).string();
  if (m.world_size < 1) {
    return InvalidArgumentError(path + ": world_size " + std::to_string(m.world_size) + " < 1");
  }
  const std::string dir_name = fs::path(step_dir).filename().string();
  if (dir_name.rfind(kStepPrefix, 0) == 0 && dir_name != StepDirName(m.step)) {
    return InvalidArgumentError(path + ": metadata step " + std::to_string(m.step) +
                                " does not match the folder name (hint: write into StepDir(dir, " +
                                std::to_string(m.step) + "))");
  }
  const auto trainer = nlohmann::ordered_json::parse(m.trainer_json.empty() ? "{}" : m.trainer_json,
                                                     nullptr, /*allow_exceptions=*/false);
  if (trainer.is_discarded() || !trainer.is_object()) {
    return InvalidArgumentError(path + ": trainer_json is not a JSON object: " + m.trainer_json);
  }
  if (m.shards.empty() || m.tensors.empty()) {
    std::vector<ShardInfo> shards(static_cast<size_t>(m.world_size));
    std::map<std::string, std::vector<int64_t>> shapes;
    for (int r = 0; r < m.world_size; ++r) {
      MESHRUN_RETURN_IF_ERROR(ScanShard(step_dir, r, &shards[r], &shapes));
    }
    if (m.shards.empty()) m.shards = std::move(shards);
    if (m.tensors.empty()) m.tensors = std::move(shapes);
  }
  MESHRUN_RETURN_IF_ERROR(CheckTensorCoverage(m));
  return WriteFileAtomic(path, MetadataToJson(m, trainer).dump(2) + "\n");
}

// ---- reading ----------------------------------------------------------------------------

StatusOr<CheckpointMetadata> ReadMetadata(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kCheckpointMetadataFile).string();
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path));
  std::ifstream in(name.name(), std::ios::binary);
  if (!in) return NotFoundError(path + ": no such file");
  std::stringstream text;
  text << in.rdbuf();
  return ParseMetadata(text.str(), path);
}

StatusOr<CheckpointMetadata> ParseMetadata(std::string_view text, const std::string& path) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(path + ": not valid JSON (the file is corrupt)");
  }
  CheckpointMetadata m;
  try {
    m.format = j.at("format").get<std::string>();
    if (m.format != kCheckpointFormat) {
      return FailedPreconditionError(path + ": format '" + m.format + "' is not " +
                                     kCheckpointFormat + " (hint: it was written by a different " +
                                     "meshrun version)");
    }
    m.step = IntOf<int64_t>(j.at("step"));
    m.world_size = IntOf<int>(j.at("world_size"));
    const json& mesh = j.at("mesh");
    m.mesh.dp_replicate = IntOf<int>(mesh.at("dp_replicate"));
    m.mesh.dp_shard = IntOf<int>(mesh.at("dp_shard"));
    m.mesh.cp = IntOf<int>(mesh.at("cp"));
    m.mesh.tp = IntOf<int>(mesh.at("tp"));
    m.job_spec_yaml = j.at("job_spec").get<std::string>();
    if (const auto owner = j.find("owner"); owner != j.end()) m.owner = owner->get<std::string>();
    const json& trainer = j.at("trainer");
    if (!trainer.is_object()) return DataLossError(path + ": 'trainer' is not an object");
    m.trainer_json = trainer.dump();
    for (const auto& [name, t] : j.at("tensors").items()) m.tensors[name] = ToInts(t.at("shape"));
    for (const json& s : j.at("shards")) {
      ShardInfo shard;
      shard.rank = IntOf<int>(s.at("rank"));
      shard.file = s.at("file").get<std::string>();
      shard.bytes = IntOf<uint64_t>(s.at("bytes"));
      shard.crc32 = IntOf<uint32_t>(s.at("crc32"));
      if (shard.file.empty() || shard.file.find('/') != std::string::npos) {
        return DataLossError(path + ": shard file name '" + shard.file + "' is invalid");
      }
      for (const json& slice : s.at("slices")) shard.slices.push_back(SliceFromJson(slice));
      m.shards.push_back(std::move(shard));
    }
  } catch (const json::exception& e) {
    return DataLossError(path + ": malformed checkpoint metadata: " + e.what());
  } catch (const BadInteger& e) {
    return DataLossError(path + ": malformed checkpoint metadata: " + e.what());
  }
  if (m.shards.empty()) return DataLossError(path + ": lists no shards");
  return m;
}

Status CheckComplete(const std::string& step_dir, bool verify_crc) {
  Status s = Completeness(step_dir, verify_crc, nullptr);
  if (s.ok()) return s;
  return Status(s.code(), "checkpoint " + fs::path(step_dir).filename().string() +
                              " is incomplete: " + s.message());
}

StatusOr<LatestCheckpoint> FindLatestComplete(const std::string& dir,
                                              std::vector<std::string>* warnings) {
  MESHRUN_ASSIGN_OR_RETURN(auto steps, ListSteps(dir));
  std::vector<std::string> pending;  // warnings waiting for the name of the fallback
  auto flush = [&](const std::string& suffix) {
    if (warnings) {
      for (const std::string& w : pending) warnings->push_back(w + suffix);
    }
  };
  for (const auto& [step, step_dir] : steps) {
    const std::string name = fs::path(step_dir).filename().string();
    CheckpointMetadata m;
    Status s = Completeness(step_dir, /*verify_crc=*/true, &m);
    if (s.ok() && m.step != step) {
      s = FailedPreconditionError("its metadata.json says step " + std::to_string(m.step));
    }
    if (!s.ok()) {
      pending.push_back("checkpoint " + name + " is incomplete: " + s.message());
      continue;
    }
    flush("; falling back to " + name);
    return LatestCheckpoint{step_dir, step, std::move(m)};
  }
  flush("; no complete checkpoint is left");
  return NotFoundError(
      "no complete checkpoint in " + dir +
      (steps.empty() ? "" : " (" + std::to_string(steps.size()) + " incomplete step folders)"));
}

std::string CheckpointOwner(const std::string& step_dir) {
  if (auto m = ReadMetadata(step_dir); m.ok()) return m->owner;
  // No (readable) metadata.json: the owner the first readable shard carries.
  std::error_code ec;
  std::vector<std::string> shards;
  for (fs::directory_iterator it(step_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank-", 0) == 0 && name.size() > 12 &&
        name.compare(name.size() - 12, 12, ".safetensors") == 0) {
      shards.push_back(it->path().string());
    }
  }
  std::sort(shards.begin(), shards.end());
  for (const std::string& path : shards) {
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) continue;
    const auto owner = file->metadata().find(kShardOwnerKey);
    return owner == file->metadata().end() ? "" : owner->second;
  }
  return "";
}

Status PruneCheckpoints(const std::string& dir, int keep, std::vector<std::string>* deleted,
                        const std::string& owner) {
  if (keep < 1) {
    return InvalidArgumentError("checkpoint.keep(" + std::to_string(keep) +
                                ") must be >= 1 (hint: the newest checkpoint is needed to resume)");
  }
  auto steps = ListSteps(dir);
  if (!steps.ok())
    return steps.status().code() == StatusCode::kNotFound ? OkStatus() : steps.status();
  int complete_seen = 0;
  for (const auto& [step, step_dir] : *steps) {
    // Another run's folder (in a shared checkpoint.dir) is neither counted nor touched.
    if (CheckpointOwner(step_dir) != owner) continue;
    const bool complete = Completeness(step_dir, /*verify_crc=*/false, nullptr).ok();
    bool remove = false;
    if (complete) {
      remove = ++complete_seen > keep;
    } else {
      remove = complete_seen > 0;  // older than the newest complete one: a crashed save
    }
    if (!remove) continue;
    MESHRUN_RETURN_IF_ERROR(RemoveAllConfined(step_dir));
    if (deleted) deleted->push_back(step_dir);
  }
  return OkStatus();
}

// ---- CheckpointReader -------------------------------------------------------------------

CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& step_dir) {
  CheckpointReader r;
  r.step_dir_ = step_dir;
  MESHRUN_ASSIGN_OR_RETURN(r.metadata_, ReadMetadata(step_dir));
  for (const ShardInfo& shard : r.metadata_.shards) {
    const std::string path = (fs::path(step_dir) / shard.file).string();
    MESHRUN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
    for (const SliceInfo& slice : shard.slices) {
      const auto global = r.metadata_.tensors.find(slice.tensor);
      if (global == r.metadata_.tensors.end()) {
        return DataLossError(path + ": slice of unknown tensor '" + slice.tensor + "'");
      }
      Status bounds = CheckSliceBounds(path + ": tensor '" + slice.tensor + "'", global->second,
                                       slice.offset, slice.shape);
      if (!bounds.ok()) return DataLossError(bounds.message());
      auto info = file.Info(slice.key);
      if (!info.ok()) return DataLossError(info.status().message());
      if (info->shape != slice.shape || !IsFloatDType(info->dtype)) {
        return DataLossError(path + ": '" + slice.key + "' is " + DTypeName(info->dtype) +
                             ShapeString(info->shape) + ", the metadata says F32" +
                             ShapeString(slice.shape));
      }
      r.slices_[slice.tensor].push_back({r.files_.size(), slice});
    }
    r.files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
  }
  return r;
}

StatusOr<std::vector<int64_t>> CheckpointReader::GlobalShape(const std::string& tensor) const {
  const auto it = metadata_.tensors.find(tensor);
  if (it == metadata_.tensors.end()) {
    return NotFoundError(step_dir_ + ": no tensor '" + tensor + "' in the checkpoint");
  }
  return it->second;
}

Status CheckpointReader::ReadTensor(const std::string& tensor, float* out) const {
  MESHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, GlobalShape(tensor));
  return ReadSlice(tensor, std::vector<int64_t>(shape.size(), 0), shape, out);
}

Status CheckpointReader::ReadSlice(const std::string& tensor, const std::vector<int64_t>& offset,
                                   const std::vector<int64_t>& shape, float* out) const {
  MESHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> global, GlobalShape(tensor));
  MESHRUN_RETURN_IF_ERROR(
      CheckSliceBounds(step_dir_ + ": reading tensor '" + tensor + "'", global, offset, shape));
  if (Product(shape) == 0) return OkStatus();
  const size_t dims = global.size();
  Box region{offset, offset};
  for (size_t d = 0; d < dims; ++d) region.hi[d] += shape[d];

  // Which stored slices overlap the request, and do they cover it?
  struct Part {
    const StoredSlice* slice;
    Box box;
  };
  std::vector<Part> parts;
  std::vector<Box> boxes;
  const auto stored = slices_.find(tensor);
  if (stored != slices_.end()) {
    for (const StoredSlice& s : stored->second) {
      Box box;
      if (!Intersect(s.info.offset, s.info.shape, region, &box)) continue;
      boxes.push_back(box);
      parts.push_back({&s, std::move(box)});
    }
  }
  std::vector<int64_t> missing;
  if (!Covers(boxes, region, &missing)) {
    return DataLossError(step_dir_ + ": element " + ShapeString(missing) + " of tensor '" + tensor +
                         "' is in no stored slice (the checkpoint does not hold it)");
  }
  if (dims == 0) {  // a scalar: any slice holds it
    return files_[parts.front().slice->file]->ReadFloatRange(parts.front().slice->info.key, 0, 1,
                                                             out);
  }

  // Row-major strides of the request.
  std::vector<int64_t> dst_stride(dims, 1);
  for (size_t d = dims - 1; d-- > 0;) dst_stride[d] = dst_stride[d + 1] * shape[d + 1];
  std::vector<float> buf;
  for (const Part& p : parts) {
    const SliceInfo& s = p.slice->info;
    // Read only the slice's rows (dim 0) that intersect: a contiguous element range.
    std::vector<int64_t> src_stride(dims, 1);
    for (size_t d = dims - 1; d-- > 0;) src_stride[d] = src_stride[d + 1] * s.shape[d + 1];
    const int64_t row0 = p.box.lo[0] - s.offset[0];
    const int64_t rows = p.box.hi[0] - p.box.lo[0];
    buf.resize(static_cast<size_t>(rows * src_stride[0]));
    MESHRUN_RETURN_IF_ERROR(files_[p.slice->file]->ReadFloatRange(
        s.key, row0 * src_stride[0], rows * src_stride[0], buf.data()));
    // Copy runs along the last dim for every index of the leading dims of the intersection.
    const int64_t run = p.box.hi[dims - 1] - p.box.lo[dims - 1];
    std::vector<int64_t> idx = p.box.lo;
    for (;;) {
      int64_t src = 0, dst = 0;
      for (size_t d = 0; d < dims; ++d) {
        const int64_t src_origin = d == 0 ? p.box.lo[0] : s.offset[d];
        src += (idx[d] - src_origin) * src_stride[d];
        dst += (idx[d] - offset[d]) * dst_stride[d];
      }
      std::copy_n(buf.data() + src, run, out + dst);
      size_t d = dims - 1;  // advance the leading dims (the last one is the run)
      while (d-- > 0) {
        if (++idx[d] < p.box.hi[d]) break;
        idx[d] = p.box.lo[d];
      }
      if (d == static_cast<size_t>(-1)) break;
    }
  }
  return OkStatus();
}

}  // namespace meshrun
