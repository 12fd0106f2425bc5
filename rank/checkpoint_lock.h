// One run per checkpoint.dir: two runs writing one folder overwrite each other's step-N folders
// and prune each other's checkpoints. The run holds the folder's DirLock (common/dir_lock.h) for
// its life: `meshrun train` in its own process, a cluster job in its rank 0. The kernel drops
// the lock when the holder dies, so a killed run never blocks the next one.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/dir_lock.h"
#include "common/status.h"

namespace meshrun::rank {

class CheckpointDirLock {
 public:
  // Takes `dir`'s lock for this process (`what`: "meshrun train", "rank 0"; `job_id` empty for a
  // standalone run). Held by another run: INVALID_ARGUMENT (exit 2) naming the holder (pid,
  // host, job). Held by an earlier attempt of the same job (its rank 0 is still exiting; it can
  // no longer complete a checkpoint, since its attempt's store is gone): the run goes on at once
  // and the lock is taken in the background as soon as that process is gone, with one `note`.
  static StatusOr<std::unique_ptr<CheckpointDirLock>> Acquire(
      const std::string& dir, const std::string& what, const std::string& job_id, int attempt,
      const std::function<void(const std::string&)>& note);

  ~CheckpointDirLock();  // releases the lock (or stops waiting for it)
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  bool held() const;

 private:
  CheckpointDirLock() = default;

  mutable std::mutex mu_;
  std::unique_ptr<DirLock> lock_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread waiter_;
};

}  // namespace meshrun::rank
