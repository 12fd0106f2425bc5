// StepAggregator: per-step partial sums until every rank of the attempt has reported.
#include "coordinator/step_aggregator.h"

#include <algorithm>

#include "coordinator/rank_series.h"

namespace meshrun::coordinator {

StepAggregator::StepAggregator(int world_size, int64_t tokens_per_step)
    : world_size_(world_size), tokens_per_step_(tokens_per_step), recent_(world_size) {}

double StepAggregator::RecentSkew() const {
  std::vector<double> means;
  for (const std::deque<double>& times : recent_) {
    if (times.empty()) continue;
    double sum = 0;
    for (double t : times) sum += t;
    means.push_back(sum / static_cast<double>(times.size()));
  }
  if (means.empty()) return 0;
  std::sort(means.begin(), means.end());
  const size_t n = means.size();
  const double median = n % 2 == 1 ? means[n / 2] : (means[n / 2 - 1] + means[n / 2]) / 2;
  return median > 0 ? means.back() / median : 1.0;
}

std::optional<v1::MetricsSample> StepAggregator::Add(const v1::MetricsSample& s) {
  if (!s.has_rank() || s.rank() < 0 || s.rank() >= world_size_) return std::nullopt;
  if (s.step() <= last_completed_) return std::nullopt;
  auto [it, inserted] = open_.try_emplace(s.step());
  Partial& p = it->second;
  if (inserted) {
    p.seen.assign(world_size_, false);
    while (open_.size() > kMaxOpenSteps) open_.erase(open_.begin());
    if (open_.find(s.step()) == open_.end()) return std::nullopt;
  }
  if (p.seen[s.rank()]) return std::nullopt;
  p.seen[s.rank()] = true;
  ++p.count;
  std::deque<double>& recent = recent_[s.rank()];
  recent.push_back(std::max(0.0, s.step_seconds()));
  if (recent.size() > kSkewWindow) recent.pop_front();
  if (p.scalar_rank < 0 || s.rank() < p.scalar_rank) {
    p.scalar_rank = s.rank();
    p.scalars.set_loss(s.loss());
    p.scalars.set_lr(s.lr());
    p.scalars.set_grad_norm(s.grad_norm());
  }
  if (p.count == 1 || s.step_seconds() > p.slowest) {
    p.slowest = s.step_seconds();
    p.slowest_time = s.time();
    p.tflops = s.tflops();
  }
  p.fastest = p.count == 1 ? s.step_seconds() : std::min(p.fastest, s.step_seconds());
  // Each rank's mfu is ModelFlopsUtilization(tokens_per_step / its step_seconds, F, its peak,
  // ranks); mfu·step_seconds = tokens_per_step·F / (its peak·ranks), so the sum of the inverses
  // gives the job's summed peak, and the job's MFU is that of the job's tokens/s below (the
  // slowest rank's time), not an average of per-rank rates (docs/metrics.md "MFU").
  if (s.mfu() > 0 && s.step_seconds() > 0) {
    p.mfu += 1.0 / (s.mfu() * s.step_seconds());
  } else {
    p.mfu_unknown = true;  // a rank without a peak (0): the job's MFU reads 0, as that rank's
  }
  p.mem_allocated = std::max(p.mem_allocated, s.memory_allocated_bytes());
  p.mem_peak = std::max(p.mem_peak, s.memory_peak_bytes());
  p.mem_reserved = std::max(p.mem_reserved, s.memory_reserved_bytes());
  if (s.has_pipeline_bubble_ratio()) p.bubble = std::max(p.bubble, s.pipeline_bubble_ratio());
  if (s.has_pipeline_bubble_theory()) {
    p.bubble_theory = std::max(p.bubble_theory, s.pipeline_bubble_theory());
  }
  for (const v1::CommStats& c : s.comm()) {
    if (!IsSeriesComm(c)) continue;  // closed sets: at most 5 axes × 8 ops per step
    CommTotal& t = p.comm[{c.axis(), c.op()}];
    t.seconds += c.seconds();
    t.bytes += c.bytes();
    t.calls += c.calls();
  }
  if (p.count < world_size_) return std::nullopt;

  v1::MetricsSample job;
  job.set_job_id(s.job_id());
  job.set_attempt(s.attempt());
  job.set_step(s.step());
  *job.mutable_time() = p.slowest_time;
  job.set_loss(p.scalars.loss());
  job.set_lr(p.scalars.lr());
  job.set_grad_norm(p.scalars.grad_norm());
  job.set_step_seconds(p.slowest);
  job.set_tokens_per_second(p.slowest > 0 ? tokens_per_step_ / p.slowest : 0);
  job.set_tflops(p.tflops);
  // ranks / Σ 1/(mfu·t) / slowest = tokens_per_step·F / (slowest · Σ peak): the job's MFU.
  job.set_mfu(p.mfu_unknown || p.mfu <= 0 || p.slowest <= 0
                  ? 0
                  : static_cast<double>(world_size_) / p.mfu / p.slowest);
  job.set_memory_allocated_bytes(p.mem_allocated);
  job.set_memory_peak_bytes(p.mem_peak);
  job.set_memory_reserved_bytes(p.mem_reserved);
  if (p.bubble >= 0) job.set_pipeline_bubble_ratio(p.bubble);
  if (p.bubble_theory >= 0) job.set_pipeline_bubble_theory(p.bubble_theory);
  for (const auto& [key, t] : p.comm) {
    v1::CommStats* c = job.add_comm();
    c->set_axis(static_cast<v1::MeshAxis>(key.first));
    c->set_op(static_cast<v1::CommOp>(key.second));
    c->set_seconds(t.seconds / world_size_);
    c->set_bytes(t.bytes / world_size_);
    c->set_calls(t.calls / world_size_);
  }
  last_skew_ = RecentSkew();
  last_completed_ = s.step();
  // Steps before this one can no longer complete in order; drop them with it.
  open_.erase(open_.begin(), std::next(it));
  return job;
}

}  // namespace meshrun::coordinator
