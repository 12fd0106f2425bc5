// `meshrun jobs|status|logs|cancel` (see jobs_command.h): one RPC each (logs --follow streams),
// printed as a table for people or as the JSON of docs/cli.md with -o json.
#include "client/jobs_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "client/command.h"
#include "client/coordinator_client.h"
#include "client/progress.h"
#include "common/escape.h"
#include "proto/mesh_axis.h"
#include "rpc/backoff.h"

namespace meshrun::client {
namespace {

using json = nlohmann::ordered_json;

struct JobFlags {
  std::string job_id;
  std::string output = "text";
  std::string coordinator;
  bool follow = false;
  std::optional<int> rank;
  std::string reason;
  std::vector<std::string> states;  // jobs --state
  // status: the ranks' page and filters.
  int page_size = 100;
  std::string page_token;
  bool all_ranks = false;
  std::vector<std::string> rank_states;
  std::string worker;
  std::string where;
};

// --where "dp_shard=3,tp=0" into a coordinates filter; INVALID_ARGUMENT naming the part.
Status ParseWhere(const std::string& where, v1::MeshCoordsFilter* out) {
  size_t begin = 0;
  while (begin < where.size()) {
    size_t end = where.find(',', begin);
    if (end == std::string::npos) end = where.size();
    const std::string part = where.substr(begin, end - begin);
    begin = end + 1;
    const size_t eq = part.find('=');
    const std::string axis = part.substr(0, eq);
    long long value = -1;
    size_t used = 0;
    try {
      if (eq != std::string::npos) value = std::stoll(part.substr(eq + 1), &used, 10);
    } catch (...) {
      value = -1;
    }
    const bool number =
        eq != std::string::npos && used == part.size() - eq - 1 && value >= 0 && value <= INT32_MAX;
    // One of the mesh's own axes, by its name (proto/mesh_axis.h's list).
    std::optional<MeshAxis> named = MeshAxisFromName(axis);
    if (named && std::find(kMeshOwnAxes.begin(), kMeshOwnAxes.end(), *named) == kMeshOwnAxes.end())
      named.reset();
    if (!number || !named) {
      std::string names;
      for (MeshAxis a : kMeshOwnAxes)
        names += std::string(names.empty() ? "" : ", ") + MeshAxisName(a);
      return InvalidArgumentError("--where: '" + part +
                                  "' is not AXIS=N (hint: e.g. --where dp_shard=3,tp=0; axes " +
                                  names + ")");
    }
    const int v = static_cast<int>(value);
    // The list (read by coordinators that know it) and the named field (by older ones).
    v1::MeshAxisCoord* entry = out->add_axes();
    entry->set_axis(MeshAxisToProto(*named));
    entry->set_index(v);
    switch (*named) {
      case MeshAxis::kPp: out->set_pp(v); break;
      case MeshAxis::kDpReplicate: out->set_dp_replicate(v); break;
      case MeshAxis::kDpShard: out->set_dp_shard(v); break;
      case MeshAxis::kCp: out->set_cp(v); break;
      case MeshAxis::kTp: out->set_tp(v); break;
      default: break;
    }
  }
  return OkStatus();
}

std::vector<std::string> RankRow(const v1::RankInfo& r, bool with_pp) {
  std::string exit = "-";
  if (r.signal() != 0) {
    exit = "signal " + std::to_string(r.signal());
  } else if (r.state() == v1::RANK_STATE_SUCCEEDED || r.state() == v1::RANK_STATE_FAILED ||
             r.state() == v1::RANK_STATE_STOPPED) {
    exit = std::to_string(r.exit_code());
  }
  std::vector<std::string> row = {std::to_string(r.rank()),
                                  r.worker_name().empty() ? r.worker_id() : r.worker_name()};
  for (std::string& cell : RankAxisCells(r, with_pp)) row.push_back(std::move(cell));
  for (std::string cell :
       {RankStateName(r.state()), r.pid() > 0 ? std::to_string(r.pid()) : "-", exit}) {
    row.push_back(std::move(cell));
  }
  return row;
}

void AddOutputOption(CLI::App* cmd, std::string* output) {
  cmd->add_option("-o,--output", *output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
}

std::string Fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

int RunJobs(const JobFlags& f) {
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  StatusOr<std::vector<v1::Job>> jobs = (*client)->ListJobs();
  if (!jobs.ok()) return ReportError(jobs.status());
  if (!f.states.empty()) {  // --state: only jobs in one of these states
    std::erase_if(*jobs, [&f](const v1::Job& job) {
      return std::find(f.states.begin(), f.states.end(), JobStateName(job.state())) ==
             f.states.end();
    });
  }
  if (f.output == "json") {
    json list = json::array();
    for (const v1::Job& job : *jobs) list.push_back(JobListEntryJson(job));
    std::cout << DumpJson(list) << std::endl;
    return kExitOk;
  }
  if (jobs->empty()) {
    std::cout << "no jobs (submit one with `meshrun submit -f JOB.yaml`)" << std::endl;
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"JOB ID", "NAME", "STATE", "STEP", "LOSS", "RESTARTS", "SUBMITTED"}};
  for (const v1::Job& job : *jobs) {
    rows.push_back({job.job_id(), job.name(), JobStateName(job.state()),
                    std::to_string(job.step()) + "/" + std::to_string(job.steps()),
                    job.step() > 0 ? Fixed(job.loss(), 4) : "-", std::to_string(job.restarts()),
                    FormatTime(job.submitted_at())});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

// The job's loss by step, from the job-level samples the coordinator keeps (in StateDb too, so
// they outlive a restart); a step trained again after a restart keeps its newest loss.
// What was measured of the job, for `predicted vs measured`: the median step time of its
// job-level samples after the first, and the largest peak memory of any rank.
// The median of a series of steps, the first left out (it warms up); 0 if none.
double MedianAfterFirst(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct Measured {
  std::vector<double> step_seconds;
  double peak_memory_bytes = 0;
  // Pipeline parallelism: the job's measured bubble of each step (the largest stage's) and the
  // schedule's theory (decision 0060); empty / < 0 without a pipeline.
  std::vector<double> pipeline_bubble;
  double pipeline_bubble_theory = -1;
  double median_step_seconds() const { return MedianAfterFirst(step_seconds); }
  double median_pipeline_bubble() const { return MedianAfterFirst(pipeline_bubble); }
};

std::map<int64_t, double> LossHistory(CoordinatorClient& client, const std::string& job_id,
                                      Measured* measured = nullptr) {
  std::map<int64_t, double> losses;
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_skip_logs(true);
  request.set_replay_only(true);
  (void)client.WatchJob(request, [&](const v1::JobEvent& e) {
    if (e.has_metrics() && !e.metrics().has_rank()) {
      losses[e.metrics().step()] = e.metrics().loss();
      if (measured != nullptr) {
        measured->step_seconds.push_back(e.metrics().step_seconds());
        measured->peak_memory_bytes = std::max(
            measured->peak_memory_bytes, static_cast<double>(e.metrics().memory_peak_bytes()));
        if (e.metrics().has_pipeline_bubble_ratio()) {
          measured->pipeline_bubble.push_back(e.metrics().pipeline_bubble_ratio());
        }
        if (e.metrics().has_pipeline_bubble_theory()) {
          measured->pipeline_bubble_theory = e.metrics().pipeline_bubble_theory();
        }
      }
    }
    return true;
  });
  return losses;
}

// "▇▆▅▄▃▂▁" of the losses, at most `width` characters (each the mean of its run of steps).
std::string Sparkline(const std::map<int64_t, double>& losses, size_t width) {
  static const char* kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> values;
  for (const auto& [step, loss] : losses) values.push_back(loss);
  if (values.empty()) return "";
  const size_t n = std::min(width, values.size());
  std::vector<double> buckets(n, 0);
  for (size_t b = 0; b < n; ++b) {
    const size_t from = b * values.size() / n, to = (b + 1) * values.size() / n;
    for (size_t i = from; i < to; ++i) buckets[b] += values[i] / double(to - from);
  }
  const auto [lo, hi] = std::minmax_element(buckets.begin(), buckets.end());
  std::string line;
  for (double v : buckets) {
    const int level = *hi > *lo ? static_cast<int>(std::lround((v - *lo) / (*hi - *lo) * 7)) : 0;
    line += kBars[std::clamp(level, 0, 7)];
  }
  return line;
}

int RunStatus(const JobFlags& f) {
  v1::ListRanksRequest page_request;
  page_request.set_job_id(f.job_id);
  page_request.set_page_size(f.page_size);
  page_request.set_page_token(f.page_token);
  page_request.set_worker(f.worker);
  for (const std::string& state : f.rank_states) {
    v1::RankState value;
    if (v1::RankState_Parse("RANK_STATE_" + state, &value)) page_request.add_states(value);
  }
  if (!f.where.empty()) {
    if (Status s = ParseWhere(f.where, page_request.mutable_coords()); !s.ok()) {
      return ReportError(s);
    }
  }
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  // The summary (no ranks: its size does not grow with the job), then the ranks a page at a
  // time (ListRanks). A coordinator from before paging ignores `summary` and sends every rank.
  v1::GetJobRequest summary_request;
  summary_request.set_job_id(f.job_id);
  summary_request.set_summary(true);
  StatusOr<v1::GetJobResponse> summary = (*client)->GetJob(summary_request);
  if (!summary.ok()) return ReportError(summary.status());
  StatusOr<v1::Job> job = std::move(*summary->mutable_job());
  const bool paged = job->ranks_size() == 0;
  std::vector<v1::RankInfo> ranks;
  std::string next_page_token;
  // One page now; with --all-ranks the next ones as they are printed (JSON: collected).
  auto next_page = [&]() -> Status {
    StatusOr<v1::ListRanksResponse> page = (*client)->ListRanks(page_request);
    if (!page.ok()) return page.status();
    for (v1::RankInfo& r : *page->mutable_ranks()) ranks.push_back(std::move(r));
    next_page_token = page->next_page_token();
    page_request.set_page_token(next_page_token);
    return OkStatus();
  };
  if (paged && job->attempt() > 0) {
    if (Status s = next_page(); !s.ok()) return ReportError(s);
    while (f.output == "json" && f.all_ranks && !next_page_token.empty()) {
      if (Status s = next_page(); !s.ok()) return ReportError(s);
    }
  } else {
    ranks.assign(job->ranks().begin(), job->ranks().end());
  }
  Measured measured;
  const std::map<int64_t, double> losses = LossHistory(**client, f.job_id, &measured);
  const v1::JobSpec& planned = job->spec();
  if (f.output == "json") {
    json out = JobStatusJson(*job);
    json page = json::array();
    for (const v1::RankInfo& r : ranks) page.push_back(RankJson(r));
    out["ranks"] = std::move(page);
    json counts = json::object();
    for (const v1::RankStateCount& c : summary->rank_states()) {
      counts[RankStateName(c.state())] = c.ranks();
    }
    out["rank_states"] = std::move(counts);
    out["workers_used"] = summary->workers_used();
    out["next_page_token"] = next_page_token;
    // The planner's side (docs/planning.md "Checked while training").
    out["mesh"] = {{"dp_replicate", planned.parallelism().dp_replicate_size()},
                   {"dp_shard", planned.parallelism().dp_shard_size()},
                   {"cp", planned.parallelism().cp_size()},
                   {"tp", planned.parallelism().tp_size()},
                   {"pp", std::max(1, planned.parallelism().pp_size())}};
    out["auto_choice"] = planned.auto_choice();
    out["predicted"] = {{"step_seconds", planned.predicted_step_seconds()},
                        {"peak_memory_bytes", planned.predicted_peak_memory_bytes()}};
    out["measured"] = {{"step_seconds", measured.median_step_seconds()},
                       {"peak_memory_bytes", measured.peak_memory_bytes}};
    // A pipeline's bubble: measured (median over steps of the largest stage's) beside theory.
    if (!measured.pipeline_bubble.empty() || measured.pipeline_bubble_theory >= 0) {
      out["pipeline_bubble"] = {
          {"measured", measured.pipeline_bubble.empty() ? json(nullptr)
                                                        : json(measured.median_pipeline_bubble())},
          {"theory", measured.pipeline_bubble_theory >= 0 ? json(measured.pipeline_bubble_theory)
                                                          : json(nullptr)}};
    }
    json history = json::array();
    for (const auto& [step, loss] : losses) history.push_back({{"step", step}, {"loss", loss}});
    out["loss_history"] = std::move(history);
    if (job->meshes_size() > 0) out["meshes"] = JobMeshesJson(*job);  // elastic jobs
    std::cout << DumpJson(out) << std::endl;
    return kExitOk;
  }
  const v1::JobSpec& spec = job->spec();
  const v1::ParallelismSpec& p = spec.parallelism();
  std::vector<std::vector<std::string>> info = {
      {"job", job->job_id() + " (" + job->name() + ")"},
      {"state", JobStateName(job->state()) + (job->message().empty() ? "" : ": " + job->message())},
      {"attempt",
       std::to_string(job->attempt()) + " (restarts " + std::to_string(job->restarts()) + ")"},
      {"mesh",
       (p.pp_size() > 1 ? "pp " + std::to_string(p.pp_size()) + " (" + p.pp_schedule() + ") x "
                        : std::string()) +
           "dp_replicate " + std::to_string(p.dp_replicate_size()) + " x dp_shard " +
           std::to_string(p.dp_shard_size()) + " x cp " + std::to_string(p.cp_size()) + " x tp " +
           std::to_string(p.tp_size()) + " = " + std::to_string(job->world_size()) + " ranks"},
      {"step", std::to_string(job->step()) + "/" + std::to_string(job->steps())},
      {"loss", job->step() > 0 ? Fixed(job->loss(), 4) : "-"},
      {"loss history", losses.empty()
                           ? "-"
                           : Sparkline(losses, 40) + "  " + Fixed(losses.begin()->second, 4) +
                                 " (step " + std::to_string(losses.begin()->first) + ") -> " +
                                 Fixed(losses.rbegin()->second, 4) + " (step " +
                                 std::to_string(losses.rbegin()->first) + "), " +
                                 std::to_string(losses.size()) + " steps"},
      {"tokens/s (last step)", Fixed(job->tokens_per_second(), 0)},
      {"MFU (last step)", Fixed(100.0 * job->mfu(), 2) + "%"},
      {"submitted", FormatTime(job->submitted_at())},
  };
  if (summary->rank_states_size() > 0) {
    std::string counts;
    for (const v1::RankStateCount& c : summary->rank_states()) {
      counts +=
          (counts.empty() ? "" : ", ") + std::to_string(c.ranks()) + " " + RankStateName(c.state());
    }
    info.push_back({"ranks", counts + " on " + std::to_string(summary->workers_used()) + " worker" +
                                 (summary->workers_used() == 1 ? "" : "s")});
  }
  if (!planned.auto_choice().empty()) info.push_back({"auto", planned.auto_choice().substr(6)});
  if (planned.predicted_step_seconds() > 0) {
    const double mib = 1024.0 * 1024.0;
    info.push_back(
        {"predicted vs measured",
         "step " + Fixed(planned.predicted_step_seconds(), 4) + " s vs " +
             (measured.step_seconds.empty() ? "-" : Fixed(measured.median_step_seconds(), 4)) +
             " s (median); peak memory per rank " +
             Fixed(static_cast<double>(planned.predicted_peak_memory_bytes()) / mib, 1) +
             " MiB vs " +
             (measured.peak_memory_bytes > 0 ? Fixed(measured.peak_memory_bytes / mib, 1) : "-") +
             " MiB"});
  }
  // A pipeline's bubble: measured (the largest stage's, median over steps) vs the schedule's.
  if (!measured.pipeline_bubble.empty() || measured.pipeline_bubble_theory >= 0) {
    info.push_back(
        {"pipeline bubble", (measured.pipeline_bubble.empty()
                                 ? std::string("-")
                                 : Fixed(100.0 * measured.median_pipeline_bubble(), 1) + "%") +
                                " measured (largest stage, median) vs " +
                                (measured.pipeline_bubble_theory >= 0
                                     ? Fixed(100.0 * measured.pipeline_bubble_theory, 1) + "%"
                                     : std::string("-")) +
                                " theory (" + p.pp_schedule() + ")"});
  }
  // An elastic job: every mesh it ran on, from which step, and why (decision 0056).
  for (int i = 0; i < job->meshes_size(); ++i) {
    const v1::JobMesh& m = job->meshes(i);
    std::string text =
        "dp_replicate " + std::to_string(m.mesh().dp_replicate_size()) + " x dp_shard " +
        std::to_string(m.mesh().dp_shard_size()) + " x cp " + std::to_string(m.mesh().cp_size()) +
        " x tp " + std::to_string(m.mesh().tp_size()) + " = " + std::to_string(m.world_size()) +
        " ranks, attempt " + std::to_string(m.attempt()) + ", from step " +
        (m.from_step() >= 0 ? std::to_string(m.from_step()) : "?") + " (" + m.cause() + ")";
    if (m.steps_lost() >= 0) text += ", " + std::to_string(m.steps_lost()) + " steps lost";
    if (m.seconds_without_training() >= 0) {
      text += ", " + Fixed(m.seconds_without_training(), 1) + " s without training";
    }
    info.push_back({i == 0 ? "meshes" : "", text});
  }
  if (job->has_started_at()) info.push_back({"started", FormatTime(job->started_at())});
  if (job->has_finished_at()) info.push_back({"finished", FormatTime(job->finished_at())});
  if (!job->last_checkpoint().empty()) info.push_back({"checkpoint", job->last_checkpoint()});
  for (auto& row : info) {
    if (!row[0].empty()) row[0] += ":";
  }
  PrintTable(std::cout, info);
  bool header_printed = false, with_pp = false;
  auto print_ranks = [&]() {
    if (ranks.empty()) return;
    std::vector<std::vector<std::string>> rows;
    // A pipelined job's table has a PP column (outermost, as the mesh orders its axes).
    if (!header_printed) with_pp = RankPipelined(ranks.front());
    if (!header_printed) {
      std::cout << '\n';
      std::vector<std::string> header = {"RANK", "WORKER"};
      for (std::string& h : RankAxisHeaders(with_pp)) header.push_back(std::move(h));
      for (const char* h : {"STATE", "PID", "EXIT"}) header.push_back(h);
      rows.push_back(std::move(header));
      header_printed = true;
    }
    for (const v1::RankInfo& r : ranks) rows.push_back(RankRow(r, with_pp));
    PrintTable(std::cout, rows);
    ranks.clear();
  };
  print_ranks();
  // --all-ranks: a page at a time, each printed before the next is asked for.
  while (f.all_ranks && !next_page_token.empty()) {
    if (Status s = next_page(); !s.ok()) return ReportError(s);
    print_ranks();
  }
  if (!next_page_token.empty() && !f.all_ranks) {
    std::cout << "\nmore ranks: meshrun status " << f.job_id << " --page-token " << next_page_token
              << " (or --all-ranks)" << std::endl;
  }
  return kExitOk;
}

void PrintLogLine(const v1::LogLine& l, bool with_attempt, bool as_json = false) {
  if (as_json) {  // one object per line; JSON escaping keeps control bytes harmless
    std::cout << DumpJson(nlohmann::json(
                     {{"rank", l.rank()}, {"attempt", l.attempt()}, {"text", l.text()}}))
              << '\n';
    return;
  }
  std::string prefix = "[rank " + std::to_string(l.rank());
  if (with_attempt) prefix += " attempt " + std::to_string(l.attempt());
  prefix += "] ";
  std::cout << prefix << EscapeText(l.text()) << '\n';
}

int RunLogs(const JobFlags& f) {
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  StatusOr<v1::Job> about = (*client)->GetJob(f.job_id);
  if (!about.ok()) return ReportError(about.status());
  const bool as_json = f.output == "json";
  if (f.rank) {
    // A rank the job does not have would print nothing and exit 0: say so instead.
    StatusOr<v1::Job> job = (*client)->GetJob(f.job_id);
    if (!job.ok()) return ReportError(job.status());
    if (job->ranks_size() > 0 && *f.rank >= job->ranks_size()) {
      return ReportError(InvalidArgumentError(
          "--rank: " + std::to_string(*f.rank) + " is not a rank of " + f.job_id + ", which has " +
          std::to_string(job->ranks_size()) + " ranks (hint: pass a rank from 0 to " +
          std::to_string(job->ranks_size() - 1) + "; `meshrun status " + f.job_id +
          "` lists them)"));
    }
  }
  if (!f.follow) {
    StatusOr<v1::GetJobLogsResponse> logs = (*client)->GetJobLogs(f.job_id, f.rank);
    if (logs.ok()) {
      bool several_attempts = false;
      for (const v1::LogLine& l : logs->lines()) {
        several_attempts |= l.attempt() != logs->lines(0).attempt();
      }
      if (logs->truncated()) {
        (as_json ? std::cerr : std::cout) << "(older lines are no longer retained)\n";
      }
      for (const v1::LogLine& l : logs->lines()) PrintLogLine(l, several_attempts, as_json);
      std::cout.flush();
      return kExitOk;
    }
    if (logs.status().code() != StatusCode::kUnimplemented) return ReportError(logs.status());
    // A coordinator without GetJobLogs: replay the retained events instead.
  }
  v1::WatchJobRequest request;
  request.set_job_id(f.job_id);
  // Text shows the training progress too: a `[job] step k/N  loss …` line per job-level sample
  // (the ranks' step lines become those samples, not log lines).
  request.set_skip_metrics(as_json);
  request.set_replay_only(!f.follow);
  if (f.rank) request.set_log_rank(*f.rank);
  uint64_t last_sequence = 0;
  bool ended = false;
  ProgressState progress;
  progress.steps = about->steps();
  Backoff backoff(std::chrono::milliseconds(200), std::chrono::milliseconds(3000));
  for (int tries = 0;; ++tries) {
    request.set_from_sequence(last_sequence + 1);
    const Status s = (*client)->WatchJob(request, [&](const v1::JobEvent& e) {
      last_sequence = std::max(last_sequence, e.sequence());
      if (e.has_log()) {
        PrintLogLine(e.log(), /*with_attempt=*/false, as_json);
        std::cout.flush();
      }
      if (e.has_metrics() && !e.metrics().has_rank() && !as_json) {
        const v1::MetricsSample& m = e.metrics();
        progress.Observe(m);
        progress.attempt = m.attempt();
        std::cout << "[job] " << RenderProgressLine(progress, 0) << std::endl;
      }
      if (e.has_state_changed()) {
        if (e.state_changed().attempt() > 0) progress.attempt = e.state_changed().attempt();
        if (IsTerminal(e.state_changed().state())) ended = true;
      }
      return true;
    });
    if (s.ok() && !f.follow) return kExitOk;
    if (s.ok() && ended) break;
    if (!s.ok() && (!CoordinatorGone(s) || !f.follow || tries > 30)) return ReportError(s);
    if (s.ok()) {
      StatusOr<v1::Job> job = (*client)->GetJob(f.job_id);
      if (job.ok() && IsTerminal(job->state())) break;
    }
    std::this_thread::sleep_for(backoff.Next());
  }
  // --follow saw the job end: its final state, and its exit code (0 only for SUCCEEDED), as
  // `submit --follow` ends.
  StatusOr<v1::Job> job = GetJobRetrying(**client, f.job_id, std::chrono::seconds(90));
  if (!job.ok()) return ReportError(job.status());
  std::string line = "job " + job->job_id() + " " + JobStateName(job->state()) + ", restarts " +
                     std::to_string(job->restarts());
  if (!job->message().empty()) line += ": " + job->message();
  (as_json ? std::cerr : std::cout) << EscapeText(line) << std::endl;
  return job->state() == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailure;
}

int RunCancel(const JobFlags& f) {
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  StatusOr<v1::Job> job = (*client)->CancelJob(f.job_id, f.reason);
  if (!job.ok() && job.status().code() == StatusCode::kFailedPrecondition) {
    // Cancelling a job that already ended is done already: say how it ended, exit 0.
    StatusOr<v1::Job> ended = (*client)->GetJob(f.job_id);
    if (ended.ok() && IsTerminal(ended->state())) {
      std::cerr << "note: job " << f.job_id << " already ended " << JobStateName(ended->state())
                << "; nothing to cancel" << std::endl;
      job = std::move(ended);
    }
  }
  if (!job.ok()) return ReportError(job.status());
  if (f.output == "json") {
    std::cout << DumpJson(JobStatusJson(*job)) << std::endl;
  } else {
    std::cout << "job " << EscapeText(job->job_id()) << " " << JobStateName(job->state())
              << std::endl;
  }
  return kExitOk;
}

CLI::App* AddJobCommand(CLI::App& app, const char* name, const char* help,
                        std::shared_ptr<JobFlags> f) {
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->add_option("JOB", f->job_id, "job id (from `meshrun submit` or `meshrun jobs`)")->required();
  AddCoordinatorOption(cmd, &f->coordinator);
  return cmd;
}

}  // namespace

void RegisterJobsCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<JobFlags>();
  CLI::App* cmd = app.add_subcommand("jobs", "List the coordinator's jobs, newest first");
  AddOutputOption(cmd, &f->output);
  cmd->add_option("--state", f->states, "only jobs in this state (repeatable)")
      ->check(CLI::IsMember({"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"},
                            CLI::ignore_case))
      ->transform([](std::string s) {
        for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return s;
      });
  AddCoordinatorOption(cmd, &f->coordinator);
  cmd->callback([f, &result] { result.run = [f] { return RunJobs(*f); }; });
}

void RegisterStatusCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<JobFlags>();
  CLI::App* cmd = AddJobCommand(app, "status", "One job with its ranks (worker, coordinates)", f);
  AddOutputOption(cmd, &f->output);
  cmd->add_option("--page-size", f->page_size, "ranks per page (at most 1000)")
      ->check(WholeNumber(1, 1000))
      ->capture_default_str();
  cmd->add_option("--page-token", f->page_token, "the page that `more ranks:` named");
  cmd->add_flag("--all-ranks", f->all_ranks, "every page of ranks, one page at a time");
  cmd->add_option("--rank-state", f->rank_states, "only ranks in this state (repeatable)")
      ->check(CLI::IsMember({"ASSIGNED", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED", "LOST"},
                            CLI::ignore_case))
      ->transform([](std::string s) {
        for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return s;
      });
  cmd->add_option("--worker", f->worker, "only ranks on this worker (name or id)");
  cmd->add_option("--where", f->where, "only ranks at these coordinates, e.g. dp_shard=3,tp=0");
  cmd->callback([f, &result] { result.run = [f] { return RunStatus(*f); }; });
}

void RegisterLogsCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<JobFlags>();
  CLI::App* cmd = AddJobCommand(app, "logs", "The log lines of a job's ranks", f);
  cmd->add_flag("--follow", f->follow, "keep printing new lines until the job ends");
  cmd->add_option("--rank", f->rank, "only this rank's lines")->check(WholeNumber(0, INT64_MAX));
  AddOutputOption(cmd, &f->output);
  cmd->callback([f, &result] { result.run = [f] { return RunLogs(*f); }; });
}

void RegisterCancelCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<JobFlags>();
  CLI::App* cmd = AddJobCommand(app, "cancel", "Cancel a pending or running job", f);
  cmd->add_option("--reason", f->reason, "recorded in the job's message");
  AddOutputOption(cmd, &f->output);
  cmd->callback([f, &result] { result.run = [f] { return RunCancel(*f); }; });
}

}  // namespace meshrun::client
