// The event log of one job (types.proto JobEvent) and its WatchJob watchers. Events live in
// three bounded tiers: durable ones (state and rank changes, checkpoints, job-level metrics;
// JobManager also writes them to StateDb), log lines, and per-rank metrics samples. Replay
// merges the tiers by sequence number.
//
// Not thread-safe: each JobManager job owns one, guarded by JobManager's mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/streams.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

// What one WatchJob stream asked for.
struct WatchFilter {
  bool skip_logs = false;
  bool skip_metrics = false;
  bool rank_metrics = false;
  std::optional<int> log_rank;

  static WatchFilter FromRequest(const v1::WatchJobRequest& request);
  bool Matches(const v1::JobEvent& event) const;
};

struct EventLimits {
  size_t durable = 50'000;
  size_t logs = 10'000;
  size_t rank_metrics = 20'000;
  size_t max_log_line_bytes = 16 * 1024;
};

class JobEventLog {
 public:
  JobEventLog(std::string job_id, uint64_t next_sequence, EventLimits limits);

  // True for the kinds JobManager persists.
  static bool IsDurable(const v1::JobEvent& event);

  // Gives `event` the next sequence number, the job id and `now`. Separate from Publish so
  // JobManager can persist stamped events before anyone sees them.
  void Stamp(v1::JobEvent* event, WallTime now);
  // Retains a stamped event in its tier and sends it to every watcher whose filter matches;
  // watchers whose stream refuses it are forgotten.
  void Publish(const v1::JobEvent& event);

  // Sends the retained events with sequence ≥ from that match, oldest first, merged with
  // `older` (events before the retained ones, e.g. read back from StateDb). Returns false if
  // the stream refused one.
  bool Replay(uint64_t from, const WatchFilter& filter, const std::vector<v1::JobEvent>& older,
              WatchJobStream& stream) const;
  // Sequence of the oldest durable event still retained in memory (next_sequence() if none):
  // durable events before it must come from StateDb.
  uint64_t first_retained_durable() const;
  uint64_t next_sequence() const { return next_sequence_; }
  uint64_t last_sequence() const { return next_sequence_ - 1; }

  // Also forgets the watchers whose stream has finished.
  void AddWatcher(std::shared_ptr<WatchJobStream> stream, WatchFilter filter);
  // Ends every watch with `status` (OK after a terminal state; UNAVAILABLE at shutdown).
  void FinishWatchers(const Status& status);
  size_t watcher_count() const { return watchers_.size(); }

  // Drops every retained event (durable ones stay in StateDb and Replay's `older` brings them
  // back; log lines and rank samples are gone from memory: JobManager::Logs reads the lines
  // StateDb kept instead). JobManager
  // calls it for finished jobs beyond the newest kFinishedJobsWithEvents, so that memory does
  // not grow with every job the coordinator has run.
  void ReleaseRetained();
  size_t retained_count() const { return durable_.size() + logs_.size() + rank_metrics_.size(); }

  // GetJobLogs over the retained log lines.
  v1::GetJobLogsResponse Logs(std::optional<int> rank, int attempt, int tail_lines) const;

 private:
  struct Watcher {
    std::shared_ptr<WatchJobStream> stream;
    WatchFilter filter;
  };
  std::deque<v1::JobEvent>& TierOf(const v1::JobEvent& event);
  size_t LimitOf(const std::deque<v1::JobEvent>& tier) const;

  std::string job_id_;
  uint64_t next_sequence_;
  EventLimits limits_;
  std::deque<v1::JobEvent> durable_, logs_, rank_metrics_;
  bool logs_dropped_ = false;
  std::vector<Watcher> watchers_;
};

}  // namespace meshrun::coordinator
