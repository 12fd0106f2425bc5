// The rules of an attempt's life that JobManager applies under its mutex: how long a restart
// waits (exponential backoff), whether a failed attempt restarts or fails the job and with
// what message, and how a rank's exit reads.
// StopLedger keeps the StopOrders sent to workers (resent at most every stop_resend, bounded
// per worker). Pure values; none is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>

#include "common/status.h"
#include "coordinator/clock.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

class RestartPolicy {
 public:
  // Restart k waits backoff·2^(k−1), at most backoff_max; backoff 0: no wait.
  RestartPolicy(std::chrono::milliseconds backoff, std::chrono::milliseconds backoff_max)
      : backoff_(backoff), backoff_max_(backoff_max) {}

  // How long restart `restart` (1-based) waits.
  std::chrono::milliseconds Backoff(int restart) const;

  struct Outcome {
    bool restart = false;               // PENDING for the next attempt; else the job FAILED
    std::chrono::milliseconds wait{0};  // the backoff before it is placed
    std::string message;                // the job's state-change reason
  };
  // What follows the failure of attempt `attempt` (1-based) of a job allowing `max_restarts`.
  // `remeshes`: earlier attempts of the job that an elastic re-mesh ended (grown, drained):
  // they are not failures and use no restart.
  Outcome AfterFailure(int attempt, int max_restarts, const std::string& reason,
                       int remeshes = 0) const;

 private:
  std::chrono::milliseconds backoff_, backoff_max_;
};

// "rank 3 on worker a exited with code 1: <error>", and the other ways a rank ends.
std::string DescribeExit(const v1::RankExited& exited, const std::string& worker_name);

// "1.5 s", for messages.
std::string FormatSeconds(std::chrono::milliseconds d);

// Whether `path`, reported by a worker as the checkpoint of `spec`'s job at `step`, is that
// job's own: the step folder of `step` (StepDirName) directly in checkpoint.dir, compared
// lexically (both normalized; a `..` component is refused outright). Otherwise
// INVALID_ARGUMENT naming the path and the job's folder; such a report is never resumed from.
Status CheckReportedCheckpoint(const v1::JobSpec& spec, int64_t step, const std::string& path);

class StopLedger {
 public:
  StopLedger(std::chrono::milliseconds resend, size_t max_per_worker)
      : resend_(resend), max_per_worker_(max_per_worker) {}

  // Whether a StopOrder for (worker, job, attempt) goes out now: always when `force`, else
  // unless one went out less than `resend` ago. Records the send when it does.
  bool ShouldSend(const std::string& worker, const std::string& job_id, int attempt, MonoTime now,
                  bool force);
  // Whether a StopOrder for (worker, job, attempt) is outstanding.
  bool Outstanding(const std::string& worker, const std::string& job_id, int attempt) const;
  // Distinct (job, attempt) StopOrders outstanding for `worker`.
  size_t OutstandingFor(const std::string& worker) const;
  // Whether `extra` new ones would pass max_per_worker.
  bool WouldExceed(const std::string& worker, size_t extra) const {
    return extra > 0 && OutstandingFor(worker) + extra > max_per_worker_;
  }
  size_t max_per_worker() const { return max_per_worker_; }
  // Forgets the StopOrders sent more than 10·resend ago.
  void Expire(MonoTime now);

 private:
  std::chrono::milliseconds resend_;
  size_t max_per_worker_;
  std::map<std::tuple<std::string, std::string, int>, MonoTime> sent_;
  std::unordered_map<std::string, size_t> per_worker_;  // entries of sent_
};

}  // namespace meshrun::coordinator
