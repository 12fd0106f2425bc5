// WorkerManager: worker registrations, their leases and their session streams (worker.proto).
// It owns, per worker, the registration (persisted in StateDb), the lease deadline, the one
// attached WorkerSession stream and an outbox of messages that wait while no stream is
// attached. It knows nothing of jobs: JobManager sees workers through the WorkerView interface
// and is told about lost and re-registered workers by CoordinatorService.
//
// Thread-safe: one mutex over the registrations, and a second one (sessions_mu_) over the map
// from session streams to their workers' leases, which is all that Touch (every session
// message) takes: the ingest path renews leases without the mutex ListWorkers and SubmitJob
// take (decision 0049). Lock order mu_ -> sessions_mu_. Never calls into another manager;
// calls into streams (Send/Finish) under its lock, which never block.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/state_db.h"
#include "coordinator/streams.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

struct WorkerManagerConfig {
  // --heartbeat-timeout: a worker silent this long is LOST.
  std::chrono::milliseconds lease_ttl{10'000};
  // Extra time a restored worker gets, after a coordinator restart, to reopen its session:
  // its channel and its session retry with backoffs of up to 2 s each, and a lease as short as
  // its heartbeat timeout would declare LOST (and so restart) attempts whose ranks are fine.
  std::chrono::milliseconds restart_grace{10'000};
  size_t max_workers = 10'000;
  // Messages kept for a worker whose stream is broken; older ones are dropped beyond this.
  size_t max_outbox = 1 << 16;
};

// A live (not LOST) worker, as JobManager places ranks on it.
struct LiveWorker {
  std::string worker_id;
  std::string name;
  std::string device;
  int slots = 0;
  // `meshrun workers drain NAME`: takes no new ranks (decision 0056).
  bool drained = false;
};

// What JobManager needs of the workers: who is live, and a way to send them orders.
class WorkerView {
 public:
  virtual ~WorkerView() = default;
  // Every worker whose lease is live, ordered by name.
  virtual std::vector<LiveWorker> LiveWorkers() const = 0;
  // Of `ids`, those that are not a live worker (unknown, or LOST), in their order. The
  // coordinator's tick asks this of every worker holding ranks, ten times a second: no copy of
  // the live ones (at 4,096 workers LiveWorkers took 6.8 ms of the tick, under the job lock).
  virtual std::vector<std::string> NotLive(const std::vector<std::string_view>& ids) const {
    std::set<std::string, std::less<>> live;
    for (LiveWorker& w : LiveWorkers()) live.insert(std::move(w.worker_id));
    std::vector<std::string> out;
    for (std::string_view id : ids) {
      if (live.find(id) == live.end()) out.emplace_back(id);
    }
    return out;
  }
  // A number that changes whenever a worker registers, comes back or is marked LOST: the tick's
  // check of the workers holding ranks runs when it (or the jobs) changed. This default changes
  // on every call, so a view without it is checked every tick.
  virtual uint64_t RosterGeneration() const {
    static std::atomic<uint64_t> calls{0};
    return calls.fetch_add(1) + 1;
  }
  // The ids of the live workers that are drained (`meshrun workers drain`).
  virtual std::vector<std::string> DrainedWorkers() const {
    std::vector<std::string> out;
    for (LiveWorker& w : LiveWorkers()) {
      if (w.drained) out.push_back(std::move(w.worker_id));
    }
    return out;
  }
  // Sends down the worker's session, or keeps the message until a session opens. Messages to
  // an unknown or LOST worker are dropped.
  virtual void Send(const std::string& worker_id, const v1::WorkerSessionResponse& message) = 0;
};

// One worker as ListWorkers reports it (slots_in_use and READY/BUSY come from JobManager).
struct WorkerSnapshot {
  v1::WorkerInfo info;  // state LOST, or READY for every live worker
  bool has_session = false;
};

class WorkerManager final : public WorkerView {
 public:
  // `db` may be null (tests without persistence).
  WorkerManager(StateDb* db, const Clock& clock, WorkerManagerConfig config);
  ~WorkerManager() override;

  // Restores registrations from the database; every worker that was live gets a fresh lease
  // from now, so it has lease_ttl + restart_grace to reopen its session after a coordinator
  // restart.
  Status Load();

  struct Registered {
    v1::RegisterWorkerResponse response;
    // True when the name belonged to a live registration that this one replaced (the worker
    // restarted): its ranks must be confirmed by the new session or count as lost.
    bool replaced_live = false;
  };
  // RegisterWorker. Errors as in coordinator.proto: INVALID_ARGUMENT, ALREADY_EXISTS,
  // RESOURCE_EXHAUSTED; INTERNAL when the database write fails.
  StatusOr<Registered> Register(const v1::RegisterWorkerRequest& request);

  // The `open` message of a session: checks the id and token, attaches `stream` (an older
  // stream of the worker ends with ABORTED), renews the lease, sends `accepted` and then the
  // buffered messages. Returns the worker id. Errors: INVALID_ARGUMENT, NOT_FOUND (unknown or
  // LOST: register again), UNAUTHENTICATED.
  StatusOr<std::string> OpenSession(const v1::OpenSession& open,
                                    const std::shared_ptr<WorkerSessionStream>& stream);
  // Any later message on `stream`: renews the lease and returns the worker id. NOT_FOUND when
  // the worker is LOST, ABORTED when a newer stream replaced this one.
  StatusOr<std::string> Touch(const WorkerSessionStream* stream);
  // The stream ended (the worker hung up, or the adapter finished it).
  void CloseSession(const WorkerSessionStream* stream);

  // Marks every live worker whose lease ran out LOST (persisted), ends its stream with
  // NOT_FOUND, and returns their ids for JobManager.
  std::vector<std::string> ExpireLeases();

  // `meshrun workers drain/undrain NAME`: the worker's id, NOT_FOUND for an unknown name.
  // Kept in memory (a restarted coordinator forgets drains).
  StatusOr<std::string> SetDrained(const std::string& name, bool drained);

  std::vector<WorkerSnapshot> List() const;
  // At most `limit` workers whose names sort after `after` (all: ""), by name.
  std::vector<WorkerSnapshot> List(const std::string& after, size_t limit) const;
  // Holds the session lock (tests: queries must answer while the ingest path holds it).
  std::unique_lock<std::mutex> HoldSessionsForTest() const {
    return std::unique_lock<std::mutex>(sessions_mu_);
  }
  // Ends every stream with UNAVAILABLE: the coordinator is stopping.
  void Shutdown();

  std::chrono::milliseconds lease_ttl() const { return config_.lease_ttl; }
  std::chrono::milliseconds heartbeat_interval() const;

  // WorkerView.
  std::vector<LiveWorker> LiveWorkers() const override;
  std::vector<std::string> NotLive(const std::vector<std::string_view>& ids) const override;
  std::vector<std::string> DrainedWorkers() const override;
  uint64_t RosterGeneration() const override { return roster_generation_.load(); }
  void Send(const std::string& worker_id, const v1::WorkerSessionResponse& message) override;

 private:
  // What Touch renews without mu_.
  struct Lease {
    std::atomic<int64_t> deadline{0};   // MonoTime, in its clock's ticks
    std::atomic<int64_t> heartbeat{0};  // WallTime, in its clock's ticks
    std::atomic<bool> lost{false};      // mirrors row.lost
  };
  struct Worker {
    WorkerRow row;
    std::shared_ptr<Lease> lease = std::make_shared<Lease>();
    MonoTime deadline() const { return MonoTime(MonoTime::duration(lease->deadline.load())); }
    WallTime heartbeat() const { return WallTime(WallTime::duration(lease->heartbeat.load())); }
    void SetDeadline(MonoTime t) { lease->deadline.store(t.time_since_epoch().count()); }
    void SetHeartbeat(WallTime t) { lease->heartbeat.store(t.time_since_epoch().count()); }
    std::shared_ptr<WorkerSessionStream> stream;
    std::deque<v1::WorkerSessionResponse> outbox;
    v1::HostCalibration calibration;  // from the registration; persisted in row.calibration
    bool drained = false;             // SetDrained; in memory only
    // Registered by this coordinator and no session opened since: the process is starting.
    bool awaiting_session = false;
  };

  void RenewLocked(Worker& w);
  Status PersistLocked(const Worker& w, Durability durability);

  StateDb* const db_;
  const Clock& clock_;
  const WorkerManagerConfig config_;

  mutable std::mutex mu_;
  std::map<std::string, Worker, std::less<>> workers_;  // by worker_id; guarded by mu_
  std::atomic<uint64_t> roster_generation_{1};          // RosterGeneration: bumped under mu_
  std::atomic<int> drained_count_{0};           // workers with `drained` set; changed under mu_
  std::map<std::string, std::string> by_name_;  // name -> worker_id
  struct Session {
    std::string worker_id;
    std::shared_ptr<Lease> lease;
  };
  mutable std::mutex sessions_mu_;
  // Written under mu_ and sessions_mu_; Touch reads it under sessions_mu_ only.
  std::unordered_map<const WorkerSessionStream*, Session> streams_;
  int64_t next_worker_number_ = 1;
  bool shut_down_ = false;
};

}  // namespace meshrun::coordinator
