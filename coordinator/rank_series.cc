// RankSeries: per-rank gauges, histogram and attempt-spanning counters (see rank_series.h).
#include "coordinator/rank_series.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "proto/mesh_axis.h"

namespace meshrun::coordinator {
namespace {

// The enum value's name without its type prefix, lower case: COMM_OP_ALL_REDUCE -> all_reduce.
std::string Unprefixed(const std::string& name, const std::string& prefix) {
  std::string out = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

bool IsSeriesComm(const v1::CommStats& c) {
  const std::optional<MeshAxis> axis = MeshAxisFromProto(c.axis());
  return axis && !IsFlattenedAxis(*axis) && v1::CommOp_IsValid(c.op()) &&
         c.op() != v1::COMM_OP_UNSPECIFIED;
}

std::string OpLabel(v1::CommOp op) {
  return Unprefixed(v1::CommOp_Name(op), "COMM_OP_");
}

const std::vector<double>& RankSeries::StepSecondsBounds() {
  static const std::vector<double> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1,      2.5,   5,    10,    30,   60};
  return bounds;
}

void RankSeries::Add(const RankLabels& placement, const v1::MetricsSample& s) {
  if (!s.has_rank() || s.rank() < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  JobState& job = jobs_[s.job_id()];
  if (job.finished || s.attempt() < job.attempt) return;
  if (s.attempt() > job.attempt) {
    // A new attempt: its ranks count from 0 again, so what the last one reached becomes base.
    for (auto& [rank, state] : job.ranks) {
      for (const auto& [key, c] : state.current) {
        state.base[key].seconds += c.seconds;
        state.base[key].bytes += c.bytes;
        state.base[key].overlapped_seconds += c.overlapped_seconds;
      }
      state.current.clear();
      state.served.step = 0;
      state.served.attempt = s.attempt();
    }
    job.attempt = s.attempt();
  }
  RankState& state = job.ranks[s.rank()];
  Rank& r = state.served;
  if (r.step_buckets.empty()) r.step_buckets.assign(StepSecondsBounds().size() + 1, 0);
  if (s.step() <= r.step) return;  // a step seen before
  r.rank = s.rank();
  r.attempt = s.attempt();
  r.placement = placement;
  r.step = s.step();
  r.loss = s.loss();
  r.tokens_per_second = s.tokens_per_second();
  r.model_flops_per_second = s.tflops() * 1e12;
  r.mfu = s.mfu();
  r.memory_allocated = s.memory_allocated_bytes();
  r.memory_peak = s.memory_peak_bytes();
  r.memory_reserved = s.memory_reserved_bytes();

  const double seconds = std::max(0.0, s.step_seconds());
  const std::vector<double>& bounds = StepSecondsBounds();
  const size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin();
  ++r.step_buckets[bucket];
  ++r.step_count;
  r.step_sum += seconds;
  // The sample carries rates of this one step: rate × its time gives the step's amounts back.
  // Tokens per step are a whole number, so rounding removes the float noise of the division.
  r.tokens_total += std::llround(std::max(0.0, s.tokens_per_second()) * seconds);
  r.model_flops_total += std::max(0.0, s.tflops()) * 1e12 * seconds;

  // Cumulative within the attempt: a sample never lowers a counter (samples may overtake).
  for (const v1::CommStats& c : s.comm()) {
    if (!IsSeriesComm(c)) continue;  // MetricsIngest::Clean dropped and counted these already
    Comm& cur = state.current[{*MeshAxisFromProto(c.axis()), c.op()}];
    cur.seconds = std::max(cur.seconds, c.seconds());
    cur.bytes = std::max(cur.bytes, static_cast<double>(c.bytes()));
    cur.overlapped_seconds = std::max(cur.overlapped_seconds, c.overlapped_seconds());
  }
  r.comm = state.base;
  for (const auto& [key, c] : state.current) {
    r.comm[key].seconds += c.seconds;
    r.comm[key].bytes += c.bytes;
    r.comm[key].overlapped_seconds += c.overlapped_seconds;
  }
}

void RankSeries::JobFinished(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.finished) return;
  it->second.finished = true;
  finished_.push_back(job_id);
  while (finished_.size() > kMaxFinishedJobs) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
}

std::vector<RankSeries::Job> RankSeries::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Job> out;
  out.reserve(jobs_.size());
  for (const auto& [job_id, state] : jobs_) {
    Job& job = out.emplace_back();
    job.job_id = job_id;
    job.finished = state.finished;
    job.ranks.reserve(state.ranks.size());
    for (const auto& [rank, r] : state.ranks) job.ranks.push_back(r.served);
  }
  return out;
}

}  // namespace meshrun::coordinator
