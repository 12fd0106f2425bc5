// JobEventLog: sequence numbers, the three retention tiers, replay and fan-out to watchers.
#include "coordinator/job_events.h"

#include <algorithm>

#include "common/escape.h"
#include "coordinator/proto_time.h"

namespace meshrun::coordinator {

WatchFilter WatchFilter::FromRequest(const v1::WatchJobRequest& r) {
  WatchFilter f;
  f.skip_logs = r.skip_logs();
  f.skip_metrics = r.skip_metrics();
  f.rank_metrics = r.rank_metrics();
  if (r.has_log_rank()) f.log_rank = r.log_rank();
  return f;
}

bool WatchFilter::Matches(const v1::JobEvent& e) const {
  switch (e.kind_case()) {
    case v1::JobEvent::kLog: return !skip_logs && (!log_rank || e.log().rank() == *log_rank);
    case v1::JobEvent::kMetrics:
      if (skip_metrics) return false;
      return !e.metrics().has_rank() || rank_metrics;
    default: return true;
  }
}

JobEventLog::JobEventLog(std::string job_id, uint64_t next_sequence, EventLimits limits)
    : job_id_(std::move(job_id)),
      next_sequence_(std::max<uint64_t>(1, next_sequence)),
      limits_(limits) {}

bool JobEventLog::IsDurable(const v1::JobEvent& e) {
  switch (e.kind_case()) {
    case v1::JobEvent::kLog: return false;
    case v1::JobEvent::kMetrics: return !e.metrics().has_rank();
    default: return true;
  }
}

std::deque<v1::JobEvent>& JobEventLog::TierOf(const v1::JobEvent& e) {
  if (e.kind_case() == v1::JobEvent::kLog) return logs_;
  if (e.kind_case() == v1::JobEvent::kMetrics && e.metrics().has_rank()) return rank_metrics_;
  return durable_;
}

size_t JobEventLog::LimitOf(const std::deque<v1::JobEvent>& tier) const {
  if (&tier == &logs_) return limits_.logs;
  if (&tier == &rank_metrics_) return limits_.rank_metrics;
  return limits_.durable;
}

void JobEventLog::Stamp(v1::JobEvent* event, WallTime now) {
  event->set_sequence(next_sequence_++);
  event->set_job_id(job_id_);
  SetTimestamp(now, event->mutable_time());
  if (event->kind_case() == v1::JobEvent::kLog &&
      event->log().text().size() > limits_.max_log_line_bytes) {
    // Cut between characters: a proto3 string must stay UTF-8 for clients to parse it.
    event->mutable_log()->mutable_text()->resize(
        CutUtf8(event->log().text(), limits_.max_log_line_bytes).size());
  }
}

void JobEventLog::Publish(const v1::JobEvent& event) {
  std::deque<v1::JobEvent>& tier = TierOf(event);
  tier.push_back(event);
  while (tier.size() > LimitOf(tier)) {
    if (&tier == &logs_) logs_dropped_ = true;
    tier.pop_front();
  }
  if (watchers_.empty()) return;
  v1::WatchJobResponse response;
  *response.mutable_event() = event;
  std::erase_if(watchers_, [&](const Watcher& w) {
    return w.filter.Matches(event) && !w.stream->Send(response);
  });
}

uint64_t JobEventLog::first_retained_durable() const {
  return durable_.empty() ? next_sequence_ : durable_.front().sequence();
}

bool JobEventLog::Replay(uint64_t from, const WatchFilter& filter,
                         const std::vector<v1::JobEvent>& older, WatchJobStream& stream) const {
  std::vector<const v1::JobEvent*> events;
  auto collect = [&](const auto& events_in) {
    for (const v1::JobEvent& e : events_in) {
      if (e.sequence() >= from && filter.Matches(e)) events.push_back(&e);
    }
  };
  collect(older);
  collect(durable_);
  collect(logs_);
  collect(rank_metrics_);
  std::sort(events.begin(), events.end(), [](const v1::JobEvent* a, const v1::JobEvent* b) {
    return a->sequence() < b->sequence();
  });
  v1::WatchJobResponse response;
  for (const v1::JobEvent* e : events) {
    *response.mutable_event() = *e;
    if (!stream.Send(response)) return false;
  }
  return true;
}

void JobEventLog::ReleaseRetained() {
  if (!logs_.empty()) logs_dropped_ = true;
  durable_ = {};
  logs_ = {};
  rank_metrics_ = {};
}

void JobEventLog::AddWatcher(std::shared_ptr<WatchJobStream> stream, WatchFilter filter) {
  watchers_.push_back({std::move(stream), filter});
}

void JobEventLog::FinishWatchers(const Status& status) {
  for (Watcher& w : watchers_) w.stream->Finish(status);
  watchers_.clear();
}

v1::GetJobLogsResponse JobEventLog::Logs(std::optional<int> rank, int attempt,
                                         int tail_lines) const {
  v1::GetJobLogsResponse out;
  std::vector<const v1::LogLine*> lines;
  for (const v1::JobEvent& e : logs_) {
    const v1::LogLine& line = e.log();
    if (rank && line.rank() != *rank) continue;
    if (attempt > 0 && line.attempt() != attempt) continue;
    lines.push_back(&line);
  }
  size_t begin = 0;
  if (tail_lines > 0 && lines.size() > static_cast<size_t>(tail_lines)) {
    begin = lines.size() - tail_lines;
  }
  for (size_t i = begin; i < lines.size(); ++i) *out.add_lines() = *lines[i];
  // Approximate: any dropped line may have matched the filters.
  out.set_truncated(logs_dropped_ &&
                    (tail_lines == 0 || lines.size() < static_cast<size_t>(tail_lines)));
  return out;
}

}  // namespace meshrun::coordinator
