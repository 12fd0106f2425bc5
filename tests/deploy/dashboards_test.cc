// The shipped observability files, checked without a server: the Grafana dashboards' JSON
// models (schema, the templated data source on every panel and target, unique panel ids, a
// grid position for every panel, non-empty PromQL, the job view's `job_id` variable and its
// job_id="$job_id" filter), the provisioning files, the series the dashboards read against
// docs/metrics.md, and both Prometheus configs through `promtool check config`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "tests/deploy/observability.h"

namespace meshrun::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kDatasourceUid[] = "${datasource}";

bool UsesTemplatedDatasource(const json& node) {
  if (!node.contains("datasource")) return false;
  const json& ds = node["datasource"];
  if (ds.is_string()) return ds == kDatasourceUid || ds == "$datasource";
  return ds.is_object() && ds.value("uid", "") == kDatasourceUid &&
         ds.value("type", "prometheus") == "prometheus";
}

const json* Variable(const json& dashboard, const std::string& name) {
  for (const json& v : dashboard["templating"]["list"]) {
    if (v.value("name", "") == name) return &v;
  }
  return nullptr;
}

class DashboardTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    path_ = SourceDir() / "deploy" / "grafana" / "dashboards" / GetParam();
    ASSERT_TRUE(fs::exists(path_)) << path_;
    dashboard_ = LoadDashboard(path_);
    ASSERT_TRUE(dashboard_.is_object()) << path_ << " is not valid JSON";
  }

  fs::path path_;
  json dashboard_;
};

TEST_P(DashboardTest, ModelHasSchemaUidTitleAndTime) {
  ASSERT_TRUE(dashboard_["schemaVersion"].is_number_integer()) << path_;
  EXPECT_GE(dashboard_["schemaVersion"].get<int>(), 36) << path_;
  EXPECT_FALSE(dashboard_.value("uid", "").empty()) << path_;
  EXPECT_LE(dashboard_.value("uid", "").size(), 40u) << "Grafana uids are at most 40 characters";
  EXPECT_FALSE(dashboard_.value("title", "").empty()) << path_;
  ASSERT_TRUE(dashboard_["time"].is_object()) << path_;
  EXPECT_FALSE(dashboard_["time"].value("from", "").empty());
  EXPECT_FALSE(dashboard_["time"].value("to", "").empty());
  EXPECT_TRUE(dashboard_.contains("refresh")) << path_;
  // Provisioned dashboards must not carry a database id.
  EXPECT_TRUE(!dashboard_.contains("id") || dashboard_["id"].is_null()) << path_;
}

TEST_P(DashboardTest, DatasourceIsATemplatedPrometheusVariable) {
  ASSERT_TRUE(dashboard_["templating"]["list"].is_array()) << path_;
  const json* ds = Variable(dashboard_, "datasource");
  ASSERT_NE(ds, nullptr) << path_ << ": no `datasource` variable";
  EXPECT_EQ((*ds)["type"], "datasource");
  EXPECT_EQ((*ds)["query"], "prometheus");
  // Query variables read through it too.
  for (const json& v : dashboard_["templating"]["list"]) {
    if (v.value("type", "") == "query") {
      EXPECT_TRUE(UsesTemplatedDatasource(v)) << path_ << ": variable " << v["name"];
    }
  }
}

TEST_P(DashboardTest, EveryPanelHasAUniqueIdAGridPositionAndTheTemplatedDatasource) {
  const std::vector<const json*> panels = Panels(dashboard_);
  ASSERT_FALSE(panels.empty()) << path_;
  std::set<int> ids;
  std::vector<std::array<int, 4>> boxes;
  for (const json* p : panels) {
    const std::string title = p->value("title", "");
    ASSERT_TRUE((*p)["id"].is_number_integer()) << path_ << ": panel '" << title << "' has no id";
    EXPECT_TRUE(ids.insert((*p)["id"].get<int>()).second)
        << path_ << ": panel id " << (*p)["id"] << " used twice";
    EXPECT_FALSE(title.empty()) << path_ << ": panel " << (*p)["id"] << " has no title";
    ASSERT_TRUE((*p)["gridPos"].is_object()) << path_ << ": panel '" << title << "'";
    const json& g = (*p)["gridPos"];
    for (const char* k : {"x", "y", "w", "h"}) {
      ASSERT_TRUE(g[k].is_number_integer()) << path_ << ": panel '" << title << "' gridPos." << k;
    }
    const int x = g["x"], y = g["y"], w = g["w"], h = g["h"];
    EXPECT_TRUE(x >= 0 && y >= 0 && w >= 1 && h >= 1 && x + w <= 24)
        << path_ << ": panel '" << title << "' gridPos " << g.dump();
    for (const auto& b : boxes) {
      const bool overlap = x < b[0] + b[2] && b[0] < x + w && y < b[1] + b[3] && b[1] < y + h;
      EXPECT_FALSE(overlap) << path_ << ": panel '" << title << "' overlaps another";
    }
    boxes.push_back({x, y, w, h});
    if (p->value("type", "") == "row") continue;
    EXPECT_TRUE(UsesTemplatedDatasource(*p))
        << path_ << ": panel '" << title << "' does not use ${datasource}";
    ASSERT_TRUE((*p)["targets"].is_array() && !(*p)["targets"].empty())
        << path_ << ": panel '" << title << "' has no targets";
    std::set<std::string> refs;
    for (const json& t : (*p)["targets"]) {
      EXPECT_TRUE(UsesTemplatedDatasource(t))
          << path_ << ": panel '" << title << "' target " << t.value("refId", "?");
      EXPECT_FALSE(t.value("expr", "").empty()) << path_ << ": panel '" << title << "' target "
                                                << t.value("refId", "?") << " has no expr";
      EXPECT_TRUE(refs.insert(t.value("refId", "")).second)
          << path_ << ": panel '" << title << "' refId " << t.value("refId", "") << " twice";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dashboards, DashboardTest,
                         ::testing::Values("meshrun-job.json", "meshrun-cluster.json"),
                         [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.find('.'));
                           for (char& c : name) c = std::isalnum(c) ? c : '_';
                           return name;
                         });

TEST(JobDashboardTest, HasTheJobVariableAndEveryJobSeriesIsFilteredByIt) {
  const json d = LoadDashboard(DashboardFiles()[0]);
  ASSERT_TRUE(d.is_object());
  const json* job = Variable(d, "job_id");
  ASSERT_NE(job, nullptr) << "meshrun-job.json has no `job_id` variable";
  EXPECT_EQ((*job)["type"], "query");
  const std::string query =
      (*job)["query"].is_object() ? (*job)["query"].value("query", "") : (*job)["query"].dump();
  EXPECT_NE(query.find("label_values(meshrun_job_step, job_id)"), std::string::npos) << query;
  // Every selector of a job or rank series names the job: a panel that forgot it would sum
  // over every job in the cluster.
  static const std::regex selector("(meshrun_(?:rank|job)_[A-Za-z0-9_]*)(\\{[^}]*\\})?");
  int selectors = 0;
  for (const PanelTarget& t : Targets(DashboardFiles()[0], d)) {
    for (auto it = std::sregex_iterator(t.expr.begin(), t.expr.end(), selector);
         it != std::sregex_iterator(); ++it) {
      ++selectors;
      EXPECT_NE((*it)[2].str().find("job_id=\"$job_id\""), std::string::npos)
          << "panel '" << t.panel_title << "' " << t.ref_id << ": " << (*it)[0]
          << " lacks job_id=\"$job_id\"";
    }
  }
  EXPECT_GT(selectors, 10);
}

TEST(DashboardSeriesTest, EveryMeshrunSeriesADashboardReadsIsInDocsMetrics) {
  std::string error;
  const std::vector<SeriesRow> rows = ReadSeriesTable(SourceDir() / "docs" / "metrics.md", &error);
  ASSERT_TRUE(error.empty()) << error;
  if (rows.empty()) GTEST_SKIP() << "docs/metrics.md has no rows in its series table yet";
  std::set<std::string> documented;
  for (const SeriesRow& r : rows) documented.insert(r.series);
  for (const fs::path& path : DashboardFiles()) {
    const json d = LoadDashboard(path);
    ASSERT_TRUE(d.is_object()) << path;
    for (const PanelTarget& t : Targets(path, d)) {
      for (std::string name : MeshrunNames(t.expr)) {
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          const std::string s = suffix;
          if (!documented.count(name) && name.size() > s.size() &&
              name.compare(name.size() - s.size(), s.size(), s) == 0) {
            name = name.substr(0, name.size() - s.size());
          }
        }
        EXPECT_TRUE(documented.count(name))
            << t.dashboard << " panel '" << t.panel_title << "' " << t.ref_id << " reads " << name
            << ", which docs/metrics.md does not list";
      }
    }
  }
}

TEST(DashboardSeriesTest, SubstitutionLeavesLabelReplaceGroupsAlone) {
  EXPECT_EQ(
      SubstituteVariables(
          R"x(rate(x{job_id="$job_id"}[$__rate_interval]) + label_replace(y, "a", "$1", "b", "(.*)"))x",
          "job-1", "10s"),
      R"x(rate(x{job_id="job-1"}[10s]) + label_replace(y, "a", "$1", "b", "(.*)"))x");
  EXPECT_EQ(SubstituteVariables("${job_id} $job_ids $__range", "j", "5s"), "j $job_ids 5s");
}

TEST(ProvisioningTest, DatasourceAndDashboardProviderPointAtPrometheusAndTheDashboards) {
  const fs::path dir = SourceDir() / "deploy" / "grafana" / "provisioning";
  const YAML::Node ds = YAML::LoadFile((dir / "datasources" / "prometheus.yaml").string());
  ASSERT_TRUE(ds["datasources"].IsSequence());
  EXPECT_EQ(ds["datasources"][0]["type"].as<std::string>(), "prometheus");
  EXPECT_FALSE(ds["datasources"][0]["url"].as<std::string>().empty());
  const YAML::Node dash = YAML::LoadFile((dir / "dashboards" / "meshrun.yaml").string());
  ASSERT_TRUE(dash["providers"].IsSequence());
  EXPECT_EQ(dash["providers"][0]["type"].as<std::string>(), "file");
  EXPECT_FALSE(dash["providers"][0]["options"]["path"].as<std::string>().empty());
}

// ---- Prometheus configs -------------------------------------------------------------------

struct ToolRun {
  int exit_code = -1;
  std::string output;
};

ToolRun Promtool(const fs::path& config) {
  ToolRun run;
  const std::string command = "promtool check config '" + config.string() + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

bool HavePromtool() {
  return std::system("command -v promtool >/dev/null 2>&1") == 0;
}

class PromtoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HavePromtool()) GTEST_SKIP() << "promtool is not installed (apt-get install prometheus)";
    char pattern[] = "/tmp/meshrun_promtool_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

// The shipped scrape configs are standard ones: meshrun's labels never collide with the target
// labels (the job id is `job_id`), so no scrape job sets honor_labels.
void ExpectStandardScrapeConfig(const fs::path& path) {
  const YAML::Node config = YAML::LoadFile(path.string());
  int meshrun_jobs = 0;
  for (const YAML::Node& sc : config["scrape_configs"]) {
    const std::string name = sc["job_name"].as<std::string>();
    EXPECT_FALSE(sc["honor_labels"].IsDefined())
        << path << ": scrape job " << name << " sets honor_labels (not needed: no label collides)";
    if (name.rfind("meshrun", 0) == 0) ++meshrun_jobs;
  }
  EXPECT_GT(meshrun_jobs, 0) << path;
}

TEST_F(PromtoolTest, LocalConfigIsValid) {
  const fs::path config = SourceDir() / "deploy" / "prometheus" / "prometheus-local.yml";
  const ToolRun run = Promtool(config);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectStandardScrapeConfig(config);
}

TEST_F(PromtoolTest, KubernetesConfigIsValid) {
  const fs::path config = SourceDir() / "deploy" / "prometheus" / "prometheus-k8s.yml";
  ExpectStandardScrapeConfig(config);
  const YAML::Node parsed = YAML::LoadFile(config.string());
  for (const YAML::Node& sc : parsed["scrape_configs"]) {
    ASSERT_TRUE(sc["kubernetes_sd_configs"]) << sc["job_name"];
    EXPECT_EQ(sc["kubernetes_sd_configs"][0]["role"].as<std::string>(), "pod");
  }
  ToolRun run = Promtool(config);
  if (run.exit_code != 0 &&
      run.output.find("field kubernetes_sd_configs not found") != std::string::npos) {
    // Debian builds Prometheus without Kubernetes discovery. Check everything else (the
    // relabelling rules, their regexes and actions) with the discovery swapped for a static
    // target.
    std::cerr << "promtool was built without Kubernetes discovery (Debian); checking the config "
                 "with kubernetes_sd_configs replaced by a static target\n";
    std::string text = Slurp(config);
    text = std::regex_replace(text, std::regex("kubernetes_sd_configs:(\\s*)- role: pod"),
                              "static_configs:$1- targets: [\"127.0.0.1:1\"]");
    for (const std::string& line : SplitLines(text)) {
      const size_t first = line.find_first_not_of(' ');
      if (first == std::string::npos || line[first] == '#') continue;
      ASSERT_EQ(line.find("kubernetes_sd_configs"), std::string::npos)
          << "a kubernetes_sd_configs block other than `- role: pod` is left: " << line;
    }
    const fs::path copy = dir_ / "prometheus-k8s-static.yml";
    std::ofstream(copy) << text;
    run = Promtool(copy);
  }
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST_F(PromtoolTest, CatchesABrokenRelabelRegex) {
  // The check above can fail: promtool rejects a bad regex.
  const fs::path bad = dir_ / "bad.yml";
  std::ofstream(bad) << "scrape_configs:\n  - job_name: x\n    static_configs:\n"
                        "      - targets: ['127.0.0.1:1']\n    relabel_configs:\n"
                        "      - source_labels: [a]\n        regex: '(unclosed'\n"
                        "        action: keep\n";
  EXPECT_NE(Promtool(bad).exit_code, 0);
}

}  // namespace
}  // namespace meshrun::testing
