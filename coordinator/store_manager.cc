// StoreManager: key spaces, waits and counters of the rendezvous store.
#include "coordinator/store_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <limits>

namespace meshrun::coordinator {
namespace {

Status NoKeySpace(const std::string& job_id, int attempt) {
  return AbortedError("attempt " + std::to_string(attempt) + " of job " + job_id +
                      " is not running (hint: this rank belongs to an attempt that ended or "
                      "was replaced; stop it)");
}

// The write-through of one key; a failure is logged and reported, the memory keeps the value.
Status Persist(StateDb* db, const std::string& job_id, int attempt, const std::string& key,
               const std::string& value) {
  if (db == nullptr) return OkStatus();
  Status s = db->PutStoreValue(job_id, attempt, key, value);
  if (!s.ok()) {
    spdlog::error("store {}/{}: key not persisted: {}", job_id, attempt, s.message());
    return InternalError(
        "store: the key is set but not persisted, so it would not survive a "
        "coordinator restart: " +
        s.message() + " (hint: check the coordinator's --state-dir)");
  }
  return OkStatus();
}

// A counter and the addition's request id, written together (see Persist).
Status PersistAdd(StateDb* db, const std::string& job_id, int attempt, const std::string& key,
                  int64_t value, const std::string& request_id) {
  if (db == nullptr) return OkStatus();
  Status s = db->PutStoreAdd(job_id, attempt, key, value, request_id);
  if (!s.ok()) {
    spdlog::error("store {}/{}: counter not persisted: {}", job_id, attempt, s.message());
    return InternalError(
        "store: the counter is added but not persisted, so it would not survive a "
        "coordinator restart: " +
        s.message() + " (hint: check the coordinator's --state-dir)");
  }
  return OkStatus();
}

void DropPersisted(StateDb* db, const std::string& job_id, int attempt) {
  if (db == nullptr) return;
  if (Status s = db->DeleteStoreAttempt(job_id, attempt); !s.ok()) {
    spdlog::warn("store {}/{}: old keys not deleted: {}", job_id, attempt, s.message());
  }
}

}  // namespace

Status StoreManager::RestoreAttempt(const std::string& job_id, int attempt) {
  std::vector<std::pair<std::string, std::string>> rows;
  std::vector<std::pair<std::string, int64_t>> adds;
  if (db_ != nullptr) {
    MESHRUN_ASSIGN_OR_RETURN(rows, db_->LoadStore(job_id, attempt));
    MESHRUN_ASSIGN_OR_RETURN(adds, db_->LoadStoreAdds(job_id, attempt));
  }
  std::lock_guard<std::mutex> lock(mu_);
  KeySpace space;
  for (auto& [key, value] : rows) {
    space.bytes += key.size() + value.size();
    space.values[std::move(key)] = std::move(value);
  }
  for (auto& [id, value] : adds) {
    space.bytes += id.size() + sizeof(int64_t);
    space.applied_adds[std::move(id)] = value;
  }
  auto it = spaces_.find({job_id, attempt});
  if (it != spaces_.end()) total_bytes_ -= it->second.bytes;  // no waiters yet at start-up
  total_bytes_ += space.bytes;
  spaces_[{job_id, attempt}] = std::move(space);
  return OkStatus();
}

void StoreManager::OpenAttempt(const std::string& job_id, int attempt) {
  std::vector<GetCallback> abort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropPersisted(db_, job_id, attempt);
    auto it = spaces_.find({job_id, attempt});
    if (it != spaces_.end()) {
      for (Waiter& w : it->second.waiters) {
        ForgetLocked(w);
        abort.push_back(std::move(w.done));
      }
      total_bytes_ -= it->second.bytes;
    }
    spaces_[{job_id, attempt}] = KeySpace{};
  }
  for (auto& done : abort) done(NoKeySpace(job_id, attempt));
}

void StoreManager::CloseAttempt(const std::string& job_id, int attempt) {
  std::vector<GetCallback> abort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropPersisted(db_, job_id, attempt);
    auto it = spaces_.find({job_id, attempt});
    if (it == spaces_.end()) return;
    for (Waiter& w : it->second.waiters) {
      ForgetLocked(w);
      abort.push_back(std::move(w.done));
    }
    total_bytes_ -= it->second.bytes;
    spaces_.erase(it);
  }
  for (auto& done : abort) done(NoKeySpace(job_id, attempt));
}

bool StoreManager::HasAttempt(const std::string& job_id, int attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  return spaces_.count({job_id, attempt}) > 0;
}

Status StoreManager::SetLocked(KeySpace& space, const std::string& key, std::string value,
                               std::vector<std::pair<GetCallback, std::string>>* wake) {
  if (key.size() > limits_.max_key_bytes) {
    return ResourceExhaustedError(
        "key: " + std::to_string(key.size()) + " bytes, over the store's fixed limit of " +
        std::to_string(limits_.max_key_bytes) + " (hint: use shorter keys)");
  }
  if (value.size() > limits_.max_value_bytes) {
    return ResourceExhaustedError("value: " + std::to_string(value.size()) + " bytes, over the " +
                                  std::to_string(limits_.max_value_bytes) +
                                  " of the coordinator's --max-store-value-bytes (hint: store "
                                  "less per key, or raise --max-store-value-bytes)");
  }
  auto it = space.values.find(key);
  const size_t old_bytes = it == space.values.end() ? 0 : key.size() + it->second.size();
  if (it == space.values.end() && space.values.size() >= limits_.max_keys_per_attempt) {
    return ResourceExhaustedError("store: the attempt already holds " +
                                  std::to_string(space.values.size()) +
                                  " keys, the store's fixed limit (hint: reuse keys)");
  }
  const size_t new_bytes = space.bytes - old_bytes + key.size() + value.size();
  if (new_bytes > limits_.max_bytes_per_attempt) {
    return ResourceExhaustedError(
        "store: the attempt's keys would hold " + std::to_string(new_bytes) + " bytes, over the " +
        std::to_string(limits_.max_bytes_per_attempt) +
        " of the coordinator's --max-store-bytes-per-attempt (hint: store less, or raise "
        "--max-store-bytes-per-attempt)");
  }
  const size_t new_total = total_bytes_ - space.bytes + new_bytes;
  if (new_bytes > space.bytes && new_total > limits_.max_bytes) {
    return ResourceExhaustedError(
        "store: all attempts' keys would hold " + std::to_string(new_total) + " bytes, over the " +
        std::to_string(limits_.max_bytes) +
        " of the coordinator's --max-store-bytes (hint: the coordinator runs many jobs that "
        "store a lot at once; raise --max-store-bytes, or lower --max-store-bytes-per-attempt)");
  }
  total_bytes_ = new_total;
  space.bytes = new_bytes;
  std::string& slot = space.values[key];
  slot = std::move(value);
  // Wake the waiters of this key.
  auto& ws = space.waiters;
  for (size_t i = 0; i < ws.size();) {
    if (ws[i].key == key) {
      ForgetLocked(ws[i]);
      wake->emplace_back(std::move(ws[i].done), slot);
      ws[i] = std::move(ws.back());
      ws.pop_back();
    } else {
      ++i;
    }
  }
  return OkStatus();
}

Status StoreManager::Set(const std::string& job_id, int attempt, const std::string& key,
                         std::string value) {
  std::vector<std::pair<GetCallback, std::string>> wake;
  Status persisted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spaces_.find({job_id, attempt});
    if (it == spaces_.end()) return NoKeySpace(job_id, attempt);
    MESHRUN_RETURN_IF_ERROR(SetLocked(it->second, key, value, &wake));
    persisted = Persist(db_, job_id, attempt, key, value);
  }
  for (auto& [done, v] : wake) done(std::optional<std::string>(std::move(v)));
  return persisted;
}

void StoreManager::ForgetLocked(const Waiter& waiter) {
  --waiters_;
  waiter_spaces_.erase(waiter.id);
  auto it = waiters_by_owner_.find(waiter.owner);
  if (it != waiters_by_owner_.end() && --it->second == 0) waiters_by_owner_.erase(it);
}

void StoreManager::CancelWait(uint64_t id) {
  GetCallback done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto where = waiter_spaces_.find(id);
    if (where == waiter_spaces_.end()) return;  // already woken, expired or aborted
    auto space = spaces_.find(where->second);
    if (space == spaces_.end()) return;
    auto& ws = space->second.waiters;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].id != id) continue;
      ForgetLocked(ws[i]);
      done = std::move(ws[i].done);
      ws[i] = std::move(ws.back());
      ws.pop_back();
      break;
    }
  }
  if (done) done(CancelledError("store: the wait was cancelled by the client"));
}

void StoreManager::Get(const std::string& job_id, int attempt, const std::string& key, bool wait,
                       std::chrono::milliseconds timeout, std::optional<MonoTime> call_deadline,
                       GetCallback done, const std::string& owner, CallCancellation* cancel) {
  StatusOr<std::optional<std::string>> result = std::optional<std::string>();
  uint64_t parked = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spaces_.find({job_id, attempt});
    if (it == spaces_.end()) {
      result = NoKeySpace(job_id, attempt);
    } else if (auto v = it->second.values.find(key); v != it->second.values.end()) {
      result = std::optional<std::string>(v->second);
    } else if (wait) {
      if (shut_down_) {
        result = UnavailableError("the coordinator is stopping (hint: retry with backoff)");
      } else if (waiters_ >= limits_.max_waiters) {
        result = ResourceExhaustedError(
            "--max-store-waits: " + std::to_string(waiters_) +
            " StoreGet calls are already waiting, the coordinator's limit (hint: retry with "
            "backoff, or ask the operator to raise --max-store-waits)");
      } else if (auto mine = waiters_by_owner_.find(owner);
                 mine != waiters_by_owner_.end() && mine->second >= limits_.max_waiters_per_owner) {
        result = ResourceExhaustedError(
            "--max-store-waits-per-worker: " + std::to_string(mine->second) +
            " StoreGet calls of this worker are already waiting, the coordinator's limit per "
            "worker (hint: wait for fewer keys at once, or ask the operator to raise "
            "--max-store-waits-per-worker)");
      } else {
        std::chrono::milliseconds wait_for = timeout.count() > 0 ? timeout : limits_.default_wait;
        wait_for = std::min(wait_for, limits_.max_wait);
        MonoTime deadline = clock_.Monotonic() + wait_for;
        if (call_deadline && *call_deadline < deadline) deadline = *call_deadline;
        parked = next_waiter_++;
        it->second.waiters.push_back({key, deadline, std::move(done), parked, owner});
        ++waiters_;
        ++waiters_by_owner_[owner];
        waiter_spaces_.emplace(parked, Key{job_id, attempt});
      }
    }
  }
  if (parked != 0) {
    // Outside the lock: the hook runs at once when the call is already cancelled.
    if (cancel != nullptr) cancel->OnCancel([this, parked] { CancelWait(parked); });
    return;
  }
  done(std::move(result));
}

StatusOr<int64_t> StoreManager::Add(const std::string& job_id, int attempt, const std::string& key,
                                    int64_t delta, const std::string& request_id) {
  std::vector<std::pair<GetCallback, std::string>> wake;
  Status persisted;
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spaces_.find({job_id, attempt});
    if (it == spaces_.end()) return NoKeySpace(job_id, attempt);
    if (!request_id.empty()) {
      auto applied = it->second.applied_adds.find(request_id);
      if (applied != it->second.applied_adds.end()) return applied->second;  // a retry
      if (request_id.size() > limits_.max_key_bytes) {
        return InvalidArgumentError("request_id: " + std::to_string(request_id.size()) +
                                    " bytes, over the store's limit of " +
                                    std::to_string(limits_.max_key_bytes) +
                                    " (hint: a short random id per addition is enough)");
      }
    }
    auto v = it->second.values.find(key);
    if (v != it->second.values.end()) {
      const std::string& text = v->second;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        return FailedPreconditionError("key " + key +
                                       " does not hold a decimal counter (hint: use StoreAdd "
                                       "only on keys that only StoreAdd writes)");
      }
    }
    if ((delta > 0 && value > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && value < std::numeric_limits<int64_t>::min() - delta)) {
      return OutOfRangeError("key " + key + ": adding " + std::to_string(delta) + " to " +
                             std::to_string(value) + " overflows int64");
    }
    value += delta;
    if (delta != 0 || v == it->second.values.end()) {
      MESHRUN_RETURN_IF_ERROR(SetLocked(it->second, key, std::to_string(value), &wake));
      if (request_id.empty()) {
        persisted = Persist(db_, job_id, attempt, key, std::to_string(value));
      } else {
        it->second.applied_adds[request_id] = value;
        it->second.bytes += request_id.size() + sizeof(int64_t);
        total_bytes_ += request_id.size() + sizeof(int64_t);
        persisted = PersistAdd(db_, job_id, attempt, key, value, request_id);
      }
    }
  }
  for (auto& [done, v] : wake) done(std::optional<std::string>(std::move(v)));
  if (!persisted.ok()) return persisted;
  return value;
}

void StoreManager::ExpireWaiters() {
  std::vector<GetCallback> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_ == 0) return;
    const MonoTime now = clock_.Monotonic();
    for (auto& [key, space] : spaces_) {
      auto& ws = space.waiters;
      for (size_t i = 0; i < ws.size();) {
        if (ws[i].deadline <= now) {
          ForgetLocked(ws[i]);
          expired.push_back(std::move(ws[i].done));
          ws[i] = std::move(ws.back());
          ws.pop_back();
        } else {
          ++i;
        }
      }
    }
  }
  for (auto& done : expired) {
    done(
        DeadlineExceededError("store: the key was not set before the wait ran out (hint: a "
                              "peer rank did not start or failed; check its logs)"));
  }
}

void StoreManager::Shutdown() {
  std::vector<GetCallback> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    for (auto& [key, space] : spaces_) {
      for (Waiter& w : space.waiters) all.push_back(std::move(w.done));
      space.waiters.clear();
    }
    waiters_ = 0;
    waiters_by_owner_.clear();
    waiter_spaces_.clear();
  }
  for (auto& done : all) done(UnavailableError("the coordinator is stopping (hint: retry)"));
}

size_t StoreManager::waiter_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_;
}

size_t StoreManager::waiter_count_of(const std::string& owner) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiters_by_owner_.find(owner);
  return it == waiters_by_owner_.end() ? 0 : it->second;
}

size_t StoreManager::attempt_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spaces_.size();
}

size_t StoreManager::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_bytes_;
}

}  // namespace meshrun::coordinator
