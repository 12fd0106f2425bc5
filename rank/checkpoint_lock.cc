// CheckpointDirLock (see checkpoint_lock.h).
#include "rank/checkpoint_lock.h"

#include <chrono>

namespace meshrun::rank {

StatusOr<std::unique_ptr<CheckpointDirLock>> CheckpointDirLock::Acquire(
    const std::string& dir, const std::string& what, const std::string& job_id, int attempt,
    const std::function<void(const std::string&)>& note) {
  DirLockHolder me = ThisProcess(what);
  me.job_id = job_id;
  me.attempt = attempt;
  std::unique_ptr<CheckpointDirLock> out(new CheckpointDirLock());
  DirLockHolder holder;
  StatusOr<std::unique_ptr<DirLock>> lock = DirLock::TryAcquire(dir, me, &holder);
  if (lock.ok()) {
    out->lock_ = std::move(lock).value();
    return out;
  }
  if (lock.status().code() != StatusCode::kAlreadyExists) {
    return InvalidArgumentError("checkpoint.dir: " + std::string(lock.status().message()) +
                                " (hint: set checkpoint.dir to a folder you can write)");
  }
  if (job_id.empty() || holder.job_id != job_id) {
    return InvalidArgumentError(
        "checkpoint.dir: " + dir + " is in use by another run, " + holder.Describe() +
        " (hint: two runs on one folder overwrite each other's checkpoints; wait for that run to "
        "end or stop it, or give this one its own folder with --set checkpoint.dir=ANOTHER_DIR)");
  }
  if (note) {
    note("checkpoint.dir: " + dir + " is still held by " + holder.Describe() +
         "; taking it over once that process has exited");
  }
  CheckpointDirLock* raw = out.get();
  out->waiter_ = std::thread([raw, dir, me] {
    while (!raw->stop_.load()) {
      StatusOr<std::unique_ptr<DirLock>> again = DirLock::TryAcquire(dir, me);
      if (again.ok()) {
        std::lock_guard<std::mutex> guard(raw->mu_);
        raw->lock_ = std::move(again).value();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  return out;
}

bool CheckpointDirLock::held() const {
  std::lock_guard<std::mutex> guard(mu_);
  return lock_ != nullptr;
}

CheckpointDirLock::~CheckpointDirLock() {
  stop_.store(true);
  if (waiter_.joinable()) waiter_.join();
}

}  // namespace meshrun::rank
