// The event log of one job (types.proto JobEvent) and its WatchJob watchers. Events live in
// three bounded tiers: durable ones (state and rank changes, checkpoints, job-level metrics;
// JobManager also writes them to StateDb), log lines, and per-rank metrics samples. Replay
// merges the tiers by sequence number.
//
// Thread-safe: one (recursive) mutex per log, so that the ingest path (rank samples, without
// JobManager's mutex) and JobManager's commits share it; Hold() keeps the log across a commit
// (stamp, write, publish) so that events reach watchers in sequence order.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
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

// What one job may make the coordinator keep (docs/security.md "Limits"): events per memory
// tier by count and by bytes (the oldest go first), what StateDb keeps of it, and the size of
// one GetJobLogs answer. Every per-job byte is released when the job's events are.
struct EventLimits {
  size_t durable = 50'000;
  size_t logs = 10'000;
  size_t rank_metrics = 20'000;
  // A log line's text beyond this is cut (at a UTF-8 boundary) and kLogCutMarker added.
  size_t max_log_line_bytes = 16 * 1024;
  // Serialized bytes per memory tier of one job.
  size_t durable_bytes = 8 << 20;
  size_t log_bytes = 16 << 20;
  size_t rank_metrics_bytes = 16 << 20;
  // Serialized bytes StateDb keeps per job: its log lines (besides at most `logs` of them),
  // and its checkpoint and job-level metrics events (state and rank changes are always kept).
  size_t stored_log_bytes = 16 << 20;
  size_t stored_event_bytes = 64 << 20;
  // One GetJobLogs answer: the newest lines that fit, `truncated` set; far below gRPC's own
  // 4 MiB default so that every client can read it.
  size_t max_logs_response_bytes = 3 << 20;
};

// Appended to a log line cut at EventLimits::max_log_line_bytes, followed by the original
// size in bytes and "]".
inline constexpr char kLogCutMarker[] = " [meshrun: line cut, it had ";

// Of lines[begin, end), the index of the oldest line from which the rest fit in a GetJobLogs
// answer of max_bytes (lines.size() when not even the newest does).
size_t NewestThatFit(const std::vector<const v1::LogLine*>& lines, size_t begin, size_t max_bytes);

class JobEventLog {
 public:
  JobEventLog(std::string job_id, uint64_t next_sequence, EventLimits limits);

  // True for the kinds JobManager persists.
  static bool IsDurable(const v1::JobEvent& event);

  // Gives `event` the next sequence number, the job id and `now`. Separate from Publish so
  // JobManager can persist stamped events before anyone sees them.
  void Stamp(v1::JobEvent* event, WallTime now);
  // Cuts what the event carries to the limits (a log line's text to max_log_line_bytes plus
  // the marker; fields unknown to this build dropped); true when it cut a line. JobJournal calls it
  // once the event is filled in, before it is stored or published.
  bool Cut(v1::JobEvent* event) const;
  // Retains a stamped event in its tier and sends it to every watcher whose filter matches;
  // watchers whose stream refuses it are forgotten.
  void Publish(const v1::JobEvent& event);
  void Publish(v1::JobEvent&& event);
  // An event to fill with a rank's metrics sample: one the rank-sample tier let go of, with its
  // sample's strings and lists still allocated (assigning a sample into it reuses them), or a
  // new one. The ingest path's one event per rank sample otherwise cost an allocation and a
  // free of each of its parts.
  v1::JobEvent SpareRankSampleEvent();

  // Sends the retained events with sequence ≥ from that match, oldest first, merged with
  // `older` (events before the retained ones, e.g. read back from StateDb). Returns false if
  // the stream refused one.
  bool Replay(uint64_t from, const WatchFilter& filter, const std::vector<v1::JobEvent>& older,
              WatchJobStream& stream) const;
  // Sequence of the oldest durable event still retained in memory (next_sequence() if none):
  // durable events before it must come from StateDb.
  uint64_t first_retained_durable() const;
  uint64_t next_sequence() const { return next_sequence_.load(std::memory_order_acquire); }
  // Read without the log's mutex (GetJob).
  uint64_t last_sequence() const { return next_sequence() - 1; }
  // Event sequences up to this one may have been handed out (the job row's seq_reserved).
  int64_t reserved() const { return reserved_.load(std::memory_order_acquire); }
  void set_reserved(int64_t reserved) { reserved_.store(reserved, std::memory_order_release); }
  // Keeps the log to the caller (every method may still be called: the mutex is recursive).
  std::unique_lock<std::recursive_mutex> Hold() const {
    return std::unique_lock<std::recursive_mutex>(mu_);
  }

  // Also forgets the watchers whose stream has finished.
  void AddWatcher(std::shared_ptr<WatchJobStream> stream, WatchFilter filter);
  // Ends every watch with `status` (OK after a terminal state; UNAVAILABLE at shutdown).
  void FinishWatchers(const Status& status);
  size_t watcher_count() const {
    auto hold = Hold();
    return watchers_.size();
  }

  // Drops every retained event (durable ones stay in StateDb and Replay's `older` brings them
  // back; log lines and rank samples are gone from memory: JobManager::Logs reads the lines
  // StateDb kept instead). JobManager
  // calls it for finished jobs beyond the newest kFinishedJobsWithEvents, so that memory does
  // not grow with every job the coordinator has run.
  void ReleaseRetained();
  // Drops the rank samples only: JobJournal calls it when the job finishes (a finished job's
  // per-rank samples are in its Prometheus series; nothing reads them back from here).
  void ReleaseRankMetrics();
  size_t retained_count() const {
    auto hold = Hold();
    return durable_.size() + logs_.size() + rank_metrics_.size();
  }
  // Serialized bytes of the retained events (at most the three tiers' byte limits).
  size_t retained_bytes() const {
    auto hold = Hold();
    return durable_bytes_ + log_bytes_ + rank_metrics_bytes_;
  }

  // GetJobLogs over the retained log lines.
  v1::GetJobLogsResponse Logs(std::optional<int> rank, int attempt, int tail_lines) const;

 private:
  struct Watcher {
    std::shared_ptr<WatchJobStream> stream;
    WatchFilter filter;
  };
  std::deque<v1::JobEvent>& TierOf(const v1::JobEvent& event);
  size_t LimitOf(const std::deque<v1::JobEvent>& tier) const;
  size_t ByteLimitOf(const std::deque<v1::JobEvent>& tier) const;
  size_t& BytesOf(const std::deque<v1::JobEvent>& tier);

  mutable std::recursive_mutex mu_;
  std::string job_id_;
  std::atomic<uint64_t> next_sequence_;
  std::atomic<int64_t> reserved_{0};
  EventLimits limits_;
  std::deque<v1::JobEvent> durable_, logs_, rank_metrics_;
  std::vector<v1::JobEvent> spare_rank_samples_;  // evicted from rank_metrics_, at most kSpares
  static constexpr size_t kSpares = 64;
  size_t durable_bytes_ = 0, log_bytes_ = 0, rank_metrics_bytes_ = 0;  // serialized, per tier
  bool logs_dropped_ = false;
  std::vector<Watcher> watchers_;
};

}  // namespace meshrun::coordinator
