// FollowJob and the progress line (see progress.h).
#include "client/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "client/command.h"
#include "rpc/backoff.h"

namespace meshrun::client {
namespace {

using Clock = std::chrono::steady_clock;

// 12345.6 -> "12,346".
std::string WithThousands(double value) {
  const long long v = std::llround(std::max(0.0, value));
  std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Prints lines above a live bar (terminal) or plainly, and redraws the bar.
class ProgressView {
 public:
  ProgressView(std::ostream& out, bool terminal) : out_(out), terminal_(terminal) {}

  // `text` holds fields of the coordinator's events (reasons, errors, paths, log lines):
  // escaped here, once for every line.
  void Line(const std::string& text) {
    if (terminal_ && bar_shown_) out_ << "\r\x1b[K";
    out_ << EscapeText(text) << '\n';
    if (terminal_ && bar_shown_) out_ << bar_;
    out_.flush();
  }
  void Bar(const ProgressState& s) {
    if (terminal_) {
      bar_ = RenderProgressLine(s, 24);
      out_ << "\r\x1b[K" << bar_;
      bar_shown_ = true;
      out_.flush();
    } else {
      out_ << RenderProgressLine(s, 0) << '\n';
      out_.flush();
    }
  }
  void End() {
    if (terminal_ && bar_shown_) out_ << '\n';
    bar_shown_ = false;
    out_.flush();
  }

 private:
  std::ostream& out_;
  bool terminal_;
  bool bar_shown_ = false;
  std::string bar_;
};

}  // namespace

bool CoordinatorGone(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kCancelled;
}

StatusOr<v1::Job> GetJobRetrying(CoordinatorClient& client, const std::string& job_id,
                                 std::chrono::seconds reconnect_for) {
  const Clock::time_point give_up = Clock::now() + reconnect_for;
  Backoff backoff(std::chrono::milliseconds(200), std::chrono::milliseconds(3000));
  while (true) {
    StatusOr<v1::Job> job = client.GetJob(job_id);
    if (job.ok() || !CoordinatorGone(job.status()) || Clock::now() >= give_up) return job;
    std::this_thread::sleep_for(backoff.Next());
  }
}

std::string RenderProgressLine(const ProgressState& s, int bar_width) {
  std::string line;
  if (bar_width > 0) {
    const double frac = s.steps > 0 ? std::clamp(double(s.step) / double(s.steps), 0.0, 1.0) : 0;
    const int filled = static_cast<int>(std::floor(frac * bar_width));
    line += '[';
    for (int i = 0; i < bar_width; ++i) line += i < filled ? "#" : "\u00b7";
    line += "] ";
  } else {
    line += "step ";
  }
  char text[256];
  std::snprintf(text, sizeof(text), "%lld/%lld  loss %.4f", static_cast<long long>(s.step),
                static_cast<long long>(s.steps), s.loss);
  line += text;
  if (bar_width == 0) {
    std::snprintf(text, sizeof(text), "  lr %.2e  norm %.3f", s.lr, s.grad_norm);
    line += text;
  }
  std::snprintf(text, sizeof(text), "  %s tok/s  MFU %.2f%%",
                WithThousands(s.tokens_per_second).c_str(), 100.0 * s.mfu);
  line += text;
  if (s.steps > 0 && s.step_seconds > 0 && s.step < s.steps) {
    line += "  ETA " + FormatDuration(double(s.steps - s.step) * s.step_seconds);
  }
  if (s.attempt > 1) line += "  (attempt " + std::to_string(s.attempt) + ")";
  return line;
}

std::string RenderRunTotals(const RunTotals& t) {
  char text[256];
  std::snprintf(text, sizeof(text), "%lld/%lld steps, final loss %.4f, %s tok/s, MFU %.2f%%",
                static_cast<long long>(t.last_step), static_cast<long long>(t.steps), t.final_loss,
                WithThousands(t.tokens_per_second).c_str(), 100.0 * t.mfu);
  return text;
}

bool StdoutIsTerminal() {
  if (isatty(STDOUT_FILENO) == 0) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::string(term) != "dumb";
}

StatusOr<FollowResult> FollowJob(CoordinatorClient& client, const std::string& job_id,
                                 const FollowOptions& options) {
  std::ostream& out = options.out != nullptr ? *options.out : std::cout;
  ProgressView view(out, options.terminal);
  FollowResult result;
  ProgressState state;
  uint64_t last_sequence = 0;
  bool job_level_seen = false;
  struct StepTime {
    double seconds = 0, tokens = 0, mfu = 0;
  };
  std::map<int64_t, StepTime> step_times;  // by step, for the run's tokens/s and MFU
  bool terminal = false;
  bool got_event = false;

  MESHRUN_ASSIGN_OR_RETURN(v1::Job initial, client.GetJob(job_id));
  state.steps = initial.steps();
  state.state = initial.state();

  auto on_event = [&](const v1::JobEvent& e) {
    got_event = true;
    last_sequence = std::max(last_sequence, e.sequence());
    switch (e.kind_case()) {
      case v1::JobEvent::kStateChanged: {
        const v1::JobStateChanged& c = e.state_changed();
        state.state = c.state();
        if (c.attempt() > 0) state.attempt = c.attempt();
        std::string text = "job " + job_id + ": " + JobStateName(c.state());
        if (c.attempt() > 0) text += " (attempt " + std::to_string(c.attempt()) + ")";
        if (!c.reason().empty()) text += ": " + c.reason();
        view.Line(text);
        if (IsTerminal(c.state())) terminal = true;
        break;
      }
      case v1::JobEvent::kRankStateChanged: {
        const v1::RankInfo& r = e.rank_state_changed().rank();
        if (r.state() == v1::RANK_STATE_FAILED || r.state() == v1::RANK_STATE_LOST) {
          std::string text = "rank " + std::to_string(r.rank()) + " (" + RankAxesText(r) + ") on " +
                             r.worker_name() + ": " + RankStateName(r.state());
          if (r.signal() != 0) {
            text += ", signal " + std::to_string(r.signal());
          } else if (r.exit_code() != 0) {
            text += ", exit code " + std::to_string(r.exit_code());
          }
          if (!r.error().empty()) text += ": " + r.error();
          view.Line(text);
        }
        break;
      }
      case v1::JobEvent::kMetrics: {
        const v1::MetricsSample& m = e.metrics();
        // The job-level sample has no rank; rank 0's stands in for a coordinator sending none.
        if (m.has_rank()) {
          if (job_level_seen || m.rank() != 0) break;
        } else {
          job_level_seen = true;
        }
        state.Observe(m);
        if (m.attempt() > state.attempt) state.attempt = m.attempt();
        result.loss[m.step()] = m.loss();
        if (m.step_seconds() > 0) {
          step_times[m.step()] = {m.step_seconds(), m.tokens_per_second() * m.step_seconds(),
                                  m.mfu()};
        }
        view.Bar(state);
        break;
      }
      case v1::JobEvent::kLog: {
        if (options.show_logs) {
          const v1::LogLine& l = e.log();
          view.Line("[rank " + std::to_string(l.rank()) + "] " + EscapeControl(l.text()));
        }
        break;
      }
      case v1::JobEvent::kRemeshed: {
        const v1::JobRemeshed& r = e.remeshed();
        const v1::MeshShape& m = r.mesh();
        view.Line("re-meshed (" + r.cause() + ") at step " + std::to_string(r.step()) +
                  ": dp_replicate " + std::to_string(m.dp_replicate_size()) + " x dp_shard " +
                  std::to_string(m.dp_shard_size()) + " x cp " + std::to_string(m.cp_size()) +
                  " x tp " + std::to_string(m.tp_size()));
        break;
      }
      case v1::JobEvent::kCheckpointSaved: {
        const v1::CheckpointSaved& c = e.checkpoint_saved();
        result.last_checkpoint = c.path();
        view.Line((c.resumed() ? "resumed from the checkpoint at step " : "checkpoint at step ") +
                  std::to_string(c.step()) + ": " + c.path());
        break;
      }
      default: break;
    }
    return true;
  };

  Backoff backoff(std::chrono::milliseconds(200), std::chrono::milliseconds(3000));
  Clock::time_point unreachable_since{};
  while (!terminal) {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_sequence(last_sequence + 1);
    request.set_skip_logs(!options.show_logs);
    got_event = false;
    const Status s = client.WatchJob(request, on_event);
    if (terminal) break;
    if (got_event) {
      unreachable_since = Clock::time_point{};
      backoff.Reset();
    }
    if (s.ok()) {
      // The stream ended without a terminal event: ask for the state, then watch again.
      StatusOr<v1::Job> job = client.GetJob(job_id);
      if (job.ok() && IsTerminal(job->state())) break;
      unreachable_since = Clock::time_point{};
      std::this_thread::sleep_for(backoff.Next());
      continue;
    }
    if (!CoordinatorGone(s)) {
      view.End();
      return s;
    }
    const Clock::time_point now = Clock::now();
    if (unreachable_since == Clock::time_point{}) {
      unreachable_since = now;
      view.Line("lost the coordinator (" + s.message() + "); reconnecting");
    }
    if (now - unreachable_since > options.reconnect_for) {
      view.End();
      return s;
    }
    std::this_thread::sleep_for(backoff.Next());
  }
  view.End();
  // The final state; the coordinator may be restarting just now.
  MESHRUN_ASSIGN_OR_RETURN(result.job, GetJobRetrying(client, job_id, options.reconnect_for));
  double seconds = 0, tokens = 0, mfu_seconds = 0;
  for (const auto& [step, t] : step_times) {
    seconds += t.seconds;
    tokens += t.tokens;
    mfu_seconds += t.mfu * t.seconds;
  }
  if (seconds > 0) {
    result.tokens_per_second = tokens / seconds;
    result.mfu = mfu_seconds / seconds;
  }
  if (result.last_checkpoint.empty()) result.last_checkpoint = result.job.last_checkpoint();
  return result;
}

}  // namespace meshrun::client
