// Derives the job-level MetricsSample of each step from the ranks' own samples, as types.proto
// defines it: loss, lr and grad_norm of the global batch (from the lowest rank that
// reported them; every rank computes the same values), step_seconds of the slowest rank,
// tokens_per_second = global_batch_size·seq_len / step_seconds, tflops of the slowest rank (each
// rank reports the job's model FLOP/s by its own step time), mfu that of tokens_per_second over
// the ranks' summed peak (the same ModelFlopsUtilization as `meshrun train`, docs/metrics.md),
// memory the maximum, comm averaged over ranks. Also the step-time skew for
// meshrun_job_step_time_skew: the slowest rank's recent step time over the median of the ranks'
// recent step times (recent: the mean of a rank's last kSkewWindow reported steps); 1.0 when
// every rank is as fast as the median, and with one rank.
//
// Not thread-safe: owned by one attempt of JobManager, under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "meshrun/v1/types.pb.h"

namespace meshrun::coordinator {

class StepAggregator {
 public:
  // Steps kept open waiting for their last rank; older ones are dropped (a rank that never
  // reports a step must not grow memory without bound).
  static constexpr size_t kMaxOpenSteps = 64;
  // Steps per rank that make its "recent" step time.
  static constexpr size_t kSkewWindow = 8;

  StepAggregator(int world_size, int64_t tokens_per_step);

  // Adds rank `sample.rank`'s sample of `sample.step`. Returns the job-level sample when this
  // was the last rank of its step to report; a rank reporting a step twice counts once.
  std::optional<v1::MetricsSample> Add(const v1::MetricsSample& sample);

  // Skew as of the newest completed step; 0 before the first.
  double last_skew() const { return last_skew_; }

 private:
  struct CommTotal {
    double seconds = 0;
    uint64_t bytes = 0, calls = 0;
  };
  struct Partial {
    std::vector<bool> seen;
    int count = 0;
    int scalar_rank = -1;  // the rank whose loss/lr/grad_norm were taken
    v1::MetricsSample scalars;
    double slowest = 0, fastest = 0;
    google::protobuf::Timestamp slowest_time;
    double tflops = 0;
    double mfu = 0;  // sum over ranks of 1 / (mfu · step_seconds)
    bool mfu_unknown = false;
    uint64_t mem_allocated = 0, mem_peak = 0, mem_reserved = 0;
    double bubble = -1;  // the largest pipeline_bubble_ratio of the ranks (< 0: none reported)
    double bubble_theory = -1;  // the largest pipeline_bubble_theory of the ranks (< 0: none)
    std::map<std::pair<int, int>, CommTotal> comm;  // (axis, op)
  };

  // Slowest recent step time / median recent step time over the ranks that reported.
  double RecentSkew() const;

  int world_size_;
  int64_t tokens_per_step_;
  std::vector<std::deque<double>> recent_;  // per rank: its last kSkewWindow step times
  std::map<int64_t, Partial> open_;
  int64_t last_completed_ = 0;
  double last_skew_ = 0;
};

}  // namespace meshrun::coordinator
