// DirLock: a folder held by one process at a time. flock(2) on a lock file in the folder, held
// for as long as the object lives; the kernel drops it when the process dies (kill -9 included),
// so a crashed holder never leaves a stale lock behind. The file says who holds it (pid, host,
// what, job id), so the one refused can name the holder.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace meshrun {

// The lock file in a held folder.
inline constexpr char kDirLockFile[] = ".meshrun.lock";

// Who holds (or asks for) a folder.
struct DirLockHolder {
  int64_t pid = 0;
  std::string host;
  std::string what;      // e.g. "meshrun-coordinator", "meshrun train", "rank 0"
  std::string job_id;    // empty: none (a standalone run, a coordinator)
  int attempt = 0;       // 0: none
  int64_t since_ms = 0;  // wall clock, ms since the epoch, when the lock was taken

  // "pid 123 on host a (meshrun train, job job-000002 attempt 1, since 2026-12-03T10:00:00Z)".
  std::string Describe() const;
};

// This process (pid, host name, now) doing `what`.
DirLockHolder ThisProcess(const std::string& what);

class DirLock {
 public:
  // Takes the lock of `dir` (created when missing) without waiting. When another process holds
  // it: ALREADY_EXISTS, with the holder read from the lock file in `*holder` (when not null).
  // Other failures (the folder cannot be created, the file not opened): FAILED_PRECONDITION.
  static StatusOr<std::unique_ptr<DirLock>> TryAcquire(const std::string& dir,
                                                       const DirLockHolder& me,
                                                       DirLockHolder* holder = nullptr);
  // Reads the holder recorded in `dir`'s lock file (NOT_FOUND without one); for messages only.
  static StatusOr<DirLockHolder> ReadHolder(const std::string& dir);

  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  DirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

}  // namespace meshrun
