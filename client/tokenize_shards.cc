// The shards of `meshrun tokenize --shard-tokens` and their manifest (client/tokenize_shards.h).
#include "client/tokenize_shards.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>

#include "common/atomic_file.h"
#include "common/crc32.h"
#include "common/dir_lock.h"
#include "engine/data/token_stream.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kManifest = "manifest.json";

std::string ShardCrcHex(uint32_t v) {
  char b[9];
  std::snprintf(b, sizeof(b), "%08x", v);
  return b;
}

json ShardJson(const ShardRecord& s) {
  return {{"file", s.file},
          {"tokens", s.tokens},
          {"bytes", s.bytes},
          {"crc32", ShardCrcHex(s.crc32)},
          {"resume",
           {{"input", s.end.chunk.file},
            {"offset", s.end.chunk.offset},
            {"line", s.end.chunk.line},
            {"skip", s.end.skip},
            {"after_document", s.end.emitted_before}}}};
}

std::optional<ShardRecord> ShardFromJson(const json& j) {
  try {
    ShardRecord s;
    s.file = j.at("file").get<std::string>();
    s.tokens = j.at("tokens").get<int64_t>();
    s.bytes = j.at("bytes").get<uint64_t>();
    s.crc32 = static_cast<uint32_t>(std::stoul(j.at("crc32").get<std::string>(), nullptr, 16));
    const json& r = j.at("resume");
    s.end.chunk.file = r.at("input").get<int>();
    s.end.chunk.offset = r.at("offset").get<int64_t>();
    s.end.chunk.line = r.at("line").get<int64_t>();
    s.end.skip = r.at("skip").get<int64_t>();
    s.end.emitted_before = r.at("after_document").get<bool>();
    if (s.file.find('/') != std::string::npos || s.file.empty() || s.file[0] == '.') {
      return std::nullopt;
    }
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

// ---- ShardWriter ---------------------------------------------------------------------------

ShardWriter::ShardWriter(int32_t vocab_size, int64_t max_tokens,
                         std::function<std::string(int)> name,
                         std::function<Status(const ShardRecord&)> on_shard, int first_index)
    : wide_(vocab_size > 65535),
      max_(max_tokens),
      name_(std::move(name)),
      on_shard_(std::move(on_shard)),
      index_(first_index) {}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status ShardWriter::Write(const int32_t* ids, int64_t n, const ShardEnd& chunk_start,
                          int64_t chunk_done) {
  int64_t i = 0;
  while (i < n) {
    if (fd_ < 0) MESHRUN_RETURN_IF_ERROR(Open());
    const int64_t take = std::min(n - i, max_ - count_);
    const int width = wide_ ? 4 : 2;
    for (int64_t k = 0; k < take; ++k) {
      const uint32_t v = static_cast<uint32_t>(ids[i + k]);
      buf_.push_back(static_cast<char>(v & 0xFF));
      buf_.push_back(static_cast<char>((v >> 8) & 0xFF));
      if (width == 4) {
        buf_.push_back(static_cast<char>((v >> 16) & 0xFF));
        buf_.push_back(static_cast<char>((v >> 24) & 0xFF));
      }
    }
    i += take;
    count_ += take;
    total_ += take;
    if (buf_.size() >= (1 << 20)) MESHRUN_RETURN_IF_ERROR(Flush());
    if (count_ == max_) {
      ShardEnd end = chunk_start;
      end.skip = chunk_done + i;
      MESHRUN_RETURN_IF_ERROR(Close(end));
    }
  }
  return OkStatus();
}

Status ShardWriter::Finish(const ShardEnd& end) {
  if (fd_ < 0) return OkStatus();
  return Close(end);
}

Status ShardWriter::Open() {
  final_ = name_(index_);
  const fs::path p(final_);
  temp_ = (p.parent_path() / ("." + p.filename().string() + ".partial")).string();
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return InternalError(temp_ + ": cannot create: " + std::strerror(errno));
  buf_.assign(kLlmcHeaderInts * 4, '\0');  // the header, its count written on Close
  count_ = 0;
  return OkStatus();
}

Status ShardWriter::Flush() {
  size_t at = 0;
  while (at < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + at, buf_.size() - at);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string m = temp_ + ": write failed: " + std::strerror(errno);
      return errno == ENOSPC ? ResourceExhaustedError(m) : InternalError(m);
    }
    at += static_cast<size_t>(n);
  }
  buf_.clear();
  return OkStatus();
}

Status ShardWriter::Close(const ShardEnd& end) {
  MESHRUN_RETURN_IF_ERROR(Flush());
  unsigned char header[12];
  auto put32 = [&](int at, uint32_t v) {
    for (int k = 0; k < 4; ++k) header[at + k] = static_cast<unsigned char>((v >> (8 * k)) & 0xFF);
  };
  put32(0, kLlmcMagic);
  put32(4, wide_ ? kLlmcVersionUint32 : kLlmcVersion);
  put32(8, static_cast<uint32_t>(count_));
  if (::pwrite(fd_, header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header)) ||
      ::fsync(fd_) != 0) {
    return InternalError(temp_ + ": write failed: " + std::strerror(errno));
  }
  ::close(fd_);
  fd_ = -1;
  MESHRUN_ASSIGN_OR_RETURN(FileDigest digest, DigestFile(temp_));
  if (::rename(temp_.c_str(), final_.c_str()) != 0) {
    return InternalError(final_ + ": cannot rename " + temp_ + ": " + std::strerror(errno));
  }
  ShardRecord r{fs::path(final_).filename().string(), count_, digest.bytes, digest.crc32, end};
  ++index_;
  return on_shard_ ? on_shard_(r) : OkStatus();
}

// ---- ShardFolder ---------------------------------------------------------------------------

ShardFolder::ShardFolder(std::string dir, json head)
    : dir_(std::move(dir)),
      manifest_path_((fs::path(dir_) / kManifest).string()),
      head_(std::move(head)) {}

ShardFolder::~ShardFolder() = default;

StatusOr<std::unique_ptr<ShardFolder>> ShardFolder::Open(const std::string& dir,
                                                         const std::string& prefix, json head) {
  std::unique_ptr<ShardFolder> folder(new ShardFolder(dir, std::move(head)));
  const std::string& manifest_path = folder->manifest_path_;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError("-o: " + dir +
                                " is not a folder this process can create (hint: "
                                "with --shard-tokens, -o names a folder)");
  }
  // One run per folder: a second would delete the first's partial shards and rewrite its
  // manifest under it.
  DirLockHolder holder;
  StatusOr<std::unique_ptr<DirLock>> lock =
      DirLock::TryAcquire(dir, ThisProcess("meshrun tokenize"), &holder);
  if (!lock.ok() && lock.status().code() == StatusCode::kAlreadyExists) {
    return InvalidArgumentError("-o: " + dir + " is in use by another run, " + holder.Describe() +
                                " (hint: wait for it to end, or choose another -o folder)");
  }
  if (!lock.ok()) return lock.status();
  folder->lock_ = std::move(lock).value();
  // Leftovers of an interrupted run: partial shards and manifest temporaries.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((name.rfind("." + prefix + "_", 0) == 0 && name.size() > 8 &&
         name.compare(name.size() - 8, 8, ".partial") == 0) ||
        name.rfind(std::string(kManifest) + ".tmp.", 0) == 0) {
      fs::remove(e.path(), ec);
    }
  }
  if (fs::exists(manifest_path, ec)) {
    std::string text;
    json old;
    if (Status s = ReadTextFile(manifest_path, &text); s.ok()) {
      old = json::parse(text, nullptr, false);
    }
    if (old.is_discarded() || !old.is_object() || old.value("format", "") != kShardManifestFormat) {
      return InvalidArgumentError(
          manifest_path + " is not a meshrun tokenize manifest (hint: choose another -o folder)");
    }
    json old_head = old;
    for (const char* k : {"shards", "tokens", "complete"}) old_head.erase(k);
    if (old_head != folder->head_) {
      std::string what;
      for (const auto& [k, v] : folder->head_.items()) {
        if (!old_head.contains(k) || old_head[k] != v) what += (what.empty() ? "" : ", ") + k;
      }
      return InvalidArgumentError(
          manifest_path + " is of another run (its " + what +
          " differ) (hint: remove the folder to start over, or choose another -o folder)");
    }
    // Reuse the listed shards whose size and CRC-32 still match, up to the first that fails.
    std::vector<ShardRecord>& shards = folder->shards_;
    for (const json& j : old.value("shards", json::array())) {
      std::optional<ShardRecord> r = ShardFromJson(j);
      if (!r) break;
      StatusOr<FileDigest> d = DigestFile((fs::path(dir) / r->file).string());
      if (!d.ok() || d->bytes != r->bytes || d->crc32 != r->crc32) {
        std::fprintf(stderr, "note: %s: %s, so it is written again\n",
                     (fs::path(dir) / r->file).string().c_str(),
                     d.ok() ? "its CRC-32 or size is not the manifest's" : "missing");
        break;
      }
      shards.push_back(*r);
    }
    folder->complete_ =
        old.value("complete", false) && shards.size() == old.value("shards", json::array()).size();
    if (!shards.empty()) {
      folder->resume_ = shards.back().end;
      for (const ShardRecord& s : shards) folder->done_tokens_ += s.tokens;
    }
  } else if (std::any_of(fs::directory_iterator(dir, ec), fs::directory_iterator(),
                         [](const fs::directory_entry& e) {
                           return e.path().filename() != kDirLockFile;
                         })) {
    return InvalidArgumentError(
        "-o: " + dir + " is not empty and has no " + kManifest +
        " (hint: choose a new or empty folder; a folder tokenize wrote resumes from its "
        "manifest)");
  }
  if (!folder->complete_) MESHRUN_RETURN_IF_ERROR(folder->WriteManifest(false));
  return folder;
}

Status ShardFolder::Add(const ShardRecord& shard) {
  shards_.push_back(shard);
  return WriteManifest(false);
}

Status ShardFolder::WriteManifest(bool complete) {
  json m = head_;
  json list = json::array();
  int64_t total = 0;
  for (const ShardRecord& s : shards_) {
    list.push_back(ShardJson(s));
    total += s.tokens;
  }
  m["shards"] = list;
  m["tokens"] = total;
  m["complete"] = complete;
  return WriteFileAtomic(manifest_path_, m.dump(1) + "\n");
}

}  // namespace meshrun::client
