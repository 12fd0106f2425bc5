// The coordinator's Prometheus series (docs/metrics.md): RankSeries fed with the
// samples of a 2-rank job, the families MetricsExporter::Collect builds from it (every series
// and label set, counters that stay monotonic across an attempt change, retention of finished
// jobs), the step-time skew of StepAggregator, and one real scrape over HTTP.
#include "coordinator/metrics_exporter.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/metric_family.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "coordinator/rank_series.h"
#include "coordinator/step_aggregator.h"
#include "tests/deploy/observability.h"

namespace meshrun::coordinator {
namespace {

using Labels = std::map<std::string, std::string>;

const std::vector<std::string> kRankLabels = {"job_id",       "rank",     "worker", "pp",
                                              "dp_replicate", "dp_shard", "cp",     "tp"};

v1::MetricsSample Sample(const std::string& job, int attempt, int rank, int64_t step,
                         double seconds, uint64_t tp_bytes) {
  v1::MetricsSample s;
  s.set_job_id(job);
  s.set_attempt(attempt);
  s.set_rank(rank);
  s.set_step(step);
  s.set_loss(4.0 - 0.1 * static_cast<double>(step));
  s.set_step_seconds(seconds);
  s.set_tokens_per_second(1000.0 + rank);
  s.set_tflops(0.5);
  s.set_mfu(0.25);
  s.set_memory_allocated_bytes(100);
  s.set_memory_peak_bytes(300);
  s.set_memory_reserved_bytes(400);
  v1::CommStats* c = s.add_comm();
  c->set_axis(v1::MESH_AXIS_TP);
  c->set_op(v1::COMM_OP_ALL_REDUCE);
  c->set_seconds(static_cast<double>(tp_bytes) / 1000.0);
  c->set_bytes(tp_bytes);
  c->set_calls(step);
  c = s.add_comm();
  c->set_axis(v1::MESH_AXIS_DP_SHARD);
  c->set_op(v1::COMM_OP_ALL_GATHER);
  c->set_seconds(0.01);
  c->set_overlapped_seconds(0.004);  // an asynchronous gather that ran beside compute
  c->set_bytes(64);
  c->set_calls(1);
  return s;
}

// Rank r of the 1x1x1x2 mesh (dp_replicate, dp_shard, cp, tp) sits on worker "node-r".
RankLabels Placement(int rank, const std::string& device = "cpu") {
  RankLabels p;
  p.worker = "node-" + std::to_string(rank);
  p.coords.tp = rank;
  p.device = device;
  p.local_rank = 0;
  return p;
}

Labels LabelsOf(const prometheus::ClientMetric& m) {
  Labels out;
  for (const auto& l : m.label) out[l.name] = l.value;
  return out;
}

const prometheus::MetricFamily* FindFamily(const std::vector<prometheus::MetricFamily>& fs,
                                           const std::string& name) {
  for (const auto& f : fs) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The metric of `family` whose labels include every entry of `want`; null if none or several.
const prometheus::ClientMetric* Find(const std::vector<prometheus::MetricFamily>& fs,
                                     const std::string& family, const Labels& want) {
  const prometheus::MetricFamily* f = FindFamily(fs, family);
  if (f == nullptr) return nullptr;
  const prometheus::ClientMetric* found = nullptr;
  for (const auto& m : f->metric) {
    const Labels have = LabelsOf(m);
    bool match = true;
    for (const auto& [k, v] : want) match = match && have.count(k) && have.at(k) == v;
    if (!match) continue;
    if (found != nullptr) return nullptr;
    found = &m;
  }
  return found;
}

std::vector<prometheus::MetricFamily> CollectRanks(const RankSeries& ranks) {
  return MetricsExporter::Collect(JobsSnapshot{}, {}, &ranks);
}

TEST(RankSeriesExport, EverySeriesWithItsLabels) {
  RankSeries ranks;
  for (int step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ranks.Add(Placement(rank), Sample("job-1", 1, rank, step, 0.02 * step + rank, 1000 * step));
    }
  }
  const auto fs = CollectRanks(ranks);
  struct Want {
    const char* name;
    prometheus::MetricType type;
    size_t per_rank;  // metrics per rank
    std::vector<std::string> extra_labels;
  };
  const std::vector<Want> wants = {
      {"meshrun_rank_step_seconds", prometheus::MetricType::Histogram, 1, {}},
      {"meshrun_rank_tokens_per_second", prometheus::MetricType::Gauge, 1, {}},
      {"meshrun_rank_model_flops_per_second", prometheus::MetricType::Gauge, 1, {}},
      {"meshrun_rank_mfu_ratio", prometheus::MetricType::Gauge, 1, {}},
      {"meshrun_rank_tokens_total", prometheus::MetricType::Counter, 1, {}},
      {"meshrun_rank_steps_total", prometheus::MetricType::Counter, 1, {}},
      {"meshrun_rank_model_flops_total", prometheus::MetricType::Counter, 1, {}},
      {"meshrun_rank_loss", prometheus::MetricType::Gauge, 1, {}},
      {"meshrun_rank_memory_bytes", prometheus::MetricType::Gauge, 3, {"kind"}},
      {"meshrun_rank_comm_seconds_total", prometheus::MetricType::Counter, 2, {"axis", "op"}},
      {"meshrun_rank_comm_exposed_seconds_total",
       prometheus::MetricType::Counter,
       2,
       {"axis", "op"}},
      {"meshrun_rank_comm_overlapped_seconds_total",
       prometheus::MetricType::Counter,
       2,
       {"axis", "op"}},
      {"meshrun_rank_comm_bytes_total", prometheus::MetricType::Counter, 2, {"axis", "op"}},
      {"meshrun_rank_info", prometheus::MetricType::Gauge, 1, {"attempt", "device", "gpu"}},
  };
  for (const Want& w : wants) {
    const prometheus::MetricFamily* f = FindFamily(fs, w.name);
    ASSERT_NE(f, nullptr) << w.name;
    EXPECT_EQ(f->type, w.type) << w.name;
    EXPECT_FALSE(f->help.empty()) << w.name;
    ASSERT_EQ(f->metric.size(), 2 * w.per_rank) << w.name;
    std::set<std::string> expected(kRankLabels.begin(), kRankLabels.end());
    expected.insert(w.extra_labels.begin(), w.extra_labels.end());
    for (const auto& m : f->metric) {
      std::set<std::string> names;
      for (const auto& [k, v] : LabelsOf(m)) names.insert(k);
      EXPECT_EQ(names, expected) << w.name;
    }
  }

  // Placement labels.
  const auto* loss1 = Find(fs, "meshrun_rank_loss", {{"job_id", "job-1"}, {"rank", "1"}});
  ASSERT_NE(loss1, nullptr);
  EXPECT_EQ(LabelsOf(*loss1), (Labels{{"job_id", "job-1"},
                                      {"rank", "1"},
                                      {"worker", "node-1"},
                                      {"pp", "0"},
                                      {"dp_replicate", "0"},
                                      {"dp_shard", "0"},
                                      {"cp", "0"},
                                      {"tp", "1"}}));
  EXPECT_DOUBLE_EQ(loss1->gauge.value, 4.0 - 0.3);  // the newest step's
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_tokens_per_second", {{"rank", "1"}})->gauge.value, 1001);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_mfu_ratio", {{"rank", "0"}})->gauge.value, 0.25);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_model_flops_per_second", {{"rank", "0"}})->gauge.value,
                   0.5e12);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_rank_memory_bytes", {{"rank", "0"}, {"kind", "allocated"}})->gauge.value,
      100);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_rank_memory_bytes", {{"rank", "0"}, {"kind", "peak"}})->gauge.value, 300);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_rank_memory_bytes", {{"rank", "0"}, {"kind", "reserved"}})->gauge.value,
      400);

  // Counters: the newest cumulative values, axis and op as the engine names them.
  const auto* tp_bytes = Find(fs, "meshrun_rank_comm_bytes_total",
                              {{"rank", "0"}, {"axis", "tp"}, {"op", "all_reduce"}});
  ASSERT_NE(tp_bytes, nullptr);
  EXPECT_DOUBLE_EQ(tp_bytes->counter.value, 3000);
  const auto* tp_seconds = Find(fs, "meshrun_rank_comm_seconds_total",
                                {{"rank", "0"}, {"axis", "tp"}, {"op", "all_reduce"}});
  ASSERT_NE(tp_seconds, nullptr);
  EXPECT_DOUBLE_EQ(tp_seconds->counter.value, 3.0);
  EXPECT_NE(Find(fs, "meshrun_rank_comm_bytes_total",
                 {{"rank", "1"}, {"axis", "dp_shard"}, {"op", "all_gather"}}),
            nullptr);
  // Exposed + overlapped = the total; a sample without overlap is all exposed.
  const Labels gather = {{"rank", "1"}, {"axis", "dp_shard"}, {"op", "all_gather"}};
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_comm_overlapped_seconds_total", gather)->counter.value,
                   0.004);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_comm_exposed_seconds_total", gather)->counter.value,
                   0.01 - 0.004);
  const Labels reduce = {{"rank", "0"}, {"axis", "tp"}, {"op", "all_reduce"}};
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_comm_exposed_seconds_total", reduce)->counter.value, 3.0);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_comm_overlapped_seconds_total", reduce)->counter.value,
                   0);

  // Histogram: three steps of rank 0 (20, 40, 60 ms) and of rank 1 (1.02, 1.04, 1.06 s).
  const auto* h0 = Find(fs, "meshrun_rank_step_seconds", {{"rank", "0"}});
  ASSERT_NE(h0, nullptr);
  EXPECT_EQ(h0->histogram.sample_count, 3u);
  EXPECT_NEAR(h0->histogram.sample_sum, 0.12, 1e-12);
  const auto& buckets = h0->histogram.bucket;
  ASSERT_EQ(buckets.size(), RankSeries::StepSecondsBounds().size() + 1);
  EXPECT_DOUBLE_EQ(buckets.front().upper_bound, 0.001);
  EXPECT_DOUBLE_EQ(buckets[buckets.size() - 2].upper_bound, 60);
  EXPECT_EQ(buckets.back().upper_bound, std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < buckets.size(); ++i) {
    const double le = buckets[i].upper_bound;
    const uint64_t want = (0.02 <= le) + (0.04 <= le) + (0.06 <= le);
    EXPECT_EQ(buckets[i].cumulative_count, want) << "le=" << le;
  }
  const auto* h1 = Find(fs, "meshrun_rank_step_seconds", {{"rank", "1"}});
  ASSERT_NE(h1, nullptr);
  EXPECT_EQ(h1->histogram.bucket[9].cumulative_count, 0u);   // le=1
  EXPECT_EQ(h1->histogram.bucket[10].cumulative_count, 3u);  // le=2.5

  // Join gauge: cpu ranks have gpu="".
  const auto* info = Find(fs, "meshrun_rank_info", {{"rank", "1"}});
  ASSERT_NE(info, nullptr);
  EXPECT_DOUBLE_EQ(info->gauge.value, 1);
  EXPECT_EQ(LabelsOf(*info).at("attempt"), "1");
  EXPECT_EQ(LabelsOf(*info).at("device"), "cpu");
  EXPECT_EQ(LabelsOf(*info).at("gpu"), "");
}

TEST(RankSeriesExport, CudaRankInfoNamesItsLocalDevice) {
  RankSeries ranks;
  RankLabels p = Placement(3, "cuda");
  p.local_rank = 3;
  ranks.Add(p, Sample("job-g", 1, 3, 1, 0.1, 10));
  const auto fs = CollectRanks(ranks);
  const auto* info = Find(fs, "meshrun_rank_info", {{"rank", "3"}});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(LabelsOf(*info).at("device"), "cuda");
  EXPECT_EQ(LabelsOf(*info).at("gpu"), "3");
  EXPECT_EQ(LabelsOf(*info).at("worker"), "node-3");
}

TEST(RankSeriesExport, CountersStayMonotonicAcrossAttempts) {
  RankSeries ranks;
  auto bytes = [&ranks] {
    const auto fs = CollectRanks(ranks);
    const auto* m = Find(fs, "meshrun_rank_comm_bytes_total",
                         {{"rank", "0"}, {"axis", "tp"}, {"op", "all_reduce"}});
    return m == nullptr ? -1.0 : m->counter.value;
  };
  auto step_count = [&ranks] {
    const auto fs = CollectRanks(ranks);
    return Find(fs, "meshrun_rank_step_seconds", {{"rank", "0"}})->histogram.sample_count;
  };
  ranks.Add(Placement(0), Sample("job-r", 1, 0, 1, 0.1, 500));
  ranks.Add(Placement(0), Sample("job-r", 1, 0, 2, 0.1, 1000));
  EXPECT_DOUBLE_EQ(bytes(), 1000);
  // A sample that overtook a newer one never lowers a counter, nor counts a step twice.
  ranks.Add(Placement(0), Sample("job-r", 1, 0, 2, 0.1, 900));
  EXPECT_DOUBLE_EQ(bytes(), 1000);
  EXPECT_EQ(step_count(), 2u);

  // Attempt 2 resumes from a checkpoint at step 1: its counters start again from 0, on
  // another worker.
  RankLabels moved = Placement(0);
  moved.worker = "node-9";
  ranks.Add(moved, Sample("job-r", 2, 0, 2, 0.1, 200));
  EXPECT_DOUBLE_EQ(bytes(), 1200);
  ranks.Add(moved, Sample("job-r", 2, 0, 3, 0.1, 400));
  EXPECT_DOUBLE_EQ(bytes(), 1400);
  EXPECT_EQ(step_count(), 4u) << "the histogram keeps counting across attempts";
  // A late sample of attempt 1 is ignored.
  ranks.Add(Placement(0), Sample("job-r", 1, 0, 3, 0.1, 5000));
  EXPECT_DOUBLE_EQ(bytes(), 1400);
  const auto fs = CollectRanks(ranks);
  // The counters beside the rate gauges count the same 4 steps, across both attempts: rank 0's
  // samples say 1000 tokens/s and 0.5 TFLOP/s for 0.1 s, i.e. 100 tokens and 5e10 FLOPs a step.
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_steps_total", {{"rank", "0"}})->counter.value, 4);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_tokens_total", {{"rank", "0"}})->counter.value, 400);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_rank_model_flops_total", {{"rank", "0"}})->counter.value,
                   4 * 5e10);
  const auto* info = Find(fs, "meshrun_rank_info", {{"rank", "0"}});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(LabelsOf(*info).at("attempt"), "2");
  EXPECT_EQ(LabelsOf(*info).at("worker"), "node-9");
}

// Prometheus attaches its target labels (job = the scrape job, instance = the address) to every
// series; an exported label of the same name is renamed exported_job/exported_instance under a
// standard scrape config, and every dashboard selector on it comes back empty. Ratios end in
// _ratio and rates are per second in base units (no tflops).
TEST(RankSeriesExport, NoLabelCollidesWithATargetLabelAndNamesFollowTheConventions) {
  RankSeries ranks;
  ranks.Add(Placement(0), Sample("job-1", 1, 0, 1, 0.1, 100));
  JobsSnapshot snap;
  snap.jobs.push_back({"job-1", "demo", v1::JOB_STATE_RUNNING, 1, 10, 0.2, 1.0, 0});
  const auto fs = MetricsExporter::Collect(snap, {}, &ranks);
  ASSERT_FALSE(fs.empty());
  for (const prometheus::MetricFamily& f : fs) {
    EXPECT_EQ(f.name.find("tflops"), std::string::npos) << f.name;
    if (f.name.find("mfu") != std::string::npos) {
      EXPECT_TRUE(f.name.ends_with("_mfu_ratio")) << f.name;
    }
    if (f.type == prometheus::MetricType::Counter) {
      EXPECT_TRUE(f.name.ends_with("_total")) << f.name;
    }
    for (const auto& m : f.metric) {
      for (const auto& [k, v] : LabelsOf(m)) {
        EXPECT_NE(k, "job") << f.name;
        EXPECT_NE(k, "instance") << f.name;
      }
    }
  }
  ASSERT_NE(Find(fs, "meshrun_job_mfu_ratio", {{"job_id", "job-1"}}), nullptr);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_mfu_ratio", {{"job_id", "job-1"}})->gauge.value, 0.2);
}

TEST(RankSeriesExport, FinishedJobsAreKeptForTheNewest32) {
  RankSeries ranks;
  const int n = static_cast<int>(RankSeries::kMaxFinishedJobs) + 3;
  for (int j = 0; j < n; ++j) {
    ranks.Add(Placement(0), Sample("job-" + std::to_string(j), 1, 0, 1, 0.1, 10));
  }
  ranks.Add(Placement(0), Sample("running", 1, 0, 1, 0.1, 10));
  for (int j = 0; j < n; ++j) ranks.JobFinished("job-" + std::to_string(j));
  ranks.JobFinished("never-sampled");  // nothing to keep
  std::set<std::string> served;
  for (const RankSeries::Job& job : ranks.Snapshot()) served.insert(job.job_id);
  EXPECT_EQ(served.size(), RankSeries::kMaxFinishedJobs + 1);
  EXPECT_TRUE(served.count("running"));
  EXPECT_FALSE(served.count("job-0"));
  EXPECT_FALSE(served.count("job-2"));
  EXPECT_TRUE(served.count("job-3"));
  EXPECT_TRUE(served.count("job-" + std::to_string(n - 1)));
  // A finished job takes no more samples.
  ranks.Add(Placement(0), Sample("job-" + std::to_string(n - 1), 2, 0, 5, 0.1, 10));
  for (const RankSeries::Job& job : ranks.Snapshot()) {
    if (job.job_id == "job-" + std::to_string(n - 1)) {
      EXPECT_EQ(job.ranks[0].attempt, 1);
    }
  }
}

TEST(JobSeriesExport, JobAndClusterSeries) {
  JobsSnapshot snap;
  snap.jobs_by_state[v1::JOB_STATE_RUNNING] = 1;
  snap.jobs.push_back({"job-1", "demo", v1::JOB_STATE_RUNNING, 12, 5000, 0.3, 1.25, 1, 6144});
  std::vector<v1::WorkerInfo> workers(2);
  workers[0].set_state(v1::WORKER_STATE_BUSY);
  workers[1].set_state(v1::WORKER_STATE_READY);
  const auto fs = MetricsExporter::Collect(snap, workers, nullptr);
  EXPECT_EQ(FindFamily(fs, "meshrun_rank_loss"), nullptr) << "no RankSeries, no rank series";
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_jobs", {{"state", "RUNNING"}})->gauge.value, 1);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_jobs", {{"state", "FAILED"}})->gauge.value, 0);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_workers", {{"state", "BUSY"}})->gauge.value, 1);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_workers", {{"state", "LOST"}})->gauge.value, 0);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_job_state", {{"job_id", "job-1"}, {"state", "RUNNING"}})->gauge.value, 1);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_job_state", {{"job_id", "job-1"}, {"state", "PENDING"}})->gauge.value, 0);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_step", {{"job_id", "job-1"}})->gauge.value, 12);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_tokens_per_second", {{"job_id", "job-1"}})->gauge.value,
                   5000);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_mfu_ratio", {{"job_id", "job-1"}})->gauge.value, 0.3);
  EXPECT_EQ(FindFamily(fs, "meshrun_job_tokens_total")->type, prometheus::MetricType::Counter);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_tokens_total", {{"job_id", "job-1"}})->counter.value,
                   6144);
  EXPECT_EQ(FindFamily(fs, "meshrun_job_restarts_total")->type, prometheus::MetricType::Counter);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_restarts_total", {{"job_id", "job-1"}})->counter.value, 1);
  EXPECT_DOUBLE_EQ(Find(fs, "meshrun_job_step_time_skew", {{"job_id", "job-1"}})->gauge.value,
                   1.25);
}

// The planner's prediction is exported beside the measurement for a job that has one.
TEST(JobSeriesExport, PredictionsOfJobsThatHaveOne) {
  JobsSnapshot snap;
  snap.jobs.push_back({"job-1", "demo", v1::JOB_STATE_RUNNING, 12, 5000, 0.3, 1.25, 1, 6144});
  snap.jobs.back().predicted_step_seconds = 0.25;
  snap.jobs.back().predicted_peak_memory_bytes = 3e6;
  snap.jobs.push_back({"job-2", "demo", v1::JOB_STATE_RUNNING, 1, 5000, 0.3, 1.25, 1, 6144});
  const auto fs = MetricsExporter::Collect(snap, {}, nullptr);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_job_predicted_step_seconds", {{"job_id", "job-1"}})->gauge.value, 0.25);
  EXPECT_DOUBLE_EQ(
      Find(fs, "meshrun_job_predicted_peak_memory_bytes", {{"job_id", "job-1"}})->gauge.value, 3e6);
  EXPECT_EQ(Find(fs, "meshrun_job_predicted_step_seconds", {{"job_id", "job-2"}}), nullptr)
      << "no prediction, no series";
}

v1::MetricsSample Timed(int rank, int64_t step, double seconds) {
  v1::MetricsSample s;
  s.set_job_id("j");
  s.set_attempt(1);
  s.set_rank(rank);
  s.set_step(step);
  s.set_step_seconds(seconds);
  return s;
}

TEST(StepTimeSkew, SlowestRecentOverMedian) {
  StepAggregator one(1, 1024);
  EXPECT_DOUBLE_EQ(one.last_skew(), 0) << "before the first step";
  ASSERT_TRUE(one.Add(Timed(0, 1, 0.5)).has_value());
  EXPECT_DOUBLE_EQ(one.last_skew(), 1.0) << "one rank";

  // Three ranks: recent means 1.0, 1.0 and 2.0 -> 2.0 / median 1.0.
  StepAggregator three(3, 1024);
  for (int64_t step = 1; step <= 2; ++step) {
    three.Add(Timed(0, step, 1.0));
    three.Add(Timed(1, step, step == 1 ? 0.5 : 1.5));  // mean 1.0
    three.Add(Timed(2, step, 2.0));
  }
  EXPECT_DOUBLE_EQ(three.last_skew(), 2.0);

  // Recent = the last kSkewWindow steps: an old slow step of rank 2 ages out.
  StepAggregator two(2, 1024);
  two.Add(Timed(0, 1, 1.0));
  two.Add(Timed(1, 1, 9.0));
  EXPECT_DOUBLE_EQ(two.last_skew(), 9.0 / 5.0);
  for (int64_t step = 2; step <= 1 + static_cast<int64_t>(StepAggregator::kSkewWindow); ++step) {
    two.Add(Timed(0, step, 1.0));
    two.Add(Timed(1, step, 1.0));
  }
  EXPECT_DOUBLE_EQ(two.last_skew(), 1.0);
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return body;
}

TEST(MetricsEndpoint, ServesRankSeriesOverHttp) {
  auto ranks = std::make_shared<RankSeries>();
  ranks->Add(Placement(1), Sample("job-7", 2, 1, 5, 0.03, 4096));
  JobsSnapshot snap;
  snap.jobs.push_back({"job-7", "demo", v1::JOB_STATE_RUNNING, 5, 100, 0.1, 1.0, 1});
  auto exporter = MetricsExporter::Start(
      "127.0.0.1:0", [snap] { return snap; }, [] { return std::vector<v1::WorkerInfo>{}; }, ranks);
  ASSERT_TRUE(exporter.ok()) << exporter.status().ToString();
  const std::string body = HttpGet((*exporter)->port(), "/metrics");
  const std::string rank =
      R"(job_id="job-7",rank="1",worker="node-1",pp="0",dp_replicate="0",dp_shard="0",cp="0",tp="1")";
  for (const std::string& line : std::vector<std::string>{
           "# TYPE meshrun_rank_step_seconds histogram",
           "meshrun_rank_step_seconds_bucket{" + rank + R"(,le="0.025"} 0)",
           "meshrun_rank_step_seconds_bucket{" + rank + R"(,le="0.05"} 1)",
           "meshrun_rank_step_seconds_bucket{" + rank + R"(,le="+Inf"} 1)",
           "meshrun_rank_step_seconds_count{" + rank + "} 1",
           "meshrun_rank_loss{" + rank + "} 3.5",
           "meshrun_rank_memory_bytes{" + rank + R"(,kind="peak"} 300)",
           "# TYPE meshrun_rank_comm_bytes_total counter",
           "meshrun_rank_comm_bytes_total{" + rank + R"(,axis="tp",op="all_reduce"} 4096)",
           "meshrun_rank_info{" + rank + R"(,attempt="2",device="cpu",gpu=""} 1)",
           R"(meshrun_job_step_time_skew{job_id="job-7"} 1)",
           R"(meshrun_job_restarts_total{job_id="job-7"} 1)",
           "# TYPE meshrun_rank_tokens_total counter",
           "# TYPE meshrun_rank_steps_total counter",
           "meshrun_rank_steps_total{" + rank + "} 1",
       }) {
    EXPECT_NE(body.find(line + "\n"), std::string::npos) << line << "\n--- body:\n" << body;
  }
}

// docs/metrics.md lists every family the coordinator serves, with its kind and every label.
TEST(MetricsDocTest, EveryCoordinatorSeriesIsARowOfDocsMetrics) {
  std::string error;
  const char* source = std::getenv("MESHRUN_SOURCE_DIR");
  const std::vector<meshrun::testing::SeriesRow> rows = meshrun::testing::ReadSeriesTable(
      std::filesystem::path(source != nullptr ? source : ".") / "docs" / "metrics.md", &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_FALSE(rows.empty()) << "docs/metrics.md has no series table";
  std::map<std::string, const meshrun::testing::SeriesRow*> by_name;
  for (const meshrun::testing::SeriesRow& r : rows) by_name[r.series] = &r;

  // Every family present: a running job with rank samples, and workers.
  auto ranks = std::make_shared<RankSeries>();
  for (int rank = 0; rank < 2; ++rank) {
    ranks->Add(Placement(rank), Sample("job-1", 1, rank, 1, 0.02 + rank, 1000));
  }
  JobsSnapshot snap;
  snap.jobs_by_state[v1::JOB_STATE_RUNNING] = 1;
  snap.jobs.push_back({"job-1", "demo", v1::JOB_STATE_RUNNING, 12, 5000, 0.3, 1.25, 1, 6144});
  std::vector<v1::WorkerInfo> workers(1);
  workers[0].set_state(v1::WORKER_STATE_BUSY);
  const auto families = MetricsExporter::Collect(snap, workers, ranks.get());
  ASSERT_GE(families.size(), 15u);

  const std::map<prometheus::MetricType, std::string> kinds = {
      {prometheus::MetricType::Gauge, "gauge"},
      {prometheus::MetricType::Counter, "counter"},
      {prometheus::MetricType::Histogram, "histogram"}};
  for (const prometheus::MetricFamily& f : families) {
    auto row = by_name.find(f.name);
    if (row == by_name.end()) {
      ADD_FAILURE() << "the coordinator serves " << f.name
                    << ", which docs/metrics.md does not list";
      continue;
    }
    EXPECT_EQ(row->second->endpoint, "coordinator") << f.name;
    ASSERT_TRUE(kinds.count(f.type)) << f.name;
    EXPECT_EQ(row->second->kind, kinds.at(f.type))
        << f.name << " (docs/metrics.md:" << row->second->line << ")";
    const std::set<std::string> documented(row->second->labels.begin(), row->second->labels.end());
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const auto& label : m.label) {
        EXPECT_TRUE(documented.count(label.name))
            << f.name << " carries the label " << label.name
            << ", which its row (docs/metrics.md:" << row->second->line << ") does not list";
      }
    }
  }
}

}  // namespace
}  // namespace meshrun::coordinator
