// The key-value Store that bootstraps communicators (c10d-style): ranks publish addresses and
// counters under agreed keys and wait for each other's. Implementations here: InMemoryStore
// (one process), FileStore (processes of one host sharing a directory) and PrefixStore (a
// namespace over another store). A TCP store (standalone launcher) or a gRPC store
// (coordinator) implements the same interface.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshrun {

// Values are byte strings: std::string is used as the byte container (it may hold NULs), the
// same type a protobuf `bytes` field maps to.
//
// Every wait is bounded: a key that does not appear in time yields DEADLINE_EXCEEDED naming it.
// Implementations are thread-safe.
class Store {
 public:
  using Duration = std::chrono::milliseconds;

  virtual ~Store() = default;

  // Creates or overwrites `key`. Readers see either the old or the new value, never a mix.
  virtual Status Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting until it exists or `timeout` passes (DEADLINE_EXCEEDED).
  virtual StatusOr<std::string> Get(const std::string& key, Duration timeout) = 0;

  // Atomically adds `delta` to the integer counter at `key` (absent counts as 0) and returns
  // the new value. The counter is stored as its decimal text, so Get(key) returns e.g. "3".
  // FAILED_PRECONDITION when `key` holds something that is not a decimal integer.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Waits until every key exists; DEADLINE_EXCEEDED naming the missing keys after `timeout`.
  virtual Status Wait(const std::vector<std::string>& keys, Duration timeout) = 0;

  // Whether every key exists right now (no waiting).
  virtual StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;
};

// A store in this process's memory: for the fake backend and in-process tests. Thread-safe.
class InMemoryStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// A store in a directory that several processes of one host (or of hosts sharing a POSIX
// filesystem with working flock and rename) open at the same path. One file per key, written
// to a temporary name and renamed into place, so readers never see a partial value; Add holds
// an exclusive flock on `<dir>/.add.lock` around its read-modify-write. Waits poll the
// directory with a short backoff (1 ms growing to 20 ms). Keys are percent-encoded into file
// names, so any key (including '/') is valid. The directory is not cleaned up: give each job
// attempt a fresh directory or prefix. Thread-safe and process-safe.
class FileStore : public Store {
 public:
  // Creates `dir` (and its parents) when missing.
  static StatusOr<std::shared_ptr<FileStore>> Create(const std::string& dir);

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys) override;

  const std::string& dir() const { return dir_; }

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& key) const;
  // Writes `value` to a temporary file and renames it to `path`.
  Status WriteAtomically(const std::string& path, const std::string& value);
  // NOT_FOUND when the key does not exist yet.
  StatusOr<std::string> ReadKey(const std::string& key) const;

  std::string dir_;
};

// Namespaces the keys of another store: key k is stored as "<prefix>/k". Used to give every
// communicator group its own keys ("comm/tp/1/…"). Thread-safe when the base store is.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string Full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> Full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace meshrun
