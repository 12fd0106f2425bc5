#include "coordinator/metrics_ingest.h"

#include <spdlog/spdlog.h>

#include <bit>
#include <set>
#include <utility>

#include "coordinator/job_journal.h"
#include "coordinator/proto_time.h"

namespace meshrun::coordinator {

namespace {

// Whether a sample carries fields this build does not know: on the sample, its time, or a comm
// entry (its only message fields; a new message field of MetricsSample must be added here).
bool HasUnknownFields(const v1::MetricsSample& s) {
  auto unknown = [](const google::protobuf::Message& m) {
    return !m.GetReflection()->GetUnknownFields(m).empty();
  };
  if (unknown(s)) return true;
  if (s.has_time() && unknown(s.time())) return true;
  for (const v1::CommStats& c : s.comm()) {
    if (unknown(c)) return true;
  }
  return false;
}

}  // namespace

size_t MetricsIngest::Clean(v1::MetricsSample* sample) {
  // Kept (and published) otherwise; the reflection pass only when there is something to drop.
  if (HasUnknownFields(*sample)) sample->DiscardUnknownFields();
  auto* comm = sample->mutable_comm();
  // (axis, op) pairs seen: the five axes × ops 1..CommOp_MAX once IsSeriesComm accepted them.
  uint64_t seen = 0;
  const int before = comm->size();
  int kept = 0;
  for (int i = 0; i < before; ++i) {
    const v1::CommStats& c = comm->Get(i);
    if (!IsSeriesComm(c)) continue;
    const uint64_t bit = uint64_t{1} << SeriesCommSlot(c);
    if (seen & bit) continue;
    seen |= bit;
    if (kept != i) comm->SwapElements(kept, i);
    ++kept;
  }
  if (kept < before) comm->DeleteSubrange(kept, before - kept);
  return static_cast<size_t>(before - kept);
}

std::unique_ptr<StepAggregator> MetricsIngest::NewAggregator(const v1::JobSpec& spec,
                                                             int world_size) {
  return std::make_unique<StepAggregator>(
      world_size, spec.train().global_batch_size() * spec.model().seq_len());
}

// ---- IngestBook
// ----------------------------------------------------------------------------------

void IngestBook::Start(std::shared_ptr<JobIngest> job) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  jobs_[job->job_id] = std::move(job);
}

void IngestBook::Stop(const std::string& job_id, int attempt) {
  std::shared_ptr<JobIngest> job;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second->attempt != attempt) return;
    job = std::move(it->second);
    jobs_.erase(it);
  }
  // Not under job->mu: JobManager calls this under its own mutex, which must never wait for
  // the ingest path (a sample that races this is the attempt's last, and harmless).
  job->running = false;
}

std::shared_ptr<JobIngest> IngestBook::Find(const std::string& job_id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

bool IngestBook::Add(const std::string& worker_id, const v1::MetricsSample& s) {
  std::shared_ptr<JobIngest> job = Find(s.job_id());
  if (job == nullptr) return false;
  std::lock_guard<std::mutex> lock(job->mu);
  return AddLocked(*job, worker_id, s);
}

size_t IngestBook::AddAll(const std::string& worker_id,
                          const google::protobuf::RepeatedPtrField<v1::MetricsSample>& samples) {
  size_t accepted = 0;
  std::shared_ptr<JobIngest> job;
  std::unique_lock<std::mutex> lock;
  for (const v1::MetricsSample& s : samples) {
    if (job == nullptr || job->job_id != s.job_id()) {
      if (lock.owns_lock()) lock.unlock();
      job = Find(s.job_id());
      if (job == nullptr) continue;
      lock = std::unique_lock<std::mutex>(job->mu);
    }
    if (AddLocked(*job, worker_id, s)) ++accepted;
  }
  return accepted;
}

bool IngestBook::AddLocked(JobIngest& entry, const std::string& worker_id,
                           const v1::MetricsSample& s) {
  JobIngest* const job = &entry;
  if (!job->running || s.attempt() != job->attempt || s.rank() < 0 ||
      s.rank() >= static_cast<int>(job->ranks.size())) {
    return false;
  }
  const JobIngest::RankSlot& slot = job->ranks[static_cast<size_t>(s.rank())];
  if (slot.worker_id != worker_id) return false;
  // Stamp sets the event's other fields; the sample replaces the spare's in place.
  v1::JobEvent event = job->job->events.SpareRankSampleEvent();
  v1::MetricsSample* sample = event.mutable_metrics();
  *sample = s;
  // Label values from closed sets only (MetricsIngest::Clean): an op or axis outside them
  // would be a new series, and a stored copy, per value.
  if (const size_t dropped = MetricsIngest::Clean(sample); dropped > 0) {
    const size_t before = job->dropped_comm;
    job->dropped_comm += dropped;
    // Counted, and said at 1, 2, 4, … so that a flood cannot flood the log too.
    if (std::bit_width(before) != std::bit_width(job->dropped_comm)) {
      spdlog::warn(
          "worker {}: dropped {} comm entries of job {} so far whose axis or op is not one of "
          "docs/metrics.md's (or repeats one): they make no series",
          worker_id, job->dropped_comm, job->job_id);
    }
  }
  if (series_) series_->Add(slot.labels, *sample);
  std::optional<v1::MetricsSample> step = job->steps->Add(*sample);

  JobRecord& record = *job->job;
  JobEventLog& log = record.events;
  const int64_t block = 4 * static_cast<int64_t>(job->ranks.size());
  auto hold = log.Hold();
  const WallTime now = clock_.Now();
  bool reserve = JobJournal::StampReserving(log, &event, now, block);
  std::optional<v1::JobEvent> job_event;
  WriteBatch batch;
  if (step) {
    {
      std::lock_guard<std::mutex> progress(record.progress.mu);
      JobProgress& p = record.progress;
      p.step = step->step();
      p.loss = step->loss();
      p.tokens_per_second = step->tokens_per_second();
      p.mfu = step->mfu();
      p.step_time_skew = job->steps->last_skew();
      p.tokens_total += job->tokens_per_step;
      if (p.first_step_attempt != job->attempt) {  // an elastic job's first step on a mesh
        p.first_step_attempt = job->attempt;
        p.first_step_ms = ToMillis(now);
      }
    }
    job_event.emplace();
    *job_event->mutable_metrics() = std::move(*step);
    reserve = JobJournal::StampReserving(log, &*job_event, now, block) || reserve;
    const size_t bytes = job_event->ByteSizeLong();
    if (job->stored_bytes + bytes <= limits_.stored_event_bytes) {
      job->stored_bytes += bytes;
      batch.events.push_back({job->job_id, static_cast<int64_t>(job_event->sequence()),
                              job_event->SerializeAsString()});
    }
  }
  if ((step || reserve) && db_ != nullptr) {
    JobProgressRow row;
    row.job_id = job->job_id;
    {
      std::lock_guard<std::mutex> progress(record.progress.mu);
      row.step = record.progress.step;
      row.loss = record.progress.loss;
      row.tokens_per_second = record.progress.tokens_per_second;
      row.mfu = record.progress.mfu;
    }
    row.seq_reserved = log.reserved();
    batch.progress.push_back(std::move(row));
    // The reservation is on disk before a sequence past the old one is seen.
    if (Status st = db_->Commit(batch, Durability::kFast); !st.ok()) {
      spdlog::error("job {}: cannot persist its progress: {}", job->job_id, st.ToString());
    }
  }
  log.Publish(std::move(event));
  if (job_event) log.Publish(std::move(*job_event));
  return true;
}

std::optional<v1::MetricsSample> MetricsIngest::Ingest(const RankLabels& where,
                                                       const v1::MetricsSample& sample,
                                                       const v1::JobSpec& spec,
                                                       StepAggregator& steps, JobRow& row,
                                                       JobTotals& totals) {
  if (series_) series_->Add(where, sample);
  std::optional<v1::MetricsSample> step = steps.Add(sample);
  if (!step) return std::nullopt;
  row.step = step->step();
  row.loss = step->loss();
  row.tokens_per_second = step->tokens_per_second();
  row.mfu = step->mfu();
  totals.step_time_skew = steps.last_skew();
  totals.tokens_total += static_cast<double>(spec.train().global_batch_size()) *
                         static_cast<double>(spec.model().seq_len());
  return step;
}

void MetricsIngest::JobFinished(const std::string& job_id) {
  if (series_) series_->JobFinished(job_id);
}

}  // namespace meshrun::coordinator
