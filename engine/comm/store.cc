// InMemoryStore, FileStore and PrefixStore (store.h).
#include "engine/comm/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/atomic_file.h"

namespace meshrun {
namespace {

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + k + "'";
  }
  return out;
}

// Parses a counter value written by Add.
StatusOr<int64_t> ParseStoreCounter(const std::string& key, const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    return FailedPreconditionError("store add '" + key + "': the key holds a value that is not " +
                                   "a decimal integer (hint: use a separate key for counters)");
  }
  return value;
}

std::string StoreTimeoutMessage(const std::string& what, const std::vector<std::string>& missing,
                                Store::Duration timeout) {
  return "store " + what + ": key(s) " + JoinKeys(missing) + " did not appear within " +
         std::to_string(timeout.count()) +
         " ms (hint: check that every peer process is running and uses the same store)";
}

std::string ErrnoText(int err) {
  return std::string(std::strerror(err));
}

}  // namespace

// ---- InMemoryStore ----

Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  cv_.notify_all();
  return OkStatus();
}

StatusOr<std::string> InMemoryStore::Get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool found = cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; });
  if (!found) return DeadlineExceededError(StoreTimeoutMessage("get", {key}, timeout));
  return values_.at(key);
}

StatusOr<int64_t> InMemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      MESHRUN_ASSIGN_OR_RETURN(value, ParseStoreCounter(key, it->second));
    }
    value += delta;
    values_[key] = std::to_string(value);
  }
  cv_.notify_all();
  return value;
}

Status InMemoryStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const std::string& k : keys) {
      if (values_.count(k) == 0) return false;
    }
    return true;
  };
  if (cv_.wait_for(lock, timeout, all_present)) return OkStatus();
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (values_.count(k) == 0) missing.push_back(k);
  }
  return DeadlineExceededError(StoreTimeoutMessage("wait", missing, timeout));
}

StatusOr<bool> InMemoryStore::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& k : keys) {
    if (values_.count(k) == 0) return false;
  }
  return true;
}

// ---- FileStore ----

namespace {

constexpr size_t kMaxFileNameChars = 200;

// Keeps [A-Za-z0-9_-] and percent-encodes every other byte, so no key can name a temporary
// file (those start with '.') or escape the directory. Overlong names keep a readable head and
// end in a 64-bit FNV-1a hash of the whole key.
std::string EncodeKey(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  if (key.empty()) return std::string(1, '%');  // no encoded key is a lone '%'
  std::string out;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '_' || ch == '-') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    }
  }
  if (out.size() > kMaxFileNameChars) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out = out.substr(0, kMaxFileNameChars - 18) + "~" + buf;
  }
  return out;
}

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// Polls `probe` (returns true when done, or an error) with backoff until `timeout` passes;
// returns DEADLINE_EXCEEDED (via `on_timeout`) then.
template <typename Probe, typename OnTimeout>
Status PollUntil(Store::Duration timeout, Probe probe, OnTimeout on_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    StatusOr<bool> done = probe();
    if (!done.ok()) return done.status();
    if (*done) return OkStatus();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return on_timeout();
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace

StatusOr<std::shared_ptr<FileStore>> FileStore::Create(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return UnavailableError("file store '" + dir + "': cannot create the directory" +
                            (ec ? " (" + ec.message() + ")" : std::string()) +
                            " (hint: pass a writable directory on a filesystem all ranks share)");
  }
  return std::shared_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::PathOf(const std::string& key) const {
  return dir_ + "/" + EncodeKey(key);
}

// The one atomic write (common/atomic_file.h); an I/O error of the store's folder is UNAVAILABLE
// like every other failure of this store.
Status FileStore::WriteAtomically(const std::string& path, const std::string& value) {
  Status s = WriteFileAtomic(path, value);
  if (!s.ok()) return UnavailableError("file store '" + dir_ + "': " + s.message());
  return OkStatus();
}

StatusOr<std::string> FileStore::ReadKey(const std::string& key) const {
  const std::string path = PathOf(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("store key '" + key + "' does not exist");
    return UnavailableError("file store '" + dir_ + "': open " + path + ": " + ErrnoText(errno));
  }
  FdCloser closer(fd);
  std::string value;
  char buf[8192];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return UnavailableError("file store '" + dir_ + "': read " + path + ": " + ErrnoText(errno));
    }
    if (n == 0) break;
    value.append(buf, static_cast<size_t>(n));
  }
  return value;
}

Status FileStore::Set(const std::string& key, const std::string& value) {
  return WriteAtomically(PathOf(key), value);
}

StatusOr<std::string> FileStore::Get(const std::string& key, Duration timeout) {
  std::string value;
  Status s = PollUntil(
      timeout,
      [&]() -> StatusOr<bool> {
        StatusOr<std::string> v = ReadKey(key);
        if (v.ok()) {
          value = std::move(v).value();
          return true;
        }
        if (v.status().code() == StatusCode::kNotFound) return false;
        return v.status();
      },
      [&] { return DeadlineExceededError(StoreTimeoutMessage("get", {key}, timeout)); });
  if (!s.ok()) return s;
  return value;
}

StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string lock_path = dir_ + "/.add.lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return UnavailableError("file store '" + dir_ + "': open " + lock_path + ": " +
                            ErrnoText(errno));
  }
  FdCloser closer(fd);  // closing the descriptor also drops the flock
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return UnavailableError("file store '" + dir_ + "': flock " + lock_path + ": " +
                              ErrnoText(errno));
    }
  }
  int64_t value = 0;
  StatusOr<std::string> old = ReadKey(key);
  if (old.ok()) {
    MESHRUN_ASSIGN_OR_RETURN(value, ParseStoreCounter(key, *old));
  } else if (old.status().code() != StatusCode::kNotFound) {
    return old.status();
  }
  value += delta;
  MESHRUN_RETURN_IF_ERROR(WriteAtomically(PathOf(key), std::to_string(value)));
  return value;
}

Status FileStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  return PollUntil(
      timeout, [&] { return Check(keys); },
      [&] {
        std::vector<std::string> missing;
        for (const std::string& k : keys) {
          if (::access(PathOf(k).c_str(), F_OK) != 0) missing.push_back(k);
        }
        return DeadlineExceededError(StoreTimeoutMessage("wait", missing, timeout));
      });
}

StatusOr<bool> FileStore::Check(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (::access(PathOf(k).c_str(), F_OK) != 0) {
      if (errno == ENOENT) return false;
      return UnavailableError("file store '" + dir_ + "': access " + PathOf(k) + ": " +
                              ErrnoText(errno));
    }
  }
  return true;
}

// ---- PrefixStore ----

std::vector<std::string> PrefixStore::Full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(Full(k));
  return out;
}

Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return base_->Set(Full(key), value);
}

StatusOr<std::string> PrefixStore::Get(const std::string& key, Duration timeout) {
  return base_->Get(Full(key), timeout);
}

StatusOr<int64_t> PrefixStore::Add(const std::string& key, int64_t delta) {
  return base_->Add(Full(key), delta);
}

Status PrefixStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  return base_->Wait(Full(keys), timeout);
}

StatusOr<bool> PrefixStore::Check(const std::vector<std::string>& keys) {
  return base_->Check(Full(keys));
}

}  // namespace meshrun
