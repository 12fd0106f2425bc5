// AtomicFileWriter and WriteFileAtomic over POSIX open/write/fsync/rename: the one atomic file
// write of meshrun (checkpoints, exports, the FileStore's keys, the worker's rank specs).
#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/confined_file.h"
#include "common/crc32.h"

namespace meshrun {
namespace {

Status IoError(const std::string& what, const std::string& path, int err) {
  std::string msg = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) {
    return ResourceExhaustedError(msg + " (hint: free disk space or lower checkpoint.keep)");
  }
  if (err == EACCES || err == EPERM || err == EROFS) {
    return {StatusCode::kPermissionDenied, msg + " (hint: check the folder's permissions)"};
  }
  if (err == ENOENT) return NotFoundError(msg + " (hint: create the folder first)");
  return InternalError(msg);
}

std::string ParentDir(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  // The counter keeps two threads of one process that write the same path (two ranks of a
  // FileStore in one test process, say) off each other's temporary.
  static std::atomic<uint64_t> counter{0};
  std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                     std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
  MESHRUN_ASSIGN_OR_RETURN(const int fd,
                           OpenConfined(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd < 0) return IoError("cannot create a temporary file", temp, errno);
  return AtomicFileWriter(path, std::move(temp), fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      bytes_(other.bytes_),
      crc_(other.crc_) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_ = other.bytes_;
    crc_ = other.crc_;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() {
  Abandon();
}

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

Status AtomicFileWriter::Append(const void* data, size_t size) {
  if (fd_ < 0) return FailedPreconditionError(path_ + ": the writer is closed");
  const auto* p = static_cast<const char*>(data);
  crc_ = Crc32Update(crc_, data, size);
  bytes_ += size;
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      Abandon();
      return IoError("write failed", temp_path_, err);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return FailedPreconditionError(path_ + ": the writer is closed");
  if (::fsync(fd_) != 0) {
    const int err = errno;
    Abandon();
    return IoError("fsync failed", temp_path_, err);
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return IoError("close failed", temp_path_, err);
  }
  StatusOr<int> renamed = RenameConfined(temp_path_, path_);
  if (!renamed.ok()) {
    ::unlink(temp_path_.c_str());
    return renamed.status();
  }
  if (*renamed != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return IoError("rename from " + temp_path_ + " failed", path_, err);
  }
  return FsyncDir(ParentDir(path_));
}

Status WriteFileAtomic(const std::string& path, std::string_view bytes) {
  MESHRUN_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  MESHRUN_RETURN_IF_ERROR(w.Append(bytes));
  return w.Commit();
}

Status FsyncDir(const std::string& dir) {
  MESHRUN_ASSIGN_OR_RETURN(const int fd, OpenConfined(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd < 0) return IoError("cannot open the folder to fsync it", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems (e.g. certain network mounts) do not support fsync on a folder; the
  // rename itself has happened, so only report real I/O errors.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    return IoError("fsync of the folder failed", dir, err);
  return OkStatus();
}

}  // namespace meshrun
