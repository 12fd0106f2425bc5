// What the observability tests share: the series table of docs/metrics.md, the Grafana
// dashboards of deploy/grafana/dashboards (their panels and PromQL targets), and the
// substitution of Grafana's template variables in a target's expression.
#pragma once

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace meshrun::testing {

inline std::filesystem::path SourceDir() {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::current_path();
}

inline std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// One row of the series table in docs/metrics.md.
struct SeriesRow {
  std::string series;               // e.g. meshrun_rank_loss
  std::string kind;                 // gauge, counter, histogram, ...
  std::vector<std::string> labels;  // every label the row lists
  std::string endpoint;             // coordinator or worker
  bool required = false;
  int line = 0;  // in docs/metrics.md, for messages
};

// The cells of a Markdown table row; `\|` inside a cell is a literal bar.
inline std::vector<std::string> TableCells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(cell);
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  cells.push_back(cell);
  // Drop what lies outside the outer bars.
  if (!cells.empty()) cells.erase(cells.begin());
  if (!cells.empty()) cells.pop_back();
  for (std::string& c : cells) {
    const size_t b = c.find_first_not_of(" \t");
    const size_t e = c.find_last_not_of(" \t");
    c = b == std::string::npos ? "" : c.substr(b, e - b + 1);
  }
  return cells;
}

// The leading identifier of every `backticked` token of a cell (`kind="peak"` gives kind).
inline std::vector<std::string> BacktickedNames(const std::string& cell) {
  std::vector<std::string> names;
  static const std::regex token("`([A-Za-z_:][A-Za-z0-9_:]*)[^`]*`");
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), token);
       it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

// The rows of the table whose header starts with `| series |`. `error` names what is wrong
// with the table when it cannot be read (a missing column, a row without a series).
inline std::vector<SeriesRow> ReadSeriesTable(const std::filesystem::path& path,
                                              std::string* error) {
  std::vector<SeriesRow> rows;
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read " + path.string();
    return rows;
  }
  std::map<std::string, int> column;
  bool in_table = false;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;  // the table ended
      continue;
    }
    const std::vector<std::string> cells = TableCells(line);
    if (!in_table) {
      if (cells.empty() || cells[0] != "series") continue;
      for (size_t i = 0; i < cells.size(); ++i) column[cells[i]] = static_cast<int>(i);
      for (const char* need : {"series", "kind", "labels", "endpoint", "required"}) {
        if (!column.count(need)) {
          *error = path.string() + ":" + std::to_string(number) + ": the series table has no '" +
                   need + "' column";
          return {};
        }
      }
      in_table = true;
      continue;
    }
    if (line.find("---") != std::string::npos && line.find('`') == std::string::npos) continue;
    auto cell = [&](const char* name) {
      const int i = column[name];
      return i < static_cast<int>(cells.size()) ? cells[i] : std::string();
    };
    SeriesRow row;
    row.line = number;
    const std::vector<std::string> names = BacktickedNames(cell("series"));
    if (names.empty()) {
      *error = path.string() + ":" + std::to_string(number) + ": no `series` in the first cell";
      return {};
    }
    row.series = names[0];
    row.kind = cell("kind");
    row.labels = BacktickedNames(cell("labels"));
    row.endpoint = cell("endpoint");
    row.required = cell("required").rfind("yes", 0) == 0;
    rows.push_back(row);
  }
  return rows;
}

// A PromQL target of a dashboard panel.
struct PanelTarget {
  std::string dashboard;  // file name
  int panel_id = 0;
  std::string panel_title;
  std::string ref_id;
  std::string expr;
  bool instant = false;
};

inline nlohmann::json LoadDashboard(const std::filesystem::path& path) {
  return nlohmann::json::parse(Slurp(path), nullptr, /*allow_exceptions=*/false);
}

inline std::vector<std::filesystem::path> DashboardFiles() {
  const std::filesystem::path dir = SourceDir() / "deploy" / "grafana" / "dashboards";
  return {dir / "meshrun-job.json", dir / "meshrun-cluster.json"};
}

// Every panel of a dashboard, the panels inside collapsed rows included.
inline std::vector<const nlohmann::json*> Panels(const nlohmann::json& dashboard) {
  std::vector<const nlohmann::json*> out;
  if (!dashboard.contains("panels") || !dashboard["panels"].is_array()) return out;
  for (const nlohmann::json& p : dashboard["panels"]) {
    out.push_back(&p);
    if (p.contains("panels") && p["panels"].is_array()) {
      for (const nlohmann::json& inner : p["panels"]) out.push_back(&inner);
    }
  }
  return out;
}

inline std::vector<PanelTarget> Targets(const std::filesystem::path& path,
                                        const nlohmann::json& dashboard) {
  std::vector<PanelTarget> out;
  for (const nlohmann::json* p : Panels(dashboard)) {
    if (!p->contains("targets")) continue;
    for (const nlohmann::json& t : (*p)["targets"]) {
      PanelTarget target;
      target.dashboard = path.filename().string();
      target.panel_id = p->value("id", 0);
      target.panel_title = p->value("title", "");
      target.ref_id = t.value("refId", "");
      target.expr = t.value("expr", "");
      target.instant = t.value("instant", false);
      out.push_back(target);
    }
  }
  return out;
}

// Grafana's variables in an expression, replaced: $job_id / ${job_id} by `job`, and the interval
// variables by `interval` (e.g. "10s"). Other `$` uses (label_replace's "$1") stay.
inline std::string SubstituteVariables(std::string expr, const std::string& job,
                                       const std::string& interval) {
  const std::vector<std::pair<std::string, std::string>> vars = {{"__rate_interval", interval},
                                                                 {"__interval", interval},
                                                                 {"__range", interval},
                                                                 {"job_id", job}};
  for (const auto& [name, value] : vars) {
    for (const std::string& form : {"${" + name + "}", "$" + name}) {
      for (size_t at = expr.find(form); at != std::string::npos; at = expr.find(form, at)) {
        // $job_id must not eat the start of a longer name ($job_ids).
        const size_t end = at + form.size();
        if (form[1] != '{' && end < expr.size() &&
            (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
          at = end;
          continue;
        }
        expr.replace(at, form.size(), value);
        at += value.size();
      }
    }
  }
  return expr;
}

// Targets that need a GPU: DCGM exporter series or the workers' NVML series.
inline bool NeedsGpu(const std::string& expr) {
  return expr.find("DCGM_") != std::string::npos || expr.find("meshrun_gpu_") != std::string::npos;
}

// The meshrun_* metric names an expression reads (histogram suffixes kept).
inline std::vector<std::string> MeshrunNames(const std::string& expr) {
  std::vector<std::string> names;
  static const std::regex name("meshrun_[A-Za-z0-9_]+");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name); it != std::sregex_iterator();
       ++it) {
    names.push_back(it->str());
  }
  return names;
}

}  // namespace meshrun::testing
