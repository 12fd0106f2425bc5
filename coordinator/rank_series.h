// The per-rank Prometheus series of the coordinator (docs/metrics.md), kept
// from the RankMetrics samples the workers forward: gauges of each rank's newest step, its
// step-time histogram, its step/token/FLOP counters and its communication counters, with the
// labels the placement gives (job_id, rank, worker, mesh coordinates) and the
// attempt/device/gpu of meshrun_rank_info.
//
// Counters stay monotonic across attempts: a restarted rank's cumulative comm counters start
// again at 0, so each series adds the final totals of the job's earlier attempts (no attempt
// label on counters; see docs/decisions/0003-where-metrics-live.md). The step histogram and the
// step, token and FLOP counters add each step observed, so they simply keep counting. A finished
// job's series stay until kMaxFinishedJobs newer jobs finished.
//
// Thread-safe (one mutex, never held while calling out). JobManager calls Add and JobFinished
// under its own mutex (lock order JobManager -> RankSeries); the exporter calls Snapshot at
// scrape time.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/parallel_dims.h"
#include "meshrun/v1/types.pb.h"

namespace meshrun::coordinator {

// Where a rank runs (from the job's placement): the labels of its series besides job and rank.
struct RankLabels {
  std::string worker;  // the worker's name (= the node's host name by default)
  MeshCoords coords;
  std::string device;  // "cpu" or "cuda"
  int local_rank = 0;  // index among the attempt's ranks on that worker
};

class RankSeries {
 public:
  // Finished jobs whose series are still served.
  static constexpr size_t kMaxFinishedJobs = 32;
  // (axis, op) pairs a rank can have series of: the five mesh axes × CommOp's named values
  // (IsSeriesComm); anything else is refused on arrival.
  static constexpr size_t kMaxCommPairs = 5 * static_cast<size_t>(v1::CommOp_MAX);
  // Upper bounds (seconds) of meshrun_rank_step_seconds' buckets: 1 ms … 60 s.
  static const std::vector<double>& StepSecondsBounds();

  // Totals of one (axis, op) counter series: earlier attempts' finals plus this attempt's.
  struct Comm {
    double seconds = 0;
    double bytes = 0;
    double overlapped_seconds = 0;  // of `seconds`, the part that overlapped with compute
  };
  // What is served for one rank.
  struct Rank {
    int rank = 0;
    int attempt = 0;
    RankLabels placement;
    int64_t step = 0;  // newest step of `attempt`
    // Gauges of the newest step, in base units (model_flops_per_second = the sample's tflops·1e12).
    double loss = 0, tokens_per_second = 0, model_flops_per_second = 0, mfu = 0;
    // Counters beside the rate gauges, every observed step of every attempt: rate() of these
    // is the gauges' rate over a window. tokens_total adds each step's tokens (the job's
    // global_batch_size·seq_len, as tokens_per_second counts them), model_flops_total its model
    // FLOPs; the step count is step_count below.
    double tokens_total = 0, model_flops_total = 0;
    uint64_t memory_allocated = 0, memory_peak = 0, memory_reserved = 0;
    // The newest step's measured pipeline bubble (MetricsSample.pipeline_bubble_ratio); < 0:
    // the rank reports none.
    double pipeline_bubble_ratio = -1;
    // Its schedule's bubble in theory (MetricsSample.pipeline_bubble_theory); < 0: none.
    double pipeline_bubble_theory = -1;
    // Per bucket of StepSecondsBounds() plus +Inf, not cumulative; count and sum.
    std::vector<uint64_t> step_buckets;
    uint64_t step_count = 0;
    double step_sum = 0;
    // Filled by Snapshot (Add keeps the fixed-size slots of RankState instead).
    std::map<std::pair<MeshAxis, v1::CommOp>, Comm> comm;
  };
  struct Job {
    std::string job_id;
    bool finished = false;
    std::vector<Rank> ranks;  // by rank
  };

  // Rank `sample.rank` of `sample.attempt` reported a step. Samples of an attempt older than
  // the newest one seen for the job, and of finished jobs, are ignored; a step seen twice is
  // observed once.
  void Add(const RankLabels& placement, const v1::MetricsSample& sample);
  // The job reached SUCCEEDED, FAILED or CANCELLED: its last attempt's series stay served
  // until kMaxFinishedJobs jobs finished after it.
  void JobFinished(const std::string& job_id);

  // Every served job, in job id order.
  std::vector<Job> Snapshot() const;

 private:
  // One (axis, op) counter of a rank: a fixed slot per pair (CommSlotOf).
  struct CommSlot {
    bool present = false;
    std::pair<MeshAxis, v1::CommOp> key{};
    Comm totals;
  };
  // Per rank a fixed-size record once its first sample arrived: no allocation per sample.
  struct RankState {
    bool present = false;
    Rank served;  // without `comm` (Snapshot fills it)
    // The newest cumulative counters of the current attempt, and what earlier attempts left.
    std::array<CommSlot, kMaxCommPairs> current, base;
  };
  struct JobState {
    bool finished = false;
    int attempt = 0;
    std::vector<RankState> ranks;  // by rank
  };

  mutable std::mutex mu_;
  std::map<std::string, JobState> jobs_;  // guarded by mu_
  std::deque<std::string> finished_;      // oldest first
};

// Whether `c` names a series: its axis one of the five mesh axes (not a flattened one) and its
// op one of CommOp's named values (not UNSPECIFIED). The label values are closed sets
// (docs/metrics.md); anything else would be a new series per value, so it is refused.
bool IsSeriesComm(const v1::CommStats& c);
// The pair's index in [0, RankSeries::kMaxCommPairs) for an entry IsSeriesComm accepts: the
// axis's place among dp_replicate, dp_shard, cp, tp, pp (its wire order) × CommOp_MAX + op − 1.
size_t SeriesCommSlot(const v1::CommStats& c);

// "all_reduce", "send_recv", …: the `op` label of a CommOp (the engine's names, CommOpName).
// The `axis` label is MeshAxisName of the axis (common/parallel_dims.h).
std::string OpLabel(v1::CommOp op);

}  // namespace meshrun::coordinator
