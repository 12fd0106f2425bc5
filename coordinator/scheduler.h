// Scheduling: which jobs wait, which workers' slots are held, and where the next attempt of a
// queued job goes. Three small parts JobManager drives under its mutex (none is thread-safe):
//
//   SlotBook         the ranks holding a slot on each worker, and the ranks a worker reports
//                    running that belong to no live attempt ("foreign");
//   JobQueue         the PENDING jobs in submission order;
//   SchedulingRound  one FIFO pass over the queue: per device, the live workers and their free
//                    slots; for each queued job a decision (wait with a message, fail, or place
//                    with placement.h), a placed job's slots taken from the round.
//
// Admission (CheckAdmission) and the dry-run answer (DescribeDryRun) judge a mesh against the
// same numbers. Placement itself is placement.h's pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/parallel_dims.h"
#include "common/status.h"
#include "coordinator/job_records.h"
#include "coordinator/placement.h"
#include "coordinator/worker_manager.h"

namespace meshrun::coordinator {

class SlotBook {
 public:
  // `ref` holds a slot on `worker` (again: no change).
  void Occupy(const std::string& worker, const RankRef& ref);
  void Release(const std::string& worker, const RankRef& ref);
  // The ranks holding slots on `worker` (a copy: callers release while iterating).
  std::set<RankRef> Holders(const std::string& worker) const;
  // Workers with at least one holder, as views into the book: valid until it changes.
  std::vector<std::string_view> WorkerIdsWithHolders() const;
  // Ranks `worker` runs that no live attempt counts; 0 forgets them.
  void SetForeign(const std::string& worker, int ranks);
  // Forgets the holders (after they were released) and the foreign ranks of `worker`.
  void ForgetHolders(const std::string& worker);
  // Slots taken on `worker`: holders plus foreign ranks.
  int Used(const std::string& worker) const;
  // Used() of every worker with any.
  std::unordered_map<std::string, int> InUse() const;

 private:
  std::unordered_map<std::string, std::set<RankRef>> holders_;
  std::unordered_map<std::string, int> foreign_;
};

class JobQueue {
 public:
  // `owner`: who submitted the job (counted by CountOf).
  void Add(int64_t seq, const std::string& job_id, const std::string& device,
           const std::string& owner = std::string());
  void Remove(int64_t seq);
  size_t size() const { return by_seq_.size(); }
  // Queued jobs of `owner`.
  size_t CountOf(const std::string& owner) const;
  bool empty() const { return by_seq_.empty(); }
  // Job ids, oldest first.
  std::vector<std::string> InOrder() const;
  // Queued jobs of `device`.
  int CountFor(const std::string& device) const;

 private:
  struct Entry {
    std::string job_id, device, owner;
  };
  std::map<int64_t, Entry> by_seq_;
  std::map<std::string, size_t> by_owner_;
};

struct ScheduleDecision {
  enum Kind { kWait, kFail, kPlace };
  Kind kind = kWait;
  // kWait: what the job waits for (its message); kFail: why it can never run here.
  std::string message;
  Placement placement;              // kPlace
  std::vector<LiveWorker> workers;  // kPlace: the workers placement's indexes name
};

class SchedulingRound {
 public:
  SchedulingRound(std::vector<LiveWorker> live, const SlotBook& slots);

  // The next queued job of the FIFO pass. `backoff` > 0 while the job waits out its restart
  // backoff. A job that cannot be placed for lack of free slots blocks the jobs of its device
  // behind it (FIFO); jobs that wait for workers or a backoff do not.
  ScheduleDecision Consider(const std::string& job_id, const std::string& device,
                            const ParallelDims& mesh, std::chrono::milliseconds backoff);

 private:
  struct Candidates {
    std::vector<LiveWorker> live;
    std::vector<PlacementWorker> placement;
    std::vector<int> slots;
    std::string blocked_by;  // FIFO: the first job of this device that did not fit
  };
  std::map<std::string, Candidates> by_device_;
};

// Submit's check of a mesh against the registered workers of `device`: FAILED_PRECONDITION
// when a tp group is larger than every worker, or (unless wait_for_capacity) when the workers
// together hold too few slots. With no such worker the job is accepted (it waits PENDING).
Status CheckAdmission(const std::vector<LiveWorker>& live, const std::string& device,
                      const ParallelDims& mesh, bool wait_for_capacity);

// Where a job of `mesh` on `device` would run now, in one line (Submit with dry_run):
// "would start now: ranks 0-1 on a, ranks 2-3 on b", or what it would wait for.
std::string DescribeDryRun(const std::vector<LiveWorker>& live, const SlotBook& slots,
                           const std::string& device, const ParallelDims& mesh, int queued_ahead);

}  // namespace meshrun::coordinator
