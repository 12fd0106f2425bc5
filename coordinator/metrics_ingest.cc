#include "coordinator/metrics_ingest.h"

#include <set>
#include <utility>

namespace meshrun::coordinator {

size_t MetricsIngest::Clean(v1::MetricsSample* sample) {
  sample->DiscardUnknownFields();  // kept as the rank's latest sample otherwise
  auto* comm = sample->mutable_comm();
  std::set<std::pair<int, int>> seen;
  const int before = comm->size();
  int kept = 0;
  for (int i = 0; i < before; ++i) {
    const v1::CommStats& c = comm->Get(i);
    if (!IsSeriesComm(c) || !seen.insert({c.axis(), c.op()}).second) continue;
    if (kept != i) comm->SwapElements(kept, i);
    ++kept;
  }
  comm->DeleteSubrange(kept, before - kept);
  return static_cast<size_t>(before - kept);
}

std::unique_ptr<StepAggregator> MetricsIngest::NewAggregator(const v1::JobSpec& spec,
                                                             int world_size) {
  return std::make_unique<StepAggregator>(
      world_size, spec.train().global_batch_size() * spec.model().seq_len());
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
