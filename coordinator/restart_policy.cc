#include "coordinator/restart_policy.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "common/escape.h"
#include "common/job_spec.h"
#include "engine/io/checkpoint.h"

namespace meshrun::coordinator {

std::chrono::milliseconds RestartPolicy::Backoff(int restart) const {
  using std::chrono::milliseconds;
  if (backoff_.count() <= 0) return milliseconds(0);
  // Doubling in int64 milliseconds stops well before it could overflow.
  milliseconds wait = backoff_;
  for (int k = 1; k < restart && wait < backoff_max_; ++k) wait *= 2;
  return std::min(wait, std::max(backoff_, backoff_max_));
}

RestartPolicy::Outcome RestartPolicy::AfterFailure(int attempt, int max_restarts,
                                                   const std::string& reason, int remeshes) const {
  Outcome out;
  const int used = attempt - 1 - remeshes;
  if (used < max_restarts) {
    out.restart = true;
    out.wait = Backoff(used + 1);
    out.message = "attempt " + std::to_string(attempt) + " failed: " + reason + "; restart " +
                  std::to_string(used + 1) + " of " + std::to_string(max_restarts) + " queued" +
                  (out.wait.count() > 0 ? " after a backoff of " + FormatSeconds(out.wait) : "");
  } else {
    out.message = max_restarts > 0
                      ? reason + " (all " + std::to_string(max_restarts) + " restarts used)"
                      : reason;
  }
  return out;
}

std::string DescribeExit(const v1::RankExited& e, const std::string& worker_name) {
  std::string out = "rank " + std::to_string(e.rank()) + " on worker " + worker_name;
  if (e.signal() != 0) {
    out += " was killed by signal " + std::to_string(e.signal());
  } else if (e.exit_code() == -1) {
    out += " could not be started";
  } else if (e.stopped()) {
    out += " was stopped";
  } else {
    out += " exited with code " + std::to_string(e.exit_code());
  }
  if (!e.error().empty()) out += ": " + std::string(CutUtf8(e.error(), 512));
  return out;
}

std::string FormatSeconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

Status CheckReportedCheckpoint(const v1::JobSpec& spec, int64_t step, const std::string& path) {
  namespace fs = std::filesystem;
  const std::string& dir = spec.checkpoint().dir();
  const fs::path reported(path);
  const bool dotdot = std::any_of(reported.begin(), reported.end(),
                                  [](const fs::path& part) { return part == ".."; });
  if (!dir.empty() && !dotdot && step >= 0) {
    const fs::path expected = (fs::path(dir) / StepDirName(step)).lexically_normal();
    fs::path normal = reported.lexically_normal();
    if (!normal.has_filename()) normal = normal.parent_path();  // a trailing '/'
    if (normal == expected) return OkStatus();
  }
  return InvalidArgumentError(
      "checkpoint_saved.path: " + QuoteForMessage(path) + " is not the step " +
      std::to_string(step) + " folder of the job's checkpoint.dir " + QuoteForMessage(dir) +
      " (hint: a rank saves into StepDir(checkpoint.dir, step); the report is ignored and "
      "never resumed from)");
}

// ---- StopLedger ---------------------------------------------------------------------------------

bool StopLedger::ShouldSend(const std::string& worker, const std::string& job_id, int attempt,
                            MonoTime now, bool force) {
  const auto key = std::make_tuple(worker, job_id, attempt);
  auto it = sent_.find(key);
  if (!force && it != sent_.end() && now - it->second < resend_) return false;
  if (it == sent_.end()) ++per_worker_[worker];
  sent_[key] = now;
  return true;
}

bool StopLedger::Outstanding(const std::string& worker, const std::string& job_id,
                             int attempt) const {
  return sent_.count(std::make_tuple(worker, job_id, attempt)) > 0;
}

size_t StopLedger::OutstandingFor(const std::string& worker) const {
  auto it = per_worker_.find(worker);
  return it == per_worker_.end() ? 0 : it->second;
}

void StopLedger::Expire(MonoTime now) {
  for (auto it = sent_.begin(); it != sent_.end();) {
    if (now - it->second <= 10 * resend_) {
      ++it;
      continue;
    }
    const std::string& worker = std::get<0>(it->first);
    if (auto n = per_worker_.find(worker); n != per_worker_.end() && --n->second == 0) {
      per_worker_.erase(n);
    }
    it = sent_.erase(it);
  }
}

}  // namespace meshrun::coordinator
