// The coordinator's durable state: one SQLite database `coordinator.db` in --state-dir (WAL
// journal). Tables: jobs (spec, YAML, state, counters), attempts, ranks (the assignment of every
// rank of every attempt), workers (registrations and session tokens) and events (the job
// events that must survive a restart: state and rank changes, checkpoints, job-level metrics).
//
// Durability: the connection runs synchronous=NORMAL; a WriteBatch committed kDurable switches
// to synchronous=FULL for its commit, so it is on disk (fsync of the WAL) before the call
// returns. Managers commit every write that answers an RPC (submit, cancel, register) and
// every job or attempt state change kDurable; high-volume rank and metrics updates commit
// kFast (they survive a crash of the process, and a later durable commit makes them
// power-safe too, as the WAL is one ordered file).
//
// Thread-safe: one connection behind a mutex. Owned by CoordinatorServer; JobManager and
// WorkerManager write through it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/parallel_dims.h"
#include "common/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace meshrun::coordinator {

// Times are milliseconds since the Unix epoch; 0: unset.
struct JobRow {
  std::string job_id;
  int64_t seq = 0;  // submission order, 1, 2, …
  std::string name;
  int state = 0;     // v1::JobState
  std::string spec;  // serialized v1::JobSpec (with source_yaml and set_overrides)
  std::string request_id;
  int attempt = 0;
  int restarts = 0;
  std::string message;
  int64_t submitted_ms = 0, started_ms = 0, finished_ms = 0;
  int world_size = 0;
  int64_t step = 0;
  double loss = 0, tokens_per_second = 0, mfu = 0;
  std::string last_checkpoint;
  int64_t seq_reserved = 0;  // event sequences up to this one may have been handed out
};

struct AttemptRow {
  std::string job_id;
  int attempt = 0;
  int state = 0;  // AttemptState of job_records.h
  int64_t started_ms = 0, ended_ms = 0;
  std::string reason;
  // Elastic jobs: the mesh the attempt ran on ("dp_shard 2 × tp 2 (world 4)"), why it was
  // chosen ("submitted", "lost worker", "grown", "drained", "capacity"), and its spec as the
  // ranks got it (empty for a fixed-world job: the jobs row's spec).
  std::string mesh, cause;
  std::string spec;
};

struct RankRow {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  std::string worker_id, worker_name;
  int local_rank = 0, local_world_size = 0;
  // Stored as the ordered list of the mesh's own axes, "pp=0,dp_replicate=1,dp_shard=0,cp=0,tp=1"
  // (schema version 2; version 1's four columns are migrated on open).
  MeshCoords coords;
  int state = 0;  // v1::RankState
  int pid = 0, exit_code = 0, signal = 0;
  std::string error;
};

struct WorkerRow {
  std::string worker_id, name, session_token;
  int slots = 0;
  std::string device, address, metrics_address, device_name, version;
  bool lost = false;
  int64_t registered_ms = 0, last_heartbeat_ms = 0;
  std::string calibration;  // serialized v1::HostCalibration of the registration ("": none)
};

// The progress columns of a job row, written by the ingest path without the rest of the row
// (which JobManager owns); seq_reserved only ever grows.
struct JobProgressRow {
  std::string job_id;
  int64_t step = 0;
  double loss = 0, tokens_per_second = 0, mfu = 0;
  int64_t seq_reserved = 0;
};

struct EventRow {
  std::string job_id;
  int64_t sequence = 0;
  std::string event;  // serialized v1::JobEvent
};

// Writes applied together or not at all. Upserts replace the row with the same key.
struct WriteBatch {
  std::vector<JobRow> jobs;
  std::vector<AttemptRow> attempts;
  std::vector<RankRow> ranks;
  std::vector<WorkerRow> workers;
  std::vector<EventRow> events;
  std::vector<JobProgressRow> progress;  // applied after `jobs`

  bool empty() const {
    return jobs.empty() && attempts.empty() && ranks.empty() && workers.empty() && events.empty() &&
           progress.empty();
  }
};

enum class Durability { kFast, kDurable };

class StateDb {
 public:
  // Opens (creating the folder, the file and the schema as needed) `<dir>/coordinator.db`.
  // FAILED_PRECONDITION when the folder cannot be created or the file is not a coordinator
  // database of a known schema version. A database of schema version 1 (ranks with one column
  // per axis) is migrated to version 2 (ranks with the ordered list of axes) in one transaction.
  static StatusOr<std::unique_ptr<StateDb>> Open(const std::string& dir);
  ~StateDb();
  StateDb(const StateDb&) = delete;
  StateDb& operator=(const StateDb&) = delete;

  Status Commit(const WriteBatch& batch, Durability durability);

  // Reads for a manager starting up.
  StatusOr<std::vector<JobRow>> LoadJobs();
  StatusOr<std::vector<AttemptRow>> LoadAttempts(const std::string& job_id);
  StatusOr<std::vector<RankRow>> LoadRanks(const std::string& job_id, int attempt);
  StatusOr<std::vector<WorkerRow>> LoadWorkers();
  // Events of one job with from ≤ sequence < to, oldest first, at most `limit`.
  StatusOr<std::vector<EventRow>> LoadEvents(const std::string& job_id, int64_t from, int64_t to,
                                             int limit);

  // The rendezvous store's keys of one attempt (StoreManager), each write its own transaction
  // (synchronous=NORMAL in WAL mode: it survives the coordinator being killed, not a power cut).
  Status PutStoreValue(const std::string& job_id, int attempt, const std::string& key,
                       const std::string& value);
  // A counter's new value and the request id of the addition that made it, in one transaction.
  Status PutStoreAdd(const std::string& job_id, int attempt, const std::string& key, int64_t value,
                     const std::string& request_id);
  Status DeleteStoreAttempt(const std::string& job_id, int attempt);
  StatusOr<std::vector<std::pair<std::string, std::string>>> LoadStore(const std::string& job_id,
                                                                       int attempt);
  // The applied additions' request ids of one attempt and the counter value each answered.
  StatusOr<std::vector<std::pair<std::string, int64_t>>> LoadStoreAdds(const std::string& job_id,
                                                                       int attempt);

  const std::string& path() const { return path_; }

 private:
  StateDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  Status Exec(const std::string& sql);
  Status AddMissingColumns();
  Status MigrateFromVersion1();
  Status CommitLocked(const WriteBatch& batch);
  // The cached prepared statement for `sql` (a string constant of state_db.cc).
  StatusOr<sqlite3_stmt*> Prepare(const char* sql);

  std::mutex mu_;
  sqlite3* db_;                                           // guarded by mu_
  std::unordered_map<const char*, sqlite3_stmt*> stmts_;  // guarded by mu_
  std::string path_;
};

}  // namespace meshrun::coordinator
