// DirLock (see dir_lock.h): flock(2) on FOLDER/.meshrun.lock plus the holder's description in
// the file, rewritten by each new holder.
#include "common/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <thread>

namespace meshrun {
namespace {

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string Utc(int64_t ms) {
  const time_t seconds = static_cast<time_t>(ms / 1000);
  tm t{};
  gmtime_r(&seconds, &t);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &t);
  return text;
}

std::string Serialize(const DirLockHolder& h) {
  return "pid " + std::to_string(h.pid) + "\nhost " + h.host + "\nwhat " + h.what + "\njob " +
         h.job_id + "\nattempt " + std::to_string(h.attempt) + "\nsince_ms " +
         std::to_string(h.since_ms) + "\n";
}

DirLockHolder Parse(const std::string& text) {
  DirLockHolder h;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "pid") h.pid = std::atoll(value.c_str());
    if (key == "host") h.host = value;
    if (key == "what") h.what = value;
    if (key == "job") h.job_id = value;
    if (key == "attempt") h.attempt = std::atoi(value.c_str());
    if (key == "since_ms") h.since_ms = std::atoll(value.c_str());
  }
  return h;
}

std::string ReadAll(int fd) {
  std::string text;
  char buf[512];
  off_t at = 0;
  for (ssize_t n; (n = pread(fd, buf, sizeof(buf), at)) > 0 && text.size() < 4096; at += n) {
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

std::string DirLockHolder::Describe() const {
  if (pid <= 0) return "another process (its lock file names none yet)";
  std::string out = "pid " + std::to_string(pid) + " on " + (host.empty() ? "?" : host);
  std::string details = what;
  if (!job_id.empty()) {
    details += (details.empty() ? "" : ", ") + std::string("job ") + job_id;
    if (attempt > 0) details += " attempt " + std::to_string(attempt);
  }
  if (since_ms > 0)
    details += (details.empty() ? "" : ", ") + std::string("since ") + Utc(since_ms);
  if (!details.empty()) out += " (" + details + ")";
  return out;
}

DirLockHolder ThisProcess(const std::string& what) {
  DirLockHolder h;
  h.pid = getpid();
  h.host = HostName();
  h.what = what;
  h.since_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  return h;
}

StatusOr<std::unique_ptr<DirLock>> DirLock::TryAcquire(const std::string& dir,
                                                       const DirLockHolder& me,
                                                       DirLockHolder* holder) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return FailedPreconditionError(dir + ": cannot create the folder: " + ec.message());
  }
  const std::string path = (std::filesystem::path(dir) / kDirLockFile).string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return FailedPreconditionError(path + ": cannot open the lock file: " + std::strerror(errno));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      close(fd);
      return FailedPreconditionError(path + ": cannot lock: " + std::strerror(err));
    }
    // The holder writes its description right after locking: give it a moment.
    DirLockHolder who;
    for (int i = 0; i < 20; ++i) {
      who = Parse(ReadAll(fd));
      if (who.pid > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    close(fd);
    if (holder != nullptr) *holder = who;
    return Status(StatusCode::kAlreadyExists, dir + " is held by " + who.Describe());
  }
  const std::string text = Serialize(me);
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    close(fd);
    return FailedPreconditionError(path + ": cannot write the lock file: " + std::strerror(err));
  }
  return std::unique_ptr<DirLock>(new DirLock(fd, path));
}

StatusOr<DirLockHolder> DirLock::ReadHolder(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kDirLockFile).string();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return NotFoundError(path + ": no lock file");
  DirLockHolder h = Parse(ReadAll(fd));
  close(fd);
  return h;
}

DirLock::~DirLock() {
  if (fd_ >= 0) close(fd_);  // drops the flock
}

}  // namespace meshrun
