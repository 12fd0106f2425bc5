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
  auto hold = Hold();
  event->set_sequence(next_sequence_.fetch_add(1, std::memory_order_acq_rel));
  event->set_job_id(job_id_);
  SetTimestamp(now, event->mutable_time());
}

bool JobEventLog::Cut(v1::JobEvent* event) const {
  // Fields this build does not know would be kept, and stored, as they came.
  event->DiscardUnknownFields();
  if (event->kind_case() != v1::JobEvent::kLog) return false;
  std::string& text = *event->mutable_log()->mutable_text();
  const size_t size = text.size();
  if (size <= limits_.max_log_line_bytes) return false;
  // Cut between characters: a proto3 string must stay UTF-8 for clients to parse it.
  text.resize(CutUtf8(text, limits_.max_log_line_bytes).size());
  text += kLogCutMarker + std::to_string(size) + " bytes]";
  return true;
}

size_t JobEventLog::ByteLimitOf(const std::deque<v1::JobEvent>& tier) const {
  if (&tier == &logs_) return limits_.log_bytes;
  if (&tier == &rank_metrics_) return limits_.rank_metrics_bytes;
  return limits_.durable_bytes;
}

size_t& JobEventLog::BytesOf(const std::deque<v1::JobEvent>& tier) {
  if (&tier == &logs_) return log_bytes_;
  if (&tier == &rank_metrics_) return rank_metrics_bytes_;
  return durable_bytes_;
}

void JobEventLog::Publish(const v1::JobEvent& event) {
  Publish(v1::JobEvent(event));
}

void JobEventLog::Publish(v1::JobEvent&& event) {
  auto hold = Hold();
  // Watchers first, then the event moves into its tier (no second copy on the ingest path).
  if (!watchers_.empty()) {
    // One copy of the event for its watchers: the last one that wants it takes it, the others
    // get copies of that (decision 0058).
    size_t last = watchers_.size();
    for (size_t i = 0; i < watchers_.size(); ++i) {
      if (watchers_[i].filter.Matches(event)) last = i;
    }
    if (last < watchers_.size()) {
      v1::WatchJobResponse response;
      *response.mutable_event() = event;
      size_t i = 0;
      std::erase_if(watchers_, [&](const Watcher& w) {
        const size_t at = i++;
        if (at > last || !w.filter.Matches(event)) return false;
        return at == last ? !w.stream->Send(std::move(response)) : !w.stream->Send(response);
      });
    }
  }
  std::deque<v1::JobEvent>& tier = TierOf(event);
  size_t& bytes = BytesOf(tier);
  tier.push_back(std::move(event));
  // Sized after the move (a move does not carry the cached size), so that the eviction below
  // reads it back instead of sizing the event again.
  bytes += tier.back().ByteSizeLong();
  // By count and by bytes; the newest event always stays (one event is bounded by the
  // field limits checked on arrival).
  while (tier.size() > 1 && (tier.size() > LimitOf(tier) || bytes > ByteLimitOf(tier))) {
    if (&tier == &logs_) logs_dropped_ = true;
    // The size ByteSizeLong cached when the event came in: nothing changes a stored event.
    bytes -= std::min(bytes, static_cast<size_t>(tier.front().GetCachedSize()));
    if (&tier == &rank_metrics_ && spare_rank_samples_.size() < kSpares) {
      spare_rank_samples_.push_back(std::move(tier.front()));
    }
    tier.pop_front();
  }
}

v1::JobEvent JobEventLog::SpareRankSampleEvent() {
  auto hold = Hold();
  if (spare_rank_samples_.empty()) return v1::JobEvent();
  v1::JobEvent event = std::move(spare_rank_samples_.back());
  spare_rank_samples_.pop_back();
  return event;
}

uint64_t JobEventLog::first_retained_durable() const {
  auto hold = Hold();
  return durable_.empty() ? next_sequence() : durable_.front().sequence();
}

bool JobEventLog::Replay(uint64_t from, const WatchFilter& filter,
                         const std::vector<v1::JobEvent>& older, WatchJobStream& stream) const {
  auto hold = Hold();
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
  auto hold = Hold();
  if (!logs_.empty()) logs_dropped_ = true;
  durable_ = {};
  logs_ = {};
  rank_metrics_ = {};
  spare_rank_samples_ = {};
  durable_bytes_ = log_bytes_ = rank_metrics_bytes_ = 0;
}

void JobEventLog::ReleaseRankMetrics() {
  auto hold = Hold();
  rank_metrics_ = {};
  spare_rank_samples_ = {};
  rank_metrics_bytes_ = 0;
}

void JobEventLog::AddWatcher(std::shared_ptr<WatchJobStream> stream, WatchFilter filter) {
  auto hold = Hold();
  // Streams that ended (cancelled, disconnected) since the last event go now: a job without
  // events must not collect them.
  std::erase_if(watchers_, [](const Watcher& w) { return w.stream->ended(); });
  watchers_.push_back({std::move(stream), filter});
}

void JobEventLog::FinishWatchers(const Status& status) {
  auto hold = Hold();
  for (Watcher& w : watchers_) w.stream->Finish(status);
  watchers_.clear();
}

v1::GetJobLogsResponse JobEventLog::Logs(std::optional<int> rank, int attempt,
                                         int tail_lines) const {
  auto hold = Hold();
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
  // The newest lines that fit in one answer.
  const size_t first = NewestThatFit(lines, begin, limits_.max_logs_response_bytes);
  for (size_t i = first; i < lines.size(); ++i) *out.add_lines() = *lines[i];
  // Approximate: any dropped line may have matched the filters.
  out.set_truncated(
      first > begin ||
      (logs_dropped_ && (tail_lines == 0 || lines.size() < static_cast<size_t>(tail_lines))));
  return out;
}

size_t NewestThatFit(const std::vector<const v1::LogLine*>& lines, size_t begin, size_t max_bytes) {
  size_t bytes = 0;
  size_t first = lines.size();
  while (first > begin) {
    // The line's bytes plus its field tag and length in the response.
    const size_t line = lines[first - 1]->ByteSizeLong() + 6;
    if (bytes + line > max_bytes) break;
    bytes += line;
    --first;
  }
  return first;
}

}  // namespace meshrun::coordinator
