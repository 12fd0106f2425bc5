// Following a job to its end: `meshrun submit --follow` and `meshrun demo` watch the job's
// events (WatchJob, reconnecting from the last sequence seen) and show a live progress bar on a
// terminal (redrawn with \r: step/steps, loss, tokens/s, MFU, ETA) or one plain line per step
// otherwise, with state changes, rank failures and checkpoints as lines of their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>

#include "client/coordinator_client.h"
#include "common/status.h"

namespace meshrun::client {

// What the view knows of a job; filled from its events.
struct ProgressState {
  v1::JobState state = v1::JOB_STATE_PENDING;
  int attempt = 0;
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  double step_seconds = 0;  // smoothed (exponential moving average), for the ETA

  // Takes one step's sample: a job-level v1::MetricsSample (`submit --follow`, `logs --follow`)
  // or a rank's v1::RankStep (`train`); both carry these fields.
  template <typename Sample>
  void Observe(const Sample& m) {
    step = m.step();
    loss = m.loss();
    lr = m.lr();
    grad_norm = m.grad_norm();
    tokens_per_second = m.tokens_per_second();
    mfu = m.mfu();
    if (m.step_seconds() > 0) {
      step_seconds =
          step_seconds > 0 ? 0.8 * step_seconds + 0.2 * m.step_seconds() : m.step_seconds();
    }
  }
};

// One step as `train` and `submit --follow` both show it. On a terminal (bar_width > 0), a bar
// that fits 80 columns: "[##########··········] 40/100  loss 2.8134  4,102 tok/s  MFU 1.20%  ETA
// 12s". Plain (bar_width 0), one line per step with the learning rate and gradient norm too:
// "step 40/100  loss 2.8134  lr 1.00e-03  norm 0.912  4,102 tok/s  MFU 1.20%  ETA 12s". Pure.
std::string RenderProgressLine(const ProgressState& state, int bar_width);

// A run's totals, as both `train` and `submit --follow` end with them (docs/metrics.md defines
// the rate and MFU of a run).
struct RunTotals {
  int64_t last_step = 0;  // the newest step trained
  int64_t steps = 0;      // train.steps
  double final_loss = 0;
  double tokens_per_second = 0;
  double mfu = 0;  // 0 … 1
};
// "40/40 steps, final loss 3.6748, 63,258 tok/s, MFU 39.70%". Pure.
std::string RenderRunTotals(const RunTotals& totals);

struct FollowOptions {
  std::ostream* out = nullptr;  // default std::cout
  bool terminal = false;        // redraw one line with \r instead of printing one per step
  bool show_logs = false;       // also print the ranks' log lines
  // How long to keep reconnecting while the coordinator is unreachable.
  std::chrono::seconds reconnect_for{90};
};

// What was seen by the end.
struct FollowResult {
  v1::Job job;                     // GetJob after the terminal state
  std::map<int64_t, double> loss;  // job-level loss by step (a restart overwrites its steps)
  // Over every step seen, defined as `train`'s summary defines them (docs/metrics.md): the
  // steps' tokens over the sum of their step_seconds, and the MFU of that rate (each step's
  // MFU weighted by its time). A step seen twice (a restart redoing it) counts once, as the
  // newest sample.
  double tokens_per_second = 0;
  double mfu = 0;
  std::string last_checkpoint;  // newest CheckpointSaved seen (or job.last_checkpoint)
};

// Watches `job_id` until it reaches a terminal state. Errors: the coordinator's (NOT_FOUND for
// an unknown job), or UNAVAILABLE once it stayed unreachable for reconnect_for.
StatusOr<FollowResult> FollowJob(CoordinatorClient& client, const std::string& job_id,
                                 const FollowOptions& options);

// A status that means the coordinator is stopping or restarting, not an answer: UNAVAILABLE, or
// CANCELLED (a call it cut off while stopping; the client cancels none of its own). Followers
// reconnect on these.
bool CoordinatorGone(const Status& s);

// GetJob, retried with backoff while CoordinatorGone for up to `reconnect_for`.
StatusOr<v1::Job> GetJobRetrying(CoordinatorClient& client, const std::string& job_id,
                                 std::chrono::seconds reconnect_for);

// Whether stdout is a terminal (and TERM is not "dumb").
bool StdoutIsTerminal();

}  // namespace meshrun::client
