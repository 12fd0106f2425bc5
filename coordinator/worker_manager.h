// WorkerManager: worker registrations, their leases and their session streams (worker.proto).
// It owns, per worker, the registration (persisted in StateDb), the lease deadline, the one
// attached WorkerSession stream and an outbox of messages that wait while no stream is
// attached. It knows nothing of jobs: JobManager sees workers through the WorkerView interface
// and is told about lost and re-registered workers by CoordinatorService.
//
// Thread-safe (one mutex). Never calls into another manager; calls into streams (Send/Finish)
// under its lock, which never block.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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
};

// What JobManager needs of the workers: who is live, and a way to send them orders.
class WorkerView {
 public:
  virtual ~WorkerView() = default;
  // Every worker whose lease is live, ordered by name.
  virtual std::vector<LiveWorker> LiveWorkers() const = 0;
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

  std::vector<WorkerSnapshot> List() const;
  // Ends every stream with UNAVAILABLE: the coordinator is stopping.
  void Shutdown();

  std::chrono::milliseconds lease_ttl() const { return config_.lease_ttl; }
  std::chrono::milliseconds heartbeat_interval() const;

  // WorkerView.
  std::vector<LiveWorker> LiveWorkers() const override;
  void Send(const std::string& worker_id, const v1::WorkerSessionResponse& message) override;

 private:
  struct Worker {
    WorkerRow row;
    MonoTime lease_deadline;
    WallTime last_heartbeat;
    std::shared_ptr<WorkerSessionStream> stream;
    std::deque<v1::WorkerSessionResponse> outbox;
    v1::HostCalibration calibration;  // from the registration; persisted in row.calibration
    // Registered by this coordinator and no session opened since: the process is starting.
    bool awaiting_session = false;
  };

  void RenewLocked(Worker& w);
  Status PersistLocked(const Worker& w, Durability durability);

  StateDb* const db_;
  const Clock& clock_;
  const WorkerManagerConfig config_;

  mutable std::mutex mu_;
  std::map<std::string, Worker> workers_;                 // by worker_id; guarded by mu_
  std::unordered_map<std::string, std::string> by_name_;  // name -> worker_id
  std::unordered_map<const WorkerSessionStream*, std::string> streams_;  // -> worker_id
  int64_t next_worker_number_ = 1;
  bool shut_down_ = false;
};

}  // namespace meshrun::coordinator
