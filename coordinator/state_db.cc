// StateDb on SQLite: schema, batched upserts and the start-up reads. Statements are prepared
// once per connection and reused.
#include "coordinator/state_db.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "proto/mesh_axis.h"

namespace meshrun::coordinator {
namespace {

// 1: ranks with one column per axis (dp_replicate, dp_shard, cp, tp); 2: ranks with `coords`,
// the ordered list of the mesh's own axes (pp first), migrated from 1 on open.
constexpr int kSchemaVersion = 2;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, name TEXT NOT NULL,
  state INTEGER NOT NULL, spec BLOB NOT NULL, resolved_yaml TEXT NOT NULL,
  request_id TEXT NOT NULL, attempt INTEGER NOT NULL, restarts INTEGER NOT NULL,
  message TEXT NOT NULL, submitted_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL,
  finished_ms INTEGER NOT NULL, world_size INTEGER NOT NULL, step INTEGER NOT NULL,
  loss REAL NOT NULL, tokens_per_second REAL NOT NULL, mfu REAL NOT NULL,
  last_checkpoint TEXT NOT NULL, seq_reserved INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS attempts(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, state INTEGER NOT NULL,
  started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt));
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  worker_id TEXT NOT NULL, worker_name TEXT NOT NULL, local_rank INTEGER NOT NULL,
  local_world_size INTEGER NOT NULL, coords TEXT NOT NULL, state INTEGER NOT NULL,
  pid INTEGER NOT NULL, exit_code INTEGER NOT NULL, signal INTEGER NOT NULL, error TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt, rank));
CREATE TABLE IF NOT EXISTS workers(
  worker_id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, session_token TEXT NOT NULL,
  slots INTEGER NOT NULL, device TEXT NOT NULL, address TEXT NOT NULL,
  metrics_address TEXT NOT NULL, device_name TEXT NOT NULL, version TEXT NOT NULL,
  lost INTEGER NOT NULL, registered_ms INTEGER NOT NULL, last_heartbeat_ms INTEGER NOT NULL,
  calibration BLOB NOT NULL DEFAULT x'');
CREATE TABLE IF NOT EXISTS events(
  job_id TEXT NOT NULL, sequence INTEGER NOT NULL, event BLOB NOT NULL,
  PRIMARY KEY(job_id, sequence));
CREATE TABLE IF NOT EXISTS store(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY(job_id, attempt, key));
CREATE TABLE IF NOT EXISTS store_adds(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, request_id BLOB NOT NULL,
  value INTEGER NOT NULL, PRIMARY KEY(job_id, attempt, request_id));
)sql";

Status SqlError(sqlite3* db, const std::string& what) {
  return InternalError("state database: " + what + ": " + sqlite3_errmsg(db));
}

// A rank's coordinates as stored: the mesh's own axes, outermost first, "pp=0,dp_replicate=1,
// dp_shard=0,cp=0,tp=1" (an axis added later is one more pair, not one more column).
std::string CoordsText(const MeshCoords& c) {
  std::string out;
  for (MeshAxis axis : kMeshOwnAxes) {
    if (!out.empty()) out += ',';
    out += MeshAxisName(axis);
    out += '=';
    out += std::to_string(CoordOn(c, axis));
  }
  return out;
}

// The inverse of CoordsText; an axis left out is 0 (a row written before it existed).
StatusOr<MeshCoords> ParseCoordsText(const std::string& text) {
  MeshCoords c;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string pair = text.substr(begin, end - begin);
    const size_t eq = pair.find('=');
    const std::optional<MeshAxis> axis =
        eq == std::string::npos ? std::nullopt : MeshAxisFromName(pair.substr(0, eq));
    int value = -1;
    if (axis && !IsFlattenedAxis(*axis) && eq + 1 < pair.size() && pair.size() - eq - 1 <= 9 &&
        pair.find_first_not_of("0123456789", eq + 1) == std::string::npos) {
      value = std::stoi(pair.substr(eq + 1));
    }
    if (value < 0) {
      return InternalError("state database: rank coordinates '" + text +
                           "' are not AXIS=N pairs of the mesh's axes");
    }
    SetCoordOn(c, *axis, value);
    begin = end + 1;
  }
  return c;
}

// A prepared statement bound and stepped by position. Reset on destruction so the cached
// statement can be reused.
class Stmt {
 public:
  explicit Stmt(sqlite3_stmt* s) : s_(s) {}
  ~Stmt() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // Without a copy: `v` must outlive the statement's step (CommitLocked's batch does).
  Stmt& BindKept(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  Stmt& BindKeptBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  double Real(int col) const { return sqlite3_column_double(s_, col); }
  std::string Text(int col) const {
    const void* p = sqlite3_column_blob(s_, col);
    const int n = sqlite3_column_bytes(s_, col);
    return p ? std::string(static_cast<const char*>(p), n) : std::string();
  }

 private:
  sqlite3_stmt* s_;
};

constexpr const char* kUpsertJob =
    "INSERT OR REPLACE INTO jobs(job_id, seq, name, state, spec, resolved_yaml, request_id, "
    "attempt, restarts, message, submitted_ms, started_ms, finished_ms, world_size, step, loss, "
    "tokens_per_second, mfu, last_checkpoint, seq_reserved) "
    "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20)";
constexpr const char* kUpsertAttempt =
    "INSERT OR REPLACE INTO attempts(job_id, attempt, state, started_ms, ended_ms, reason, "
    "mesh, cause, spec) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)";
constexpr const char* kUpsertRank =
    "INSERT OR REPLACE INTO ranks(job_id, attempt, rank, worker_id, worker_name, local_rank, "
    "local_world_size, coords, state, pid, exit_code, signal, error) "
    "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)";
// kUpsertRank for `rows` rows in one statement (13 parameters a row).
constexpr size_t kRankColumns = 13;
constexpr size_t kRanksPerInsert = 32;
std::string UpsertRanksSql(size_t rows) {
  std::string sql(kUpsertRank, std::string_view(kUpsertRank).find("VALUES"));
  sql += "VALUES";
  for (size_t r = 0; r < rows; ++r) {
    sql += r == 0 ? "(" : ",(";
    for (size_t c = 0; c < kRankColumns; ++c) {
      if (c > 0) sql += ",";
      sql += "?" + std::to_string(r * kRankColumns + c + 1);
    }
    sql += ")";
  }
  return sql;
}
constexpr const char* kUpsertWorker =
    "INSERT OR REPLACE INTO workers(worker_id, name, session_token, slots, device, address, "
    "metrics_address, device_name, version, lost, registered_ms, last_heartbeat_ms, "
    "calibration) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)";
constexpr const char* kUpdateProgress =
    "UPDATE jobs SET step = ?2, loss = ?3, tokens_per_second = ?4, mfu = ?5, "
    "seq_reserved = MAX(seq_reserved, ?6) WHERE job_id = ?1";
constexpr const char* kInsertEvent =
    "INSERT OR REPLACE INTO events(job_id, sequence, event) VALUES(?1,?2,?3)";

constexpr const char* kUpsertStoreValue =
    "INSERT OR REPLACE INTO store(job_id, attempt, key, value) VALUES(?1,?2,?3,?4)";
constexpr const char* kDeleteStoreAttempt = "DELETE FROM store WHERE job_id = ?1 AND attempt = ?2";
constexpr const char* kSelectStore =
    "SELECT key, value FROM store WHERE job_id = ?1 AND attempt = ?2";
constexpr const char* kInsertStoreAdd =
    "INSERT OR REPLACE INTO store_adds(job_id, attempt, request_id, value) VALUES(?1,?2,?3,?4)";
constexpr const char* kDeleteStoreAdds =
    "DELETE FROM store_adds WHERE job_id = ?1 AND attempt = ?2";
constexpr const char* kSelectStoreAdds =
    "SELECT request_id, value FROM store_adds WHERE job_id = ?1 AND attempt = ?2";

constexpr const char* kSelectJobs =
    "SELECT job_id, seq, name, state, spec, resolved_yaml, request_id, attempt, restarts, "
    "message, submitted_ms, started_ms, finished_ms, world_size, step, loss, tokens_per_second, "
    "mfu, last_checkpoint, seq_reserved FROM jobs ORDER BY seq";
constexpr const char* kSelectAttempts =
    "SELECT job_id, attempt, state, started_ms, ended_ms, reason, mesh, cause, spec FROM attempts "
    "WHERE job_id = ?1 ORDER BY attempt";
constexpr const char* kSelectRanks =
    "SELECT job_id, attempt, rank, worker_id, worker_name, local_rank, local_world_size, "
    "coords, state, pid, exit_code, signal, error FROM ranks "
    "WHERE job_id = ?1 AND attempt = ?2 ORDER BY rank";
constexpr const char* kSelectWorkers =
    "SELECT worker_id, name, session_token, slots, device, address, metrics_address, "
    "device_name, version, lost, registered_ms, last_heartbeat_ms, calibration FROM workers "
    "ORDER BY name";
constexpr const char* kSelectEvents =
    "SELECT job_id, sequence, event FROM events WHERE job_id = ?1 AND sequence >= ?2 AND "
    "sequence < ?3 ORDER BY sequence LIMIT ?4";

}  // namespace

StatusOr<std::unique_ptr<StateDb>> StateDb::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return FailedPreconditionError("--state-dir: cannot create " + dir + ": " + ec.message() +
                                   " (hint: choose a writable folder)");
  }
  const std::string path = (std::filesystem::path(dir) / "coordinator.db").string();
  // The database holds worker session tokens and job specs: owner-only, whatever the umask.
  // Created here (SQLite would use 0644 & ~umask), and tightened if an older coordinator
  // created it; SQLite gives its -wal and -shm files the database file's mode.
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || ::fchmod(fd, 0600) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return FailedPreconditionError("--state-dir: cannot create " + path + " owner-only: " + why +
                                     " (hint: choose a folder this user owns)");
    }
    ::close(fd);
    for (const char* suffix : {"-wal", "-shm"}) {
      const std::string extra = path + suffix;
      if (::chmod(extra.c_str(), 0600) != 0 && errno != ENOENT) {
        spdlog::warn("--state-dir: cannot make {} owner-only: {}", extra, std::strerror(errno));
      }
    }
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return FailedPreconditionError("--state-dir: cannot open " + path + ": " + msg +
                                   " (hint: choose a writable folder)");
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<StateDb> state(new StateDb(db, path));
  // A page cache that holds a 32,768-rank placement's transaction (~2.6 MB of rows and index),
  // so that it does not spill pages to the WAL before its commit (decision 0058).
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                             "PRAGMA foreign_keys=OFF", "PRAGMA cache_size=-16384"}) {
    Status s = state->Exec(pragma);
    if (!s.ok()) {
      return FailedPreconditionError("--state-dir: " + path + " is not usable: " + s.message() +
                                     " (hint: move the file away or choose another folder)");
    }
  }
  MESHRUN_RETURN_IF_ERROR(state->Exec(kSchema));
  MESHRUN_RETURN_IF_ERROR(state->AddMissingColumns());
  // Schema version: written on creation, migrated from 1, checked on every open.
  std::optional<std::string> version;
  {
    static constexpr const char* kVersion = "SELECT value FROM meta WHERE key = 'schema_version'";
    auto stmt = state->Prepare(kVersion);
    if (!stmt.ok()) return stmt.status();
    Stmt q(*stmt);
    if (q.Step() == SQLITE_ROW) version = q.Text(0);
  }
  if (version == "1") {
    MESHRUN_RETURN_IF_ERROR(state->MigrateFromVersion1());
    version = std::to_string(kSchemaVersion);
  }
  if (!version) {
    MESHRUN_RETURN_IF_ERROR(state->Exec("INSERT INTO meta(key, value) VALUES('schema_version', '" +
                                        std::to_string(kSchemaVersion) + "')"));
  } else if (*version != std::to_string(kSchemaVersion)) {
    return FailedPreconditionError("--state-dir: " + path + " has schema version " + *version +
                                   ", this coordinator reads " + std::to_string(kSchemaVersion) +
                                   " (and migrates 1) (hint: use the matching "
                                   "meshrun-coordinator, or a new --state-dir)");
  }
  return state;
}

// Version 1 stored a rank's coordinates in four columns (dp_replicate, dp_shard, cp, tp); version 2
// stores the ordered list of the mesh's own axes in one (`coords`, pp first: a version-1 rank is
// at pp 0). SQLite cannot change a column in place, so the table is copied into the new shape,
// the old one dropped and the copy renamed, and the version written, in one transaction: a crash
// leaves either database whole.
Status StateDb::MigrateFromVersion1() {
  spdlog::info("state database {}: migrating from schema version 1 to {}", path_, kSchemaVersion);
  static constexpr const char* kMigrate = R"sql(
BEGIN IMMEDIATE;
CREATE TABLE ranks_v2(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  worker_id TEXT NOT NULL, worker_name TEXT NOT NULL, local_rank INTEGER NOT NULL,
  local_world_size INTEGER NOT NULL, coords TEXT NOT NULL, state INTEGER NOT NULL,
  pid INTEGER NOT NULL, exit_code INTEGER NOT NULL, signal INTEGER NOT NULL, error TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt, rank));
INSERT INTO ranks_v2 SELECT job_id, attempt, rank, worker_id, worker_name, local_rank,
  local_world_size, 'pp=0,dp_replicate=' || dp_replicate || ',dp_shard=' || dp_shard || ',cp=' ||
  cp || ',tp=' || tp, state, pid, exit_code, signal, error FROM ranks;
DROP TABLE ranks;
ALTER TABLE ranks_v2 RENAME TO ranks;
UPDATE meta SET value = '2' WHERE key = 'schema_version';
COMMIT;
)sql";
  Status s = Exec(kMigrate);
  if (!s.ok()) {
    (void)Exec("ROLLBACK");
    return FailedPreconditionError("--state-dir: " + path_ +
                                   " could not be migrated from schema version 1: " + s.message() +
                                   " (hint: keep a copy of the folder and report it; a new "
                                   "--state-dir starts empty)");
  }
  return OkStatus();
}

// Columns added after schema version 1 was first written (additive, so the version stays: an
// older coordinator's statements name their columns and leave these at their defaults).
Status StateDb::AddMissingColumns() {
  struct Added {
    const char* table;
    const char* column;
    const char* definition;
  };
  static constexpr Added kAdded[] = {
      {"workers", "calibration", "BLOB NOT NULL DEFAULT x''"},  // the worker's HostCalibration
      // An elastic job's attempt: its mesh, why, and its spec (decision 0056).
      {"attempts", "mesh", "TEXT NOT NULL DEFAULT ''"},
      {"attempts", "cause", "TEXT NOT NULL DEFAULT ''"},
      {"attempts", "spec", "BLOB NOT NULL DEFAULT x''"},
  };
  for (const Added& a : kAdded) {
    sqlite3_stmt* info = nullptr;
    const std::string sql = std::string("PRAGMA table_info(") + a.table + ")";
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &info, nullptr) != SQLITE_OK) {
      return SqlError(db_, sql);
    }
    bool present = false;
    while (sqlite3_step(info) == SQLITE_ROW) {
      const unsigned char* name = sqlite3_column_text(info, 1);
      if (name != nullptr && std::string(reinterpret_cast<const char*>(name)) == a.column) {
        present = true;
      }
    }
    sqlite3_finalize(info);
    if (!present) {
      MESHRUN_RETURN_IF_ERROR(Exec(std::string("ALTER TABLE ") + a.table + " ADD COLUMN " +
                                   a.column + " " + a.definition));
    }
  }
  return OkStatus();
}

StatusOr<sqlite3_stmt*> StateDb::Prepare(const char* sql) {
  auto it = stmts_.find(sql);
  if (it != stmts_.end()) return it->second;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, std::string("prepare ") + sql);
  }
  stmts_[sql] = stmt;
  return stmt;
}

StateDb::~StateDb() {
  for (auto& [sql, stmt] : stmts_) sqlite3_finalize(stmt);
  // Folds the WAL back into the main file so a stopped coordinator leaves one file behind.
  sqlite3_exec(db_, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
  sqlite3_close(db_);
}

Status StateDb::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return InternalError("state database: " + msg);
  }
  return OkStatus();
}

Status StateDb::Commit(const WriteBatch& batch, Durability durability) {
  if (batch.empty()) return OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  const bool durable = durability == Durability::kDurable;
  if (durable) MESHRUN_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL"));
  MESHRUN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  Status status = CommitLocked(batch);
  if (status.ok()) {
    status = Exec("COMMIT");
  }
  if (!status.ok()) (void)Exec("ROLLBACK");
  if (durable) (void)Exec("PRAGMA synchronous=NORMAL");
  return status;
}

Status StateDb::CommitLocked(const WriteBatch& b) {
  for (const JobRow& j : b.jobs) {
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpsertJob));
    Stmt q(s);
    q.Bind(1, j.job_id).Bind(2, j.seq).Bind(3, j.name).Bind(4, j.state).BindBlob(5, j.spec);
    // resolved_yaml: a copy of the spec that nothing read; schema version 1 keeps the column,
    // written empty (the spec is `spec`, the one stored copy; decision 0048).
    q.Bind(6, std::string()).Bind(7, j.request_id).Bind(8, j.attempt).Bind(9, j.restarts);
    q.Bind(10, j.message).Bind(11, j.submitted_ms).Bind(12, j.started_ms).Bind(13, j.finished_ms);
    q.Bind(14, j.world_size).Bind(15, j.step).Bind(16, j.loss).Bind(17, j.tokens_per_second);
    q.Bind(18, j.mfu).Bind(19, j.last_checkpoint).Bind(20, j.seq_reserved);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "write job " + j.job_id);
  }
  for (const AttemptRow& a : b.attempts) {
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpsertAttempt));
    Stmt q(s);
    q.Bind(1, a.job_id).Bind(2, a.attempt).Bind(3, a.state).Bind(4, a.started_ms);
    q.Bind(5, a.ended_ms).Bind(6, a.reason).Bind(7, a.mesh).Bind(8, a.cause).BindBlob(9, a.spec);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "write attempt of " + a.job_id);
  }
  // A placement writes one row per rank: kRanksPerInsert rows per statement step (decision
  // 0058), the rest one at a time. The batch outlives each step: no copies of its strings.
  auto bind_rank = [](Stmt& q, int at, const RankRow& r) {
    q.BindKept(at + 1, r.job_id).Bind(at + 2, r.attempt).Bind(at + 3, r.rank);
    q.BindKept(at + 4, r.worker_id).BindKept(at + 5, r.worker_name).Bind(at + 6, r.local_rank);
    q.Bind(at + 7, r.local_world_size).Bind(at + 8, CoordsText(r.coords));
    q.Bind(at + 9, r.state).Bind(at + 10, r.pid).Bind(at + 11, r.exit_code);
    q.Bind(at + 12, r.signal).BindKept(at + 13, r.error);
  };
  size_t next = 0;
  if (b.ranks.size() >= kRanksPerInsert) {
    static const std::string many = UpsertRanksSql(kRanksPerInsert);
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(many.c_str()));
    for (; next + kRanksPerInsert <= b.ranks.size(); next += kRanksPerInsert) {
      Stmt q(s);
      for (size_t i = 0; i < kRanksPerInsert; ++i) {
        bind_rank(q, static_cast<int>(i * kRankColumns), b.ranks[next + i]);
      }
      if (q.Step() != SQLITE_DONE) return SqlError(db_, "write ranks of " + b.ranks[next].job_id);
    }
  }
  for (; next < b.ranks.size(); ++next) {
    const RankRow& r = b.ranks[next];
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpsertRank));
    Stmt q(s);
    bind_rank(q, 0, r);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "write rank of " + r.job_id);
  }
  for (const WorkerRow& w : b.workers) {
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpsertWorker));
    Stmt q(s);
    q.Bind(1, w.worker_id).Bind(2, w.name).Bind(3, w.session_token).Bind(4, w.slots);
    q.Bind(5, w.device).Bind(6, w.address).Bind(7, w.metrics_address).Bind(8, w.device_name);
    q.Bind(9, w.version).Bind(10, w.lost ? 1 : 0).Bind(11, w.registered_ms);
    q.Bind(12, w.last_heartbeat_ms).BindBlob(13, w.calibration);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "write worker " + w.name);
  }
  for (const EventRow& e : b.events) {
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kInsertEvent));
    Stmt q(s);
    q.BindKept(1, e.job_id).Bind(2, e.sequence).BindKeptBlob(3, e.event);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "write event of " + e.job_id);
  }
  for (const JobProgressRow& p : b.progress) {
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpdateProgress));
    Stmt q(s);
    q.Bind(1, p.job_id).Bind(2, p.step).Bind(3, p.loss).Bind(4, p.tokens_per_second);
    q.Bind(5, p.mfu).Bind(6, p.seq_reserved);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "write the progress of " + p.job_id);
  }
  return OkStatus();
}

StatusOr<std::vector<JobRow>> StateDb::LoadJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectJobs));
  Stmt q(s);
  std::vector<JobRow> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    JobRow j;
    j.job_id = q.Text(0);
    j.seq = q.Int(1);
    j.name = q.Text(2);
    j.state = static_cast<int>(q.Int(3));
    j.spec = q.Text(4);
    j.request_id = q.Text(6);
    j.attempt = static_cast<int>(q.Int(7));
    j.restarts = static_cast<int>(q.Int(8));
    j.message = q.Text(9);
    j.submitted_ms = q.Int(10);
    j.started_ms = q.Int(11);
    j.finished_ms = q.Int(12);
    j.world_size = static_cast<int>(q.Int(13));
    j.step = q.Int(14);
    j.loss = q.Real(15);
    j.tokens_per_second = q.Real(16);
    j.mfu = q.Real(17);
    j.last_checkpoint = q.Text(18);
    j.seq_reserved = q.Int(19);
    out.push_back(std::move(j));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "read jobs");
  return out;
}

StatusOr<std::vector<AttemptRow>> StateDb::LoadAttempts(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectAttempts));
  Stmt q(s);
  q.Bind(1, job_id);
  std::vector<AttemptRow> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    AttemptRow a;
    a.job_id = q.Text(0);
    a.attempt = static_cast<int>(q.Int(1));
    a.state = static_cast<int>(q.Int(2));
    a.started_ms = q.Int(3);
    a.ended_ms = q.Int(4);
    a.reason = q.Text(5);
    a.mesh = q.Text(6);
    a.cause = q.Text(7);
    a.spec = q.Text(8);  // the bytes of a blob
    out.push_back(std::move(a));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "read attempts");
  return out;
}

StatusOr<std::vector<RankRow>> StateDb::LoadRanks(const std::string& job_id, int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectRanks));
  Stmt q(s);
  q.Bind(1, job_id).Bind(2, attempt);
  std::vector<RankRow> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    RankRow r;
    r.job_id = q.Text(0);
    r.attempt = static_cast<int>(q.Int(1));
    r.rank = static_cast<int>(q.Int(2));
    r.worker_id = q.Text(3);
    r.worker_name = q.Text(4);
    r.local_rank = static_cast<int>(q.Int(5));
    r.local_world_size = static_cast<int>(q.Int(6));
    StatusOr<MeshCoords> coords = ParseCoordsText(q.Text(7));
    if (!coords.ok()) {
      return InternalError(coords.status().message() + " (rank " + std::to_string(r.rank) + " of " +
                           r.job_id + ")");
    }
    r.coords = *coords;
    r.state = static_cast<int>(q.Int(8));
    r.pid = static_cast<int>(q.Int(9));
    r.exit_code = static_cast<int>(q.Int(10));
    r.signal = static_cast<int>(q.Int(11));
    r.error = q.Text(12);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "read ranks");
  return out;
}

StatusOr<std::vector<WorkerRow>> StateDb::LoadWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectWorkers));
  Stmt q(s);
  std::vector<WorkerRow> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    WorkerRow w;
    w.worker_id = q.Text(0);
    w.name = q.Text(1);
    w.session_token = q.Text(2);
    w.slots = static_cast<int>(q.Int(3));
    w.device = q.Text(4);
    w.address = q.Text(5);
    w.metrics_address = q.Text(6);
    w.device_name = q.Text(7);
    w.version = q.Text(8);
    w.lost = q.Int(9) != 0;
    w.registered_ms = q.Int(10);
    w.last_heartbeat_ms = q.Int(11);
    w.calibration = q.Text(12);
    out.push_back(std::move(w));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "read workers");
  return out;
}

StatusOr<std::vector<EventRow>> StateDb::LoadEvents(const std::string& job_id, int64_t from,
                                                    int64_t to, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectEvents));
  Stmt q(s);
  q.Bind(1, job_id).Bind(2, from).Bind(3, to).Bind(4, limit);
  std::vector<EventRow> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out.push_back({q.Text(0), q.Int(1), q.Text(2)});
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "read events");
  return out;
}

Status StateDb::PutStoreValue(const std::string& job_id, int attempt, const std::string& key,
                              const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpsertStoreValue));
  Stmt q(s);
  q.Bind(1, job_id).Bind(2, attempt).BindBlob(3, key).BindBlob(4, value);
  if (q.Step() != SQLITE_DONE) return SqlError(db_, "write a store key of " + job_id);
  return OkStatus();
}

Status StateDb::PutStoreAdd(const std::string& job_id, int attempt, const std::string& key,
                            int64_t value, const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  Status status = [&]() -> Status {
    {
      MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kUpsertStoreValue));
      Stmt q(s);
      q.Bind(1, job_id).Bind(2, attempt).BindBlob(3, key).BindBlob(4, std::to_string(value));
      if (q.Step() != SQLITE_DONE) return SqlError(db_, "write a store counter of " + job_id);
    }
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kInsertStoreAdd));
    Stmt q(s);
    q.Bind(1, job_id).Bind(2, attempt).BindBlob(3, request_id).Bind(4, value);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "record a store addition of " + job_id);
    return OkStatus();
  }();
  if (status.ok()) status = Exec("COMMIT");
  if (!status.ok()) (void)Exec("ROLLBACK");
  return status;
}

Status StateDb::DeleteStoreAttempt(const std::string& job_id, int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const char* sql : {kDeleteStoreAttempt, kDeleteStoreAdds}) {
    MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(sql));
    Stmt q(s);
    q.Bind(1, job_id).Bind(2, attempt);
    if (q.Step() != SQLITE_DONE) return SqlError(db_, "drop the store keys of " + job_id);
  }
  return OkStatus();
}

StatusOr<std::vector<std::pair<std::string, int64_t>>> StateDb::LoadStoreAdds(
    const std::string& job_id, int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectStoreAdds));
  Stmt q(s);
  q.Bind(1, job_id).Bind(2, attempt);
  std::vector<std::pair<std::string, int64_t>> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out.emplace_back(q.Text(0), q.Int(1));
  if (rc != SQLITE_DONE) return SqlError(db_, "read the store additions of " + job_id);
  return out;
}

StatusOr<std::vector<std::pair<std::string, std::string>>> StateDb::LoadStore(
    const std::string& job_id, int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  MESHRUN_ASSIGN_OR_RETURN(sqlite3_stmt * s, Prepare(kSelectStore));
  Stmt q(s);
  q.Bind(1, job_id).Bind(2, attempt);
  std::vector<std::pair<std::string, std::string>> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out.emplace_back(q.Text(0), q.Text(1));
  if (rc != SQLITE_DONE) return SqlError(db_, "read the store keys of " + job_id);
  return out;
}

}  // namespace meshrun::coordinator
