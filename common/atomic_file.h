// Atomic file writes (docs/checkpoints.md): write to `PATH.tmp.<pid>.<n>`, fsync, rename over
// PATH, fsync the folder. Readers see either the old file or the whole new one, never a torn write,
// even after a crash or a power loss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace meshrun {

// Streams a large file to a temporary and renames it into place on Commit. Owns the temporary's
// file descriptor; dropping an uncommitted writer removes the temporary. Move-only, not
// thread-safe (one writer per file). Used by WriteFileAtomic, the safetensors writer and the
// checkpoint code; WriteFileAtomic by FileStore and meshrun-worker too.
class AtomicFileWriter {
 public:
  // Creates `path.tmp.<pid>.<n>` (n counts this process's writers). The folder must exist.
  static StatusOr<AtomicFileWriter> Open(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends bytes. RESOURCE_EXHAUSTED on a full disk, INTERNAL on other I/O errors.
  Status Append(const void* data, size_t size);
  Status Append(std::string_view bytes) { return Append(bytes.data(), bytes.size()); }

  // fsync, close, rename over the final path, fsync the folder. After an error the temporary
  // is removed and the final path is untouched.
  Status Commit();

  // Removes the temporary without touching the final path (also done by the destructor).
  void Abandon();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  uint64_t bytes_written() const { return bytes_; }
  uint32_t crc32() const { return crc_; }  // CRC-32 of the bytes appended so far

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// Writes `bytes` to `path` atomically (see above).
Status WriteFileAtomic(const std::string& path, std::string_view bytes);

// fsync of a folder, so that a rename or a new entry in it survives a crash.
Status FsyncDir(const std::string& dir);

}  // namespace meshrun
