// JobJournal: persistence of the jobs and their event logs. It stamps a transaction's events,
// writes its rows and durable events through StateDb (every job state change durably) before
// publishing the events to the job's watchers, and reads back what only the database still has
// (older durable events for WatchJob, log lines for GetJobLogs after a restart). Also the
// conversions between the in-memory records and StateDb's rows.
//
// Not thread-safe: JobManager calls it under its mutex. `db` may be null (tests without
// persistence): then commits only publish.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/job_records.h"
#include "coordinator/state_db.h"

namespace meshrun::coordinator {

class JobJournal {
 public:
  // Event sequences reserved per job row write (JobRow::seq_reserved): an event past the
  // reservation rewrites the row with the next block.
  static constexpr int64_t kSequenceBlock = 4096;
  // Stored events GetJobLogs reads back at most (log lines and the durable events between them).
  static constexpr int kStoredEventsRead = 200'000;

  JobJournal(StateDb* db, const Clock& clock, EventLimits limits)
      : db_(db), clock_(clock), limits_(limits) {}

  StateDb* db() const { return db_; }

  // A new event of txn's job; Commit gives it the next sequence and the current time.
  v1::JobEvent* AddEvent(JobTxn& txn);
  // Stamps `event` (JobEventLog::Stamp); true when its sequence passed the log's reservation,
  // which then moves on by max(kSequenceBlock, block): the job row's seq_reserved must be
  // written before the event is published. Call with the log held.
  static bool StampReserving(JobEventLog& log, v1::JobEvent* event, WallTime now,
                             int64_t block = 0);
  // Writes the rows and the durable events (and the job's first EventLimits::logs log lines),
  // then publishes the events; the watchers of a job that finished are finished. On a write
  // error nothing is published.
  Status Commit(JobTxn& txn, Durability durability);
  // Writes only the job row (a PENDING job's wait message); errors are ignored.
  void WriteJobRow(JobRecord& job);
  void WriteJobRow(const JobRow& row);  // the row as given

  // Durable events of `job_id` with sequences in [from, to) from StateDb, log lines left out
  // (WatchJob replays older than the memory tier); empty without a database.
  std::vector<v1::JobEvent> StoredEvents(const std::string& job_id, uint64_t from,
                                         uint64_t to) const;
  // GetJobLogs from the lines StateDb kept, for a job whose memory tier is empty; nullopt when
  // there are none (or no database).
  std::optional<v1::GetJobLogsResponse> StoredLogs(const JobRecord& job,
                                                   const v1::GetJobLogsRequest& request) const;
  // The ranks of a finished job's attempt, read back once for GetJob.
  StatusOr<std::vector<RankRecord>> LoadRanks(const std::string& job_id, int attempt) const;

 private:
  StateDb* const db_;
  const Clock& clock_;
  const EventLimits limits_;
};

// Conversions between records and rows, and the RankInfo a client sees.
RankRow ToRankRow(const JobRecord& job, const AttemptRecord& attempt, const RankRecord& rank);
AttemptRow ToAttemptRow(const JobRecord& job, const AttemptRecord& attempt);
RankRecord RankFromRow(const RankRow& row);
// With the mesh's own axes as the ordered list RankInfo.axes (`mesh`: the job's, for the sizes).
void FillRankInfo(const RankRecord& rank, const ParallelDims& mesh, v1::RankInfo* info);

}  // namespace meshrun::coordinator
