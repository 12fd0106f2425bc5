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

size_t SeriesCommSlot(const v1::CommStats& c) {
  // MESH_AXIS_DP_REPLICATE..TP are 1..4 on the wire, MESH_AXIS_PP 8 (after the flattened three).
  const size_t axis = c.axis() == v1::MESH_AXIS_PP ? 4 : static_cast<size_t>(c.axis() - 1);
  return axis * v1::CommOp_MAX + static_cast<size_t>(c.op() - 1);
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
    for (RankState& state : job.ranks) {
      for (size_t i = 0; i < state.current.size(); ++i) {
        const CommSlot& c = state.current[i];
        if (!c.present) continue;
        CommSlot& b = state.base[i];
        b.present = true;
        b.key = c.key;
        b.totals.seconds += c.totals.seconds;
        b.totals.bytes += c.totals.bytes;
        b.totals.overlapped_seconds += c.totals.overlapped_seconds;
      }
      state.current = {};
      state.served.step = 0;
      state.served.attempt = s.attempt();
    }
    job.attempt = s.attempt();
  }
  if (static_cast<size_t>(s.rank()) >= job.ranks.size()) job.ranks.resize(s.rank() + 1);
  RankState& state = job.ranks[s.rank()];
  Rank& r = state.served;
  if (r.step_buckets.empty()) r.step_buckets.assign(StepSecondsBounds().size() + 1, 0);
  if (s.step() <= r.step) return;  // a step seen before
  state.present = true;
  r.rank = s.rank();
  r.attempt = s.attempt();
  if (r.placement.worker != placement.worker || !(r.placement.coords == placement.coords) ||
      r.placement.device != placement.device || r.placement.local_rank != placement.local_rank) {
    r.placement = placement;
  }
  r.step = s.step();
  r.loss = s.loss();
  r.tokens_per_second = s.tokens_per_second();
  r.model_flops_per_second = s.tflops() * 1e12;
  r.mfu = s.mfu();
  r.memory_allocated = s.memory_allocated_bytes();
  r.memory_peak = s.memory_peak_bytes();
  r.memory_reserved = s.memory_reserved_bytes();
  r.pipeline_bubble_ratio = s.has_pipeline_bubble_ratio() ? s.pipeline_bubble_ratio() : -1;
  r.pipeline_bubble_theory = s.has_pipeline_bubble_theory() ? s.pipeline_bubble_theory() : -1;

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
    // The five mesh axes and ops 1..CommOp_MAX (IsSeriesComm): one slot each.
    const size_t slot = SeriesCommSlot(c);
    if (slot >= state.current.size()) continue;
    CommSlot& cur = state.current[slot];
    cur.present = true;
    cur.key = {*MeshAxisFromProto(c.axis()), c.op()};
    cur.totals.seconds = std::max(cur.totals.seconds, c.seconds());
    cur.totals.bytes = std::max(cur.totals.bytes, static_cast<double>(c.bytes()));
    cur.totals.overlapped_seconds = std::max(cur.totals.overlapped_seconds, c.overlapped_seconds());
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
    for (const RankState& r : state.ranks) {
      if (!r.present) continue;
      Rank& served = job.ranks.emplace_back(r.served);
      for (size_t i = 0; i < r.current.size(); ++i) {
        const CommSlot& b = r.base[i];
        const CommSlot& c = r.current[i];
        if (!b.present && !c.present) continue;
        Comm& out = served.comm[b.present ? b.key : c.key];
        out.seconds = b.totals.seconds + c.totals.seconds;
        out.bytes = b.totals.bytes + c.totals.bytes;
        out.overlapped_seconds = b.totals.overlapped_seconds + c.totals.overlapped_seconds;
      }
    }
  }
  return out;
}

}  // namespace meshrun::coordinator
