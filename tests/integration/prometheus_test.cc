// The metrics end to end, through a real Prometheus: a meshrun-coordinator and two workers on
// loopback run a 4-rank CPU job (dp_shard 2 x tp 2) while /usr/bin/prometheus scrapes them
// every second with deploy/prometheus/prometheus-local.yml (its targets pointed at the
// daemons; a standard scrape config: no honor_labels). Through Prometheus' HTTP API the test
// then asserts that
//  (a) every `required` series of docs/metrics.md is there with every label its row lists,
//      from the endpoint the row names, and that per-rank series exist for every rank of the
//      job with the rank's worker and mesh coordinates, and that no series lost a label to a
//      target label (no exported_job, exported_instance, ...: `job` is the scrape job's name);
//  (b) every PromQL target of every panel of both Grafana dashboards returns data (targets
//      that read DCGM or meshrun_gpu_ series are only checked to evaluate: no GPU here).
// Skips itself without the binaries, the corpus or Prometheus. Logs are kept on failure.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/deploy/observability.h"
#include "tests/integration/daemons.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using testing::kCorpus;
constexpr char kPrometheus[] = "/usr/bin/prometheus";
// What the dashboards' $__rate_interval, $__interval and $__range become: ten scrapes.
constexpr char kInterval[] = "10s";
// The job's mesh: g = dp_shard·2 + tp.
constexpr int kDpShard = 2;
constexpr int kTp = 2;
constexpr int kRanks = kDpShard * kTp;

using testing::BinDir;
using testing::Daemon;
using testing::FreePort;
using testing::Spawn;
using testing::Stop;

// ---- A minimal HTTP/1.1 GET client (loopback, Connection: close) ---------------------------

struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string body;
  std::string error;
};

std::string UrlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string Dechunk(const std::string& body) {
  std::string out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(body.substr(at, eol - at), nullptr, 16);
    if (n == 0) break;
    out += body.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  return out;
}

HttpResponse HttpGet(int port, const std::string& target, int timeout_s = 10) {
  HttpResponse r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    r.error = "connect: " + std::string(strerror(errno));
    close(fd);
    return r;
  }
  const std::string request = "GET " + target +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n"
                              "Connection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    r.error = "send failed";
    close(fd);
    return r;
  }
  std::string raw;
  char buffer[16384];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) raw.append(buffer, n);
  close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) {
    r.error = "no HTTP response (" + std::to_string(raw.size()) + " bytes)";
    return r;
  }
  r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  std::string head = raw.substr(0, head_end);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.body = raw.substr(head_end + 4);
  if (head.find("transfer-encoding: chunked") != std::string::npos) r.body = Dechunk(r.body);
  return r;
}

// ---- Daemons ---------------------------------------------------------------------------------

std::string Join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The rank's worker and mesh coordinates, from `meshrun status -o json`.
struct RankPlace {
  std::string worker;
  std::map<std::string, int> coords;
};

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* bin : {"meshrun", "meshrun-worker", "meshrun-coordinator"}) {
      if (!fs::exists(BinDir() / bin)) GTEST_SKIP() << (BinDir() / bin) << " is not built";
    }
    if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " is missing (apt-get install fortunes)";
    if (access(kPrometheus, X_OK) != 0) {
      GTEST_SKIP() << kPrometheus << " is missing (apt-get install prometheus, or scripts/setup)";
    }
    std::string error;
    rows_ = testing::ReadSeriesTable(testing::SourceDir() / "docs" / "metrics.md", &error);
    ASSERT_TRUE(error.empty()) << error;
    ASSERT_FALSE(rows_.empty()) << "docs/metrics.md lists no series (its table has no rows)";
    char pattern[] = "/tmp/meshrun_prometheus_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }

  void TearDown() override {
    Stop(prometheus_, 10s);
    for (Daemon& w : workers_) Stop(w);
    Stop(coordinator_, 10s);
    if (dir_.empty()) return;
    if (HasFailure() || std::getenv("MESHRUN_KEEP_TEST_LOGS") != nullptr) {
      std::cerr << "logs kept in " << dir_ << std::endl;
      for (const auto& entry : fs::directory_iterator(dir_)) {
        if (entry.path().extension() != ".log") continue;
        std::cerr << "---- " << entry.path().filename() << " (last lines)\n";
        const std::vector<std::string> lines = testing::Lines(testing::ReadFile(entry.path()));
        for (size_t i = lines.size() > 25 ? lines.size() - 25 : 0; i < lines.size(); ++i) {
          std::cerr << lines[i] << '\n';
        }
      }
    } else {
      fs::remove_all(dir_);
    }
  }

  testing::CliResult Cli(std::vector<std::string> args, int timeout_s = 30) {
    args.push_back("--coordinator");
    args.push_back(address_);
    return testing::RunCli(BinDir() / "meshrun", args, dir_ / "cli.err", timeout_s);
  }

  // Coordinator and two workers of two slots, each with its metrics endpoint.
  void StartCluster() {
    address_ = "127.0.0.1:" + std::to_string(FreePort());
    coordinator_metrics_ = "127.0.0.1:" + std::to_string(FreePort());
    coordinator_ =
        Spawn("coordinator",
              {(BinDir() / "meshrun-coordinator").string(), "--listen", address_,
               "--metrics-listen", coordinator_metrics_, "--state-dir", (dir_ / "state").string()},
              dir_ / "coordinator.log");
    bool answered = false;
    for (int i = 0; i < 200 && !answered; ++i) {
      answered = Cli({"workers", "-o", "json"}, 5).exit_code == 0;
      if (!answered) std::this_thread::sleep_for(50ms);
    }
    ASSERT_TRUE(answered) << "the coordinator did not answer on " << address_;
    for (int i = 1; i <= 2; ++i) {
      const std::string name = "worker-" + std::to_string(i);
      worker_metrics_.push_back("127.0.0.1:" + std::to_string(FreePort()));
      workers_.push_back(
          Spawn(name,
                {(BinDir() / "meshrun-worker").string(), "--coordinator", address_, "--name", name,
                 "--slots", "2", "--metrics-listen", worker_metrics_.back(), "--work-dir",
                 (dir_ / "work" / name).string(), "--cores", "1", "--grace", "2"},
                dir_ / (name + ".log")));
    }
    const Clock::time_point give_up = Clock::now() + 30s;
    while (Clock::now() < give_up) {
      testing::CliResult r = Cli({"workers", "-o", "json"}, 5);
      int ready = 0;
      if (r.exit_code == 0) {
        for (const json& w : json::parse(r.out)) ready += w["state"] == "READY";
      }
      if (ready == 2) return;
      std::this_thread::sleep_for(100ms);
    }
    FAIL() << "the workers did not become READY: " << Cli({"workers"}).out;
  }

  // deploy/prometheus/prometheus-local.yml with a 1 s scrape interval and its meshrun scrape
  // jobs pointed at this cluster's metrics endpoints (other jobs, e.g. DCGM, left out).
  void StartPrometheus() {
    const fs::path shipped =
        testing::SourceDir() / "deploy" / "prometheus" / "prometheus-local.yml";
    YAML::Node config = YAML::LoadFile(shipped.string());
    config["global"]["scrape_interval"] = "1s";
    config["global"]["scrape_timeout"] = "1s";
    config["global"]["evaluation_interval"] = "1s";
    YAML::Node scrapes(YAML::NodeType::Sequence);
    std::set<std::string> found;
    for (YAML::Node sc : config["scrape_configs"]) {
      const std::string name = sc["job_name"].as<std::string>();
      YAML::Node targets(YAML::NodeType::Sequence);
      if (name == "meshrun-coordinator") {
        targets.push_back(coordinator_metrics_);
      } else if (name == "meshrun-workers") {
        for (const std::string& w : worker_metrics_) targets.push_back(w);
      } else {
        continue;
      }
      found.insert(name);
      // Standard scrape config: the test scrapes exactly as shipped, without honor_labels.
      ASSERT_FALSE(sc["honor_labels"].IsDefined()) << shipped << ": " << name;
      sc["static_configs"][0]["targets"] = targets;
      scrapes.push_back(sc);
    }
    ASSERT_EQ(found, (std::set<std::string>{"meshrun-coordinator", "meshrun-workers"}))
        << shipped << " must have the scrape jobs meshrun-coordinator and meshrun-workers";
    config["scrape_configs"] = scrapes;
    const fs::path path = dir_ / "prometheus.yml";
    std::ofstream(path) << config << '\n';
    prometheus_port_ = FreePort();
    prometheus_ = Spawn(
        "prometheus",
        {kPrometheus, "--config.file=" + path.string(),
         "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
         "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_), "--log.level=warn"},
        dir_ / "prometheus.log");
    const Clock::time_point give_up = Clock::now() + 30s;
    while (Clock::now() < give_up) {
      if (HttpGet(prometheus_port_, "/-/ready", 2).status == 200) return;
      std::this_thread::sleep_for(100ms);
    }
    FAIL() << "Prometheus was not ready on port " << prometheus_port_ << " within 30 s";
  }

  // The test job on `parallelism` (default: dp_shard 2 x tp 2).
  std::string Submit(std::string parallelism = "") {
    if (parallelism.empty()) {
      parallelism = "dp_replicate_size: 1, dp_shard_size: " + std::to_string(kDpShard) +
                    ", cp_size: 1, tp_size: " + std::to_string(kTp);
    }
    const fs::path spec = dir_ / "job.yaml";
    std::ofstream(spec)
        << "name: prometheus-test\n"
           "model: {arch: gpt2, n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}\n"
           "parallelism: {"
        << parallelism
        << "}\n"
           // Long enough to outlive the test; the workers stop its ranks at the end.
           "train: {steps: 100000, global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-3, "
           "min_lr: 1.0e-4, warmup_steps: 2, seed: 1337}\n"
           "data: {train: "
        << kCorpus << ", format: text}\n";
    testing::CliResult r = Cli({"submit", "-f", spec.string(), "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return "";
    return json::parse(r.out)["job_id"].get<std::string>();
  }

  // GET /api/v1/<what>?<query>; the `data` member, or null with a failure named `context`.
  json Api(const std::string& what, const std::string& query, const std::string& context) {
    const HttpResponse r = HttpGet(prometheus_port_, "/api/v1/" + what + "?" + query);
    const json body = json::parse(r.body, nullptr, false);
    if (r.status != 200 || !body.is_object() || body.value("status", "") != "success") {
      ADD_FAILURE() << context << ": Prometheus answered " << r.status << " " << r.error << " "
                    << r.body.substr(0, 500);
      return json();
    }
    return body["data"];
  }

  json Series(const std::string& name) {
    return Api("series", "match[]=" + UrlEncode(name), "series " + name);
  }

  json Query(const std::string& promql, const std::string& context) {
    return Api("query", "query=" + UrlEncode(promql), context);
  }

  std::vector<std::string> RequiredProblems(const std::string& job,
                                            const std::vector<RankPlace>& ranks);

  std::vector<testing::SeriesRow> rows_;
  fs::path dir_;
  std::string address_;
  std::string coordinator_metrics_;
  std::vector<std::string> worker_metrics_;
  Daemon coordinator_;
  std::vector<Daemon> workers_;
  Daemon prometheus_;
  int prometheus_port_ = 0;
};

std::string LabelOf(const json& series, const std::string& label) {
  return series.contains(label) && series[label].is_string() ? series[label].get<std::string>()
                                                             : "";
}

// What is wrong with the required series of docs/metrics.md right now (empty: nothing).
std::vector<std::string> PrometheusTest::RequiredProblems(const std::string& job,
                                                          const std::vector<RankPlace>& ranks) {
  std::vector<std::string> problems;
  const std::set<std::string> workers(worker_metrics_.begin(), worker_metrics_.end());
  for (const testing::SeriesRow& row : rows_) {
    if (!row.required) continue;
    const std::string where = row.series + " (docs/metrics.md:" + std::to_string(row.line) + ")";
    const bool histogram = row.kind.find("histogram") != std::string::npos;
    const std::string name = histogram ? row.series + "_count" : row.series;
    const json series = Series(name);
    if (!series.is_array() || series.empty()) {
      problems.push_back(where + ": no series " + name + " in Prometheus");
      continue;
    }
    if (histogram) {
      const json buckets = Series(row.series + "_bucket");
      if (!buckets.is_array() || buckets.empty() || LabelOf(buckets[0], "le").empty()) {
        problems.push_back(where + ": a histogram without " + row.series + "_bucket{le}");
      }
    }
    std::set<std::string> missing;
    for (const json& s : series) {
      for (const std::string& label : row.labels) {
        if (LabelOf(s, label).empty()) missing.insert(label);
      }
      const std::string instance = LabelOf(s, "instance");
      const bool right_endpoint = row.endpoint == "coordinator" ? instance == coordinator_metrics_
                                  : row.endpoint == "worker"    ? workers.count(instance) > 0
                                                                : false;
      if (!right_endpoint) {
        problems.push_back(where + ": scraped from " + instance + ", but its endpoint is '" +
                           row.endpoint + "' (coordinator " + coordinator_metrics_ + ", workers " +
                           Join(worker_metrics_) + ")");
        break;
      }
    }
    if (!missing.empty()) {
      problems.push_back(where + ": series without the label(s) " +
                         Join({missing.begin(), missing.end()}) + " its row lists");
    }
    const auto lists = [&](const char* label) {
      return std::find(row.labels.begin(), row.labels.end(), label) != row.labels.end();
    };
    if (lists("rank")) {
      // Per-rank: every rank of the job, on its worker, at its coordinates.
      std::map<int, std::set<std::string>> axes;
      std::set<int> seen;
      for (const json& s : series) {
        if (LabelOf(s, "job_id") != job) continue;
        const int g = std::atoi(LabelOf(s, "rank").c_str());
        if (g < 0 || g >= static_cast<int>(ranks.size())) {
          problems.push_back(where + ": rank " + LabelOf(s, "rank") + " is not a rank of " + job);
          continue;
        }
        seen.insert(g);
        if (LabelOf(s, "worker") != ranks[g].worker) {
          problems.push_back(where + ": rank " + std::to_string(g) + " has worker=\"" +
                             LabelOf(s, "worker") + "\" but runs on " + ranks[g].worker);
        }
        for (const auto& [axis, coord] : ranks[g].coords) {
          if (LabelOf(s, axis) != std::to_string(coord)) {
            problems.push_back(where + ": rank " + std::to_string(g) + " has " + axis + "=\"" +
                               LabelOf(s, axis) + "\", expected " + std::to_string(coord));
          }
        }
        if (lists("axis")) axes[g].insert(LabelOf(s, "axis"));
      }
      for (int g = 0; g < static_cast<int>(ranks.size()); ++g) {
        if (!seen.count(g)) {
          problems.push_back(where + ": no series for rank " + std::to_string(g) + " of " + job);
        } else if (lists("axis")) {
          // dp_shard x tp: both axes move bytes on every step.
          for (const char* axis : {"tp", "dp_shard"}) {
            if (!axes[g].count(axis)) {
              problems.push_back(where + ": rank " + std::to_string(g) + " has no axis=\"" + axis +
                                 "\" series");
            }
          }
        }
      }
    } else if (lists("job_id")) {
      bool found = false;
      for (const json& s : series) found = found || LabelOf(s, "job_id") == job;
      if (!found) problems.push_back(where + ": no series with job_id=\"" + job + "\"");
    }
    // A label that collided with a target label comes back renamed exported_<name>; `job` must
    // be the scrape job's name from the shipped config.
    for (const json& s : series) {
      for (const auto& [label, value] : s.items()) {
        if (label.rfind("exported_", 0) == 0) {
          problems.push_back(where + ": has " + label + "=" + value.dump() +
                             ": an exported label collided with a target label");
        }
      }
      const std::string scrape_job = LabelOf(s, "job");
      if (scrape_job != "meshrun-coordinator" && scrape_job != "meshrun-workers") {
        problems.push_back(where + ": job=\"" + scrape_job +
                           "\", not the shipped config's scrape job name");
      }
    }
  }
  return problems;
}

// A query result with at least one sample that is a number.
bool HasData(const json& data) {
  if (!data.is_object() || !data["result"].is_array()) return false;
  const json& result = data["result"];
  if (data.value("resultType", "") == "scalar") return result.size() == 2;
  for (const json& r : result) {
    std::vector<json> values;
    if (r.contains("value")) values.push_back(r["value"]);
    if (r.contains("values")) values.insert(values.end(), r["values"].begin(), r["values"].end());
    for (const json& v : values) {
      if (v.is_array() && v.size() == 2 && v[1] != "NaN") return true;
    }
  }
  return false;
}

// "N series, e.g. {labels} = value" for the log: what each panel would show.
std::string Summary(const json& data) {
  if (!data.is_object() || !data["result"].is_array() || data["result"].empty()) return "empty";
  const json& result = data["result"];
  if (data.value("resultType", "") == "scalar") return "scalar " + result[1].dump();
  const json& first = result[0];
  std::string labels;
  for (const auto& [k, v] : first["metric"].items()) {
    if (k == "instance" || k == "component") continue;
    labels += (labels.empty() ? "" : ",") + k + "=" + v.get<std::string>();
  }
  const json& value = first.contains("value") ? first["value"] : first["values"].back();
  return std::to_string(result.size()) + " series, e.g. {" + labels +
         "} = " + value[1].get<std::string>();
}

TEST_F(PrometheusTest, RequiredSeriesAndEveryDashboardQueryHaveData) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(StartPrometheus());
  const std::string job = Submit();
  ASSERT_FALSE(job.empty());

  // Running, every rank placed, a few steps done.
  json status;
  std::vector<RankPlace> ranks;
  const Clock::time_point started_by = Clock::now() + 60s;
  while (Clock::now() < started_by) {
    testing::CliResult r = Cli({"status", job, "-o", "json"}, 10);
    status = json::parse(r.out, nullptr, false);
    if (status.is_object() && status["state"] == "RUNNING" && status["step"].get<int>() >= 2) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(status.is_object() && status["state"] == "RUNNING" && status["step"].get<int>() >= 2)
      << "the job did not start: " << status.dump();
  ASSERT_EQ(status["ranks"].size(), static_cast<size_t>(kRanks)) << status.dump();
  for (const json& r : status["ranks"]) {
    RankPlace place;
    place.worker = r["worker"].get<std::string>();
    for (const char* axis : {"pp", "dp_replicate", "dp_shard", "cp", "tp"}) {
      place.coords[axis] = r["coords"][axis].get<int>();
    }
    ranks.push_back(place);
  }

  // (a) The required series, polled until Prometheus has them all (or the time is up).
  std::vector<std::string> problems;
  const Clock::time_point scraped_by = Clock::now() + 30s;
  do {
    problems = RequiredProblems(job, ranks);
    if (problems.empty()) break;
    std::this_thread::sleep_for(1s);
  } while (Clock::now() < scraped_by);
  for (const std::string& p : problems) ADD_FAILURE() << p;
  // The prediction beside the measurement: the scraped gauges hold what `meshrun submit`
  // predicted (status' "predicted"), and the job dashboard's panels read each of them.
  for (const auto& [series, field] :
       {std::pair<std::string, std::string>{"meshrun_job_predicted_step_seconds", "step_seconds"},
        {"meshrun_job_predicted_peak_memory_bytes", "peak_memory_bytes"}}) {
    const double submitted = status["predicted"][field].get<double>();
    EXPECT_GT(submitted, 0) << "submit made no prediction: " << status.dump();
    const json data = Query(series + "{job_id=\"" + job + "\"}", series);
    ASSERT_TRUE(data.is_object() && data["result"].size() == 1) << series << ": " << data.dump();
    const double scraped = std::stod(data["result"][0]["value"][1].get<std::string>());
    EXPECT_NEAR(scraped, submitted, 1e-6 * submitted) << series;
    int panels = 0;
    for (const fs::path& path : testing::DashboardFiles()) {
      const json dashboard = testing::LoadDashboard(path);
      for (const testing::PanelTarget& t : testing::Targets(path, dashboard)) {
        panels += t.expr.find(series) != std::string::npos ? 1 : 0;
      }
    }
    EXPECT_GE(panels, 1) << "no dashboard panel reads " << series;
  }
  // Ten scrapes more, so that every rate over the dashboards' 10 s window has samples.
  std::this_thread::sleep_for(std::chrono::seconds(std::atoi(kInterval)));
  ASSERT_TRUE(Cli({"status", job, "-o", "json"}, 10).out.find("\"RUNNING\"") != std::string::npos)
      << "the job stopped before the dashboards were checked";

  // (b) Every target of every panel.
  int checked = 0;
  std::vector<std::string> skipped;
  for (const fs::path& path : testing::DashboardFiles()) {
    const json dashboard = testing::LoadDashboard(path);
    ASSERT_TRUE(dashboard.is_object()) << path;
    std::map<int, int> checkable;  // panel id -> targets checked for data
    std::map<int, std::string> titles;
    for (const testing::PanelTarget& t : testing::Targets(path, dashboard)) {
      titles[t.panel_id] = t.panel_title;
      checkable.emplace(t.panel_id, 0);
      const std::string expr = testing::SubstituteVariables(t.expr, job, kInterval);
      const std::string context = t.dashboard + " panel '" + t.panel_title + "' (id " +
                                  std::to_string(t.panel_id) + ") target " + t.ref_id + ": " + expr;
      // Every query must evaluate, GPU ones included (a typo fails here too).
      const json data = Query(expr, context);
      if (data.is_null()) continue;
      if (testing::NeedsGpu(expr)) {
        skipped.push_back(context + " (reads DCGM_/meshrun_gpu_ series: no GPU here)");
        continue;
      }
      ++checkable[t.panel_id];
      ++checked;
      EXPECT_TRUE(HasData(data)) << context << "\nreturned no data: " << data.dump();
      std::cout << t.dashboard << " '" << t.panel_title << "' " << t.ref_id << ": " << Summary(data)
                << "\n";
    }
    for (const auto& [id, n] : checkable) {
      if (n > 0) continue;
      bool all_gpu = true;
      for (const testing::PanelTarget& t : testing::Targets(path, dashboard)) {
        if (t.panel_id == id) all_gpu = all_gpu && testing::NeedsGpu(t.expr);
      }
      if (all_gpu) {
        std::cout << "panel '" << titles[id] << "' of " << path.filename().string()
                  << " is GPU-only: its queries were checked to evaluate, not for data\n";
      } else {
        ADD_FAILURE() << path.filename().string() << " panel '" << titles[id]
                      << "' has no checkable target";
      }
    }
    for (const json* p : testing::Panels(dashboard)) {
      if (p->value("type", "") != "row" && !p->contains("targets")) {
        ADD_FAILURE() << path.filename().string() << " panel '" << p->value("title", "")
                      << "' has no targets";
      }
    }
  }
  std::cout << "checked " << checked << " dashboard targets for data; skipped " << skipped.size()
            << ":\n";
  for (const std::string& s : skipped) std::cout << "  " << s << "\n";
  EXPECT_GT(checked, 20);

  // The job dashboard's "bytes per rank per step" (bus bytes by axis over steps, from the
  // counters) is the comm_bytes that `meshrun train -o json` reports for the same spec.
  const json per_step = Query(
      "sum by (axis) (increase(meshrun_rank_comm_bytes_total{job_id=\"" + job + "\"}[" + kInterval +
          "])) / on() group_left() sum(increase(meshrun_rank_step_seconds_count{job_id=\"" + job +
          "\"}[" + kInterval + "]))",
      "bus bytes per rank per step");
  testing::CliResult train =
      testing::RunCli(BinDir() / "meshrun",
                      {"train", "-f", (dir_ / "job.yaml").string(), "--nproc",
                       std::to_string(kRanks), "--set", "train.steps=2", "-o", "json"},
                      dir_ / "train.err", 120);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const json summary = json::parse(testing::Lines(train.out).back(), nullptr, false);
  ASSERT_TRUE(summary.is_object() && summary["comm_bytes"].is_object()) << train.out;
  ASSERT_TRUE(per_step.is_object()) << per_step.dump();
  std::set<std::string> axes;
  for (const json& r : per_step["result"]) {
    const std::string axis = r["metric"].value("axis", "");
    axes.insert(axis);
    const double exported = std::stod(r["value"][1].get<std::string>());
    const double reported = summary["comm_bytes"].value(axis, -1.0);
    EXPECT_NEAR(exported, reported, 1e-2 * reported)
        << "axis " << axis << ": Prometheus has " << exported
        << " bus bytes per rank per step, meshrun train -o json reports " << reported;
  }
  EXPECT_TRUE(axes.count("tp") && axes.count("dp_shard")) << per_step.dump();
}

// A pipeline job on the cluster (pp 2 x tp 2 over the two workers of two slots): each stage's tp
// pair on one worker and the stages on different workers; `status` and Prometheus carry every
// rank's pp coordinate, and the measured bubble of each rank reaches Prometheus.
TEST_F(PrometheusTest, PipelineJobCarriesItsStagesToStatusAndPrometheus) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(StartPrometheus());
  const std::string job =
      Submit("pp_size: 2, dp_replicate_size: 1, dp_shard_size: 1, cp_size: 1, tp_size: 2");
  ASSERT_FALSE(job.empty());
  json status;
  const Clock::time_point started_by = Clock::now() + 60s;
  while (Clock::now() < started_by) {
    testing::CliResult r = Cli({"status", job, "-o", "json"}, 10);
    status = json::parse(r.out, nullptr, false);
    if (status.is_object() && status["state"] == "RUNNING" && status["step"].get<int>() >= 2) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(status.is_object() && status["state"] == "RUNNING" && status["step"].get<int>() >= 2)
      << "the pipeline job did not start: " << status.dump();
  ASSERT_EQ(status["ranks"].size(), 4u) << status.dump();
  // The measured bubble beside the schedule's theory (decision 0060): 1F1B over 2 stages and
  // 8 / 2 = 4 micro-batches, (P − 1)/(M + P − 1) = 1/5.
  ASSERT_TRUE(status.contains("pipeline_bubble")) << status.dump();
  EXPECT_DOUBLE_EQ(status["pipeline_bubble"].value("theory", -1.0), 1.0 / 5) << status.dump();
  ASSERT_TRUE(status["pipeline_bubble"]["measured"].is_number()) << status.dump();
  EXPECT_GE(status["pipeline_bubble"]["measured"].get<double>(), 0.0);
  EXPECT_LE(status["pipeline_bubble"]["measured"].get<double>(), 1.0);
  std::map<int, std::set<std::string>> workers_of_stage;
  for (const json& r : status["ranks"]) {
    const int g = r["rank"].get<int>();
    EXPECT_EQ(r["coords"]["pp"].get<int>(), g / 2) << r.dump();  // g = p·T + t
    EXPECT_EQ(r["coords"]["tp"].get<int>(), g % 2) << r.dump();
    workers_of_stage[r["coords"]["pp"].get<int>()].insert(r["worker"].get<std::string>());
  }
  ASSERT_EQ(workers_of_stage.size(), 2u) << status.dump();
  EXPECT_EQ(workers_of_stage[0].size(), 1u) << "stage 0's tp group spans workers";
  EXPECT_EQ(workers_of_stage[1].size(), 1u) << "stage 1's tp group spans workers";
  EXPECT_NE(*workers_of_stage[0].begin(), *workers_of_stage[1].begin())
      << "both stages on one worker";

  // Every rank's step series and measured bubble, labelled with its stage, through Prometheus.
  const std::set<std::pair<std::string, std::string>> want = {
      {"0", "0"}, {"1", "0"}, {"2", "1"}, {"3", "1"}};  // (rank, pp)
  std::string missing;
  const Clock::time_point scraped_by = Clock::now() + 30s;
  do {
    missing.clear();
    for (const std::string series :
         {"meshrun_rank_step_seconds_count", "meshrun_rank_pipeline_bubble_ratio",
          "meshrun_rank_pipeline_bubble_theory_ratio"}) {
      const json data = Query(series + "{job_id=\"" + job + "\",rank!=\"\"}", series);
      std::set<std::pair<std::string, std::string>> seen;
      if (data.is_object()) {
        for (const json& r : data["result"]) {
          const json& m = r["metric"];
          if (m.contains("rank") && m.contains("pp")) {
            seen.insert({m["rank"].get<std::string>(), m["pp"].get<std::string>()});
          }
        }
      }
      if (seen != want) {
        missing += series + " has " + std::to_string(seen.size()) + " of the 4 (rank, pp); ";
      }
    }
    if (missing.empty()) break;
    std::this_thread::sleep_for(1s);
  } while (Clock::now() < scraped_by);
  EXPECT_TRUE(missing.empty()) << missing;
}

}  // namespace
}  // namespace meshrun
