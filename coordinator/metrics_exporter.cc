// MetricsExporter: a Collectable that turns manager and RankSeries snapshots into metric
// families at scrape time.
#include "coordinator/metrics_exporter.h"

#include <netdb.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <map>
#include <thread>

#include "common/metrics_http.h"
#include "proto/state_names.h"

namespace meshrun::coordinator {
namespace {

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddGauge(prometheus::MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels,
              double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

constexpr v1::JobState kJobStates[] = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,
                                       v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,
                                       v1::JOB_STATE_CANCELLED};

// The per-rank families, from one RankSeries snapshot.
void AppendRankFamilies(const RankSeries& ranks, std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  using Labels = std::vector<prometheus::ClientMetric::Label>;
  auto step = Family("meshrun_rank_step_seconds",
                     "Wall time of each training step of the rank (all attempts of the job).",
                     MetricType::Histogram);
  auto tps = Family("meshrun_rank_tokens_per_second",
                    "global_batch_size*seq_len / the rank's newest step time.", MetricType::Gauge);
  auto flops = Family("meshrun_rank_model_flops_per_second",
                      "Model FLOP/s of the job as seen from the rank's newest step time.",
                      MetricType::Gauge);
  auto mfu = Family("meshrun_rank_mfu_ratio",
                    "Model FLOPs utilization of the rank's newest step (0..1).", MetricType::Gauge);
  auto tokens_total = Family("meshrun_rank_tokens_total",
                             "Tokens of every step the rank finished (global_batch_size*seq_len "
                             "each; all attempts of the job).",
                             MetricType::Counter);
  auto steps_total =
      Family("meshrun_rank_steps_total", "Steps the rank finished (all attempts of the job).",
             MetricType::Counter);
  auto flops_total =
      Family("meshrun_rank_model_flops_total",
             "Model FLOPs of every step the rank finished (all attempts of the job).",
             MetricType::Counter);
  auto loss = Family("meshrun_rank_loss", "Loss of the global batch of the rank's newest step.",
                     MetricType::Gauge);
  auto memory = Family("meshrun_rank_memory_bytes",
                       "Memory of the rank (device, or host on cpu) by kind: allocated now, peak "
                       "since start, reserved by the allocator.",
                       MetricType::Gauge);
  auto comm_seconds = Family("meshrun_rank_comm_seconds_total",
                             "Seconds the rank spent in communication, by axis and op (earlier "
                             "attempts included).",
                             MetricType::Counter);
  auto comm_exposed = Family("meshrun_rank_comm_exposed_seconds_total",
                             "Of meshrun_rank_comm_seconds_total, the seconds the rank was blocked "
                             "waiting for communication, by axis and op (earlier attempts "
                             "included).",
                             MetricType::Counter);
  auto comm_overlapped = Family("meshrun_rank_comm_overlapped_seconds_total",
                                "Of meshrun_rank_comm_seconds_total, the seconds communication "
                                "overlapped with the rank's compute, by axis and op (earlier "
                                "attempts included).",
                                MetricType::Counter);
  auto comm_bytes = Family("meshrun_rank_comm_bytes_total",
                           "Bus bytes (nccl-tests' measure) the rank moved, by axis and op "
                           "(earlier attempts included).",
                           MetricType::Counter);
  auto bubble = Family("meshrun_rank_pipeline_bubble_ratio",
                       "Pipeline parallelism: the fraction of the rank's newest step its stage "
                       "waited for its neighbouring stages (0..1); only ranks that report it.",
                       MetricType::Gauge);
  auto bubble_theory = Family("meshrun_rank_pipeline_bubble_theory_ratio",
                              "Pipeline parallelism: the bubble of the rank's schedule in theory "
                              "(zero_bubble's at the rank's measured forward, backward and "
                              "weight times; decisions 0060, 0068), beside "
                              "meshrun_rank_pipeline_bubble_ratio; only ranks that report it.",
                              MetricType::Gauge);
  auto info = Family("meshrun_rank_info",
                     "1 per rank of a job's newest attempt: joins rank series to node series "
                     "(worker = DCGM's Hostname, gpu = its gpu).",
                     MetricType::Gauge);
  const std::vector<double>& bounds = RankSeries::StepSecondsBounds();
  for (const RankSeries::Job& job : ranks.Snapshot()) {
    for (const RankSeries::Rank& r : job.ranks) {
      const MeshCoords& c = r.placement.coords;
      const Labels base = {{"job_id", job.job_id},
                           {"rank", std::to_string(r.rank)},
                           {"worker", r.placement.worker},
                           {"pp", std::to_string(c.pp)},
                           {"dp_replicate", std::to_string(c.dp_replicate)},
                           {"dp_shard", std::to_string(c.dp_shard)},
                           {"cp", std::to_string(c.cp)},
                           {"tp", std::to_string(c.tp)}};
      auto with = [&base](std::initializer_list<prometheus::ClientMetric::Label> extra) {
        Labels labels = base;
        labels.insert(labels.end(), extra.begin(), extra.end());
        return labels;
      };
      prometheus::ClientMetric h;
      h.label = base;
      h.histogram.sample_count = r.step_count;
      h.histogram.sample_sum = r.step_sum;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < r.step_buckets.size(); ++i) {
        cumulative += r.step_buckets[i];
        h.histogram.bucket.push_back(
            {cumulative, i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity()});
      }
      step.metric.push_back(std::move(h));
      AddGauge(tps, base, r.tokens_per_second);
      AddGauge(flops, base, r.model_flops_per_second);
      AddGauge(mfu, base, r.mfu);
      AddGauge(tokens_total, base, r.tokens_total);
      AddGauge(steps_total, base, static_cast<double>(r.step_count));
      AddGauge(flops_total, base, r.model_flops_total);
      AddGauge(loss, base, r.loss);
      if (r.pipeline_bubble_ratio >= 0) AddGauge(bubble, base, r.pipeline_bubble_ratio);
      if (r.pipeline_bubble_theory >= 0) {
        AddGauge(bubble_theory, base, r.pipeline_bubble_theory);
      }
      AddGauge(memory, with({{"kind", "allocated"}}), static_cast<double>(r.memory_allocated));
      AddGauge(memory, with({{"kind", "peak"}}), static_cast<double>(r.memory_peak));
      AddGauge(memory, with({{"kind", "reserved"}}), static_cast<double>(r.memory_reserved));
      for (const auto& [key, totals] : r.comm) {
        const Labels labels =
            with({{"axis", MeshAxisName(key.first)}, {"op", OpLabel(key.second)}});
        AddGauge(comm_seconds, labels, totals.seconds);
        const double overlapped = std::clamp(totals.overlapped_seconds, 0.0, totals.seconds);
        AddGauge(comm_exposed, labels, totals.seconds - overlapped);
        AddGauge(comm_overlapped, labels, overlapped);
        AddGauge(comm_bytes, labels, totals.bytes);
      }
      const bool gpu = r.placement.device == "cuda";
      AddGauge(info,
               with({{"attempt", std::to_string(r.attempt)},
                     {"device", r.placement.device},
                     {"gpu", gpu ? std::to_string(r.placement.local_rank) : ""}}),
               1);
    }
  }
  for (auto* f : {&step, &tps, &flops, &mfu, &tokens_total, &steps_total, &flops_total, &loss,
                  &memory, &comm_seconds, &comm_exposed, &comm_overlapped, &comm_bytes, &bubble,
                  &bubble_theory, &info}) {
    out.push_back(std::move(*f));
  }
}

// ---- Elastic jobs (decision 0056) -------------------------------------------------------------
// meshrun_job_world_size (every job) and the re-mesh series of elastic jobs. Kept in this one
// function so that another change exporting meshrun_job_world_size merges into it.
void AppendElasticJobFamilies(const JobsSnapshot& snap,
                              std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  auto world = Family("meshrun_job_world_size",
                      "Ranks of the mesh the job runs on, pp_size*dp_replicate_size*dp_shard_size*"
                      "cp_size*tp_size (an elastic job's current mesh).",
                      MetricType::Gauge);
  auto remeshes = Family("meshrun_job_remeshes_total",
                         "Mesh changes of an elastic job (shrunk after a lost worker, grown, "
                         "drained).",
                         MetricType::Counter);
  auto lost = Family("meshrun_job_remesh_steps_lost_total",
                     "Steps an elastic job did again after its mesh changes (the step reached "
                     "minus the step resumed from, summed).",
                     MetricType::Counter);
  auto idle = Family("meshrun_job_remesh_seconds_without_training_total",
                     "Seconds from the end of an elastic job's attempt on one mesh to its first "
                     "step on the next, summed.",
                     MetricType::Counter);
  for (const JobsSnapshot::JobLine& j : snap.jobs) {
    AddGauge(world, {{"job_id", j.job_id}}, j.world_size);
    if (!j.elastic) continue;
    AddGauge(remeshes, {{"job_id", j.job_id}}, j.remeshes);
    AddGauge(lost, {{"job_id", j.job_id}}, static_cast<double>(j.remesh_steps_lost));
    AddGauge(idle, {{"job_id", j.job_id}}, j.remesh_seconds_without_training);
  }
  for (auto* f : {&world, &remeshes, &lost, &idle}) out.push_back(std::move(*f));
}

}  // namespace

std::vector<prometheus::MetricFamily> MetricsExporter::Collect(
    const JobsSnapshot& snap, const std::vector<v1::WorkerInfo>& worker_list,
    const RankSeries* ranks) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;

  auto jobs = Family("meshrun_jobs", "Jobs known to the coordinator, by state.", MetricType::Gauge);
  for (v1::JobState s : kJobStates) {
    auto it = snap.jobs_by_state.find(s);
    AddGauge(jobs, {{"state", JobStateName(s)}}, it == snap.jobs_by_state.end() ? 0 : it->second);
  }
  out.push_back(std::move(jobs));

  std::map<std::string, int> by_state = {{"READY", 0}, {"BUSY", 0}, {"LOST", 0}};
  for (const v1::WorkerInfo& w : worker_list) ++by_state[WorkerStateName(w.state())];
  auto workers = Family("meshrun_workers", "Registered workers, by state.", MetricType::Gauge);
  for (const auto& [state, n] : by_state) AddGauge(workers, {{"state", state}}, n);
  out.push_back(std::move(workers));

  auto state = Family("meshrun_job_state",
                      "1 for the state each job is in (PENDING and RUNNING jobs and the 100 "
                      "newest finished ones).",
                      MetricType::Gauge);
  auto step =
      Family("meshrun_job_step", "Step of the job's newest job-level sample.", MetricType::Gauge);
  auto tps = Family("meshrun_job_tokens_per_second",
                    "global_batch_size*seq_len / the slowest rank's step time.", MetricType::Gauge);
  auto tokens = Family("meshrun_job_tokens_total",
                       "Tokens of the job's completed steps (global_batch_size*seq_len each, "
                       "repeated steps after a restart included) since the coordinator started.",
                       MetricType::Counter);
  auto mfu = Family("meshrun_job_mfu_ratio",
                    "Model FLOPs utilization of the job's tokens/s (global_batch_size*seq_len / "
                    "the slowest rank's step time) over the ranks' summed peak FLOP/s (0..1).",
                    MetricType::Gauge);
  auto restarts = Family("meshrun_job_restarts_total", "Attempts started after a failure.",
                         MetricType::Counter);
  auto skew = Family("meshrun_job_step_time_skew",
                     "Slowest rank's recent step time / median of the ranks' recent step times "
                     "(recent: mean of the last 8 steps; 1 with one rank, 0 before a step).",
                     MetricType::Gauge);
  auto predicted_step = Family("meshrun_job_predicted_step_seconds",
                               "The planner's predicted step time of the job as it runs, made "
                               "at submission on the registered workers' calibrated figures.",
                               MetricType::Gauge);
  auto predicted_memory =
      Family("meshrun_job_predicted_peak_memory_bytes",
             "The planner's predicted peak memory of one rank of the job.", MetricType::Gauge);
  for (const JobsSnapshot::JobLine& j : snap.jobs) {
    if (j.predicted_step_seconds > 0) {
      AddGauge(predicted_step, {{"job_id", j.job_id}}, j.predicted_step_seconds);
      AddGauge(predicted_memory, {{"job_id", j.job_id}}, j.predicted_peak_memory_bytes);
    }
    for (v1::JobState s : kJobStates) {
      AddGauge(state, {{"job_id", j.job_id}, {"state", JobStateName(s)}}, s == j.state ? 1 : 0);
    }
    AddGauge(step, {{"job_id", j.job_id}}, static_cast<double>(j.step));
    AddGauge(tps, {{"job_id", j.job_id}}, j.tokens_per_second);
    AddGauge(tokens, {{"job_id", j.job_id}}, j.tokens_total);
    AddGauge(mfu, {{"job_id", j.job_id}}, j.mfu);
    AddGauge(restarts, {{"job_id", j.job_id}}, j.restarts);
    AddGauge(skew, {{"job_id", j.job_id}}, j.step_time_skew);
  }
  for (auto* f :
       {&state, &step, &tps, &tokens, &mfu, &restarts, &skew, &predicted_step, &predicted_memory}) {
    out.push_back(std::move(*f));
  }
  AppendElasticJobFamilies(snap, out);
  if (ranks != nullptr) AppendRankFamilies(*ranks, out);
  return out;
}

class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  Collector(JobsFn jobs, WorkersFn workers, std::shared_ptr<const RankSeries> ranks)
      : jobs_(std::move(jobs)), workers_(std::move(workers)), ranks_(std::move(ranks)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    return MetricsExporter::Collect(jobs_(), workers_(), ranks_.get());
  }

 private:
  JobsFn jobs_;
  WorkersFn workers_;
  std::shared_ptr<const RankSeries> ranks_;
};

StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& listen, JobsFn jobs, WorkersFn workers,
    std::shared_ptr<const RankSeries> ranks) {
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collector_ =
      std::make_shared<Collector>(std::move(jobs), std::move(workers), std::move(ranks));
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(MetricsHttpOptions(listen));
  } catch (const std::exception& ex) {
    return FailedPreconditionError("--metrics-listen: cannot serve metrics on '" + listen + "': " +
                                   ex.what() + " (hint: use a free HOST:PORT, e.g. 127.0.0.1:0)");
  }
  e->exposer_->RegisterCollectable(e->collector_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  const size_t colon = listen.rfind(':');
  e->host_ = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (e->host_.size() > 2 && e->host_.front() == '[')
    e->host_ = e->host_.substr(1, e->host_.size() - 2);
  if (e->host_.empty() || e->host_ == "0.0.0.0" || e->host_ == "*") e->host_ = "127.0.0.1";
  if (e->host_ == "::") e->host_ = "::1";
  return e;
}

MetricsExporter::~MetricsExporter() {
  if (!exposer_) return;
  // civetweb's listener polls with a two-second timeout before it notices the stop flag;
  // connecting to it wakes it, so a coordinator stops at once.
  std::atomic<bool> stopped{false};
  std::thread waker([&] {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    if (getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &addrs) != 0) return;
    while (!stopped) {
      const int fd = socket(addrs->ai_family, addrs->ai_socktype, addrs->ai_protocol);
      if (fd >= 0) {
        (void)connect(fd, addrs->ai_addr, addrs->ai_addrlen);
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    freeaddrinfo(addrs);
  });
  exposer_.reset();
  stopped = true;
  waker.join();
}

}  // namespace meshrun::coordinator
