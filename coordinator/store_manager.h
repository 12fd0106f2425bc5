// The rendezvous store (store.proto): one in-memory key space per (job_id, attempt), opened by
// JobManager when it places the attempt and closed when the attempt ends. With a StateDb every
// Set and Add is written through to it before it is answered, so an attempt that keeps running
// across a coordinator restart finds its keys again (RestoreAttempt): a barrier that straddles
// the restart (a checkpoint's "written" keys) completes instead of timing out.
//
// Thread-safe (one mutex). Called by JobManager (Open/CloseAttempt) and by the Store* handlers.
// Waiting StoreGet calls complete through their callback, which runs without the store's lock
// held, from the thread that set the key, closed the attempt or expired the wait.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/state_db.h"
#include "coordinator/streams.h"

namespace meshrun::coordinator {

struct StoreLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = 1 << 20;  // --max-store-value-bytes
  size_t max_keys_per_attempt = 1 << 20;
  size_t max_bytes_per_attempt = 256u << 20;  // --max-store-bytes-per-attempt
  // All keys and values of every attempt together (--max-store-bytes): many attempts, each
  // under its own limit, must not add up to the coordinator's memory.
  size_t max_bytes = size_t{1} << 30;
  // Parked StoreGet waits, all owners together (--max-store-waits) and of one owner: the
  // worker of the client certificate, or the peer's host without TLS
  // (--max-store-waits-per-worker), so that one worker cannot take every slot.
  size_t max_waiters = 1 << 16;
  size_t max_waiters_per_owner = 1'024;
  // StoreGet with wait and no timeout waits this long (c10d's default store timeout).
  std::chrono::milliseconds default_wait{300'000};
  // A client's timeout is clamped to this (--max-store-wait).
  std::chrono::milliseconds max_wait{1'800'000};
};

class StoreManager {
 public:
  // The value found (nullopt: not set, only without wait) or an error.
  using GetCallback = std::function<void(StatusOr<std::optional<std::string>>)>;

  // `db` (optional, not owned, outliving this) keeps the keys across restarts.
  StoreManager(const Clock& clock, StoreLimits limits, StateDb* db = nullptr)
      : clock_(clock), limits_(limits), db_(db) {}

  // Creates an empty key space (replacing any of the same attempt, also in the database).
  void OpenAttempt(const std::string& job_id, int attempt);
  // After a coordinator restart: the key space of a still running attempt, as the database
  // kept it (empty without a database).
  Status RestoreAttempt(const std::string& job_id, int attempt);
  // Drops the key space; every waiting StoreGet on it fails with ABORTED.
  void CloseAttempt(const std::string& job_id, int attempt);
  bool HasAttempt(const std::string& job_id, int attempt) const;

  // Errors: ABORTED no open key space for (job_id, attempt) (the caller tells NOT_FOUND apart
  // by asking JobManager whether the job exists); RESOURCE_EXHAUSTED over a limit; INTERNAL
  // when the database refuses the write (the value is then held in memory only).
  Status Set(const std::string& job_id, int attempt, const std::string& key, std::string value);
  // Without wait: done(value or nullopt) at once. With wait: done(value) as soon as the key is
  // set, DEADLINE_EXCEEDED when min(timeout or the default, call_deadline) passes (checked by
  // ExpireWaiters), ABORTED when the attempt closes, UNAVAILABLE at Shutdown, CANCELLED when
  // `cancel` (optional) fires: the wait is then dropped at once. `timeout` is clamped to
  // limits.max_wait. `owner` names whose wait it is (limits.max_waiters_per_owner). `done` may
  // run before Get returns.
  void Get(const std::string& job_id, int attempt, const std::string& key, bool wait,
           std::chrono::milliseconds timeout, std::optional<MonoTime> call_deadline,
           GetCallback done, const std::string& owner = std::string(),
           CallCancellation* cancel = nullptr);
  // FAILED_PRECONDITION when the key holds something other than a decimal int64, OUT_OF_RANGE
  // on overflow. A non-empty `request_id` that this attempt has already applied answers that
  // addition's result and adds nothing: a client's retry after a lost reply cannot add twice.
  StatusOr<int64_t> Add(const std::string& job_id, int attempt, const std::string& key,
                        int64_t delta, const std::string& request_id = "");

  // Fails the waits whose deadline is at or before the clock's now. Called by the server's
  // ticker (and by tests).
  void ExpireWaiters();
  // Fails every wait with UNAVAILABLE and refuses new ones: the coordinator is stopping.
  void Shutdown();

  size_t waiter_count() const;
  size_t waiter_count_of(const std::string& owner) const;
  const StoreLimits& limits() const { return limits_; }
  size_t attempt_count() const;
  size_t total_bytes() const;

 private:
  struct Waiter {
    std::string key;
    MonoTime deadline;
    GetCallback done;
    uint64_t id = 0;
    std::string owner;
  };
  struct KeySpace {
    std::unordered_map<std::string, std::string> values;
    std::unordered_map<std::string, int64_t> applied_adds;  // request id -> the result answered
    size_t bytes = 0;  // keys, values and applied request ids (each counted as its id + 8)
    std::vector<Waiter> waiters;
  };
  using Key = std::pair<std::string, int>;

  // Stores key=value; moves the callbacks to run (outside the lock) into `wake`.
  Status SetLocked(KeySpace& space, const std::string& key, std::string value,
                   std::vector<std::pair<GetCallback, std::string>>* wake);

  // The counters of a waiter leaving its KeySpace (woken, expired, aborted or cancelled).
  void ForgetLocked(const Waiter& waiter);
  // Drops the wait `id` (its client cancelled): done(CANCELLED) if it was still parked.
  void CancelWait(uint64_t id);

  const Clock& clock_;
  const StoreLimits limits_;
  StateDb* const db_;
  mutable std::mutex mu_;
  std::map<Key, KeySpace> spaces_;                            // guarded by mu_
  size_t waiters_ = 0;                                        // guarded by mu_
  uint64_t next_waiter_ = 1;                                  // guarded by mu_
  std::unordered_map<std::string, size_t> waiters_by_owner_;  // guarded by mu_
  std::unordered_map<uint64_t, Key> waiter_spaces_;           // waiter id -> its space, mu_
  size_t total_bytes_ = 0;  // sum of spaces_[*].bytes, guarded by mu_
  bool shut_down_ = false;  // guarded by mu_
};

}  // namespace meshrun::coordinator
