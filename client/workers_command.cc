// `meshrun workers` (see workers_command.h).
#include "client/workers_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "client/command.h"
#include "client/coordinator_client.h"

namespace meshrun::client {
namespace {

struct WorkersFlags {
  std::string output = "text";
  std::string coordinator;
  int page_size = 500;
  std::string page_token;
  bool one_page = false;
  std::vector<std::string> states;
};

// Pages of --page-size workers, each printed before the next is asked for (text), or collected
// (JSON); with --page-token or --one-page only that page, and the token of the next one.
int RunWorkers(const WorkersFlags& f) {
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  v1::ListWorkersRequest request;
  request.set_page_size(f.page_size);
  request.set_page_token(f.page_token);
  for (const std::string& state : f.states) {
    v1::WorkerState value;
    if (v1::WorkerState_Parse("WORKER_STATE_" + state, &value)) request.add_states(value);
  }
  const bool single = f.one_page || !f.page_token.empty();
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  bool header_printed = false;
  size_t shown = 0;
  std::string next;
  while (true) {
    StatusOr<v1::ListWorkersResponse> page = (*client)->ListWorkers(request);
    if (!page.ok()) return ReportError(page.status());
    next = page->next_page_token();
    shown += static_cast<size_t>(page->workers_size());
    if (f.output == "json") {
      for (const v1::WorkerInfo& w : page->workers()) list.push_back(WorkerJson(w));
    } else if (page->workers_size() > 0) {
      std::vector<std::vector<std::string>> rows;
      if (!header_printed) {
        rows.push_back(
            {"NAME", "STATE", "SLOTS", "DEVICE", "ADDRESS", "METRICS", "LAST HEARTBEAT"});
        header_printed = true;
      }
      for (const v1::WorkerInfo& w : page->workers()) {
        rows.push_back(
            {w.name(), WorkerStateName(w.state()) + std::string(w.drained() ? " (drained)" : ""),
             std::to_string(w.slots_in_use()) + "/" + std::to_string(w.slots()) + " busy",
             w.device(), w.address(), w.metrics_address(), FormatTime(w.last_heartbeat_at())});
      }
      PrintTable(std::cout, rows);
    }
    // A coordinator from before paging answers every worker and no token.
    if (single || next.empty()) break;
    request.set_page_token(next);
  }
  if (f.output == "json") {
    if (single) {
      std::cout << DumpJson(nlohmann::ordered_json{{"workers", list}, {"next_page_token", next}})
                << std::endl;
    } else {
      std::cout << DumpJson(list) << std::endl;
    }
    return kExitOk;
  }
  if (shown == 0 && f.page_token.empty()) {
    std::cout << "no workers registered (start one with `meshrun-worker`, or a local cluster "
                 "with `meshrun up`)"
              << std::endl;
    return kExitOk;
  }
  if (single && !next.empty()) {
    std::cout << "\nmore workers: meshrun workers --page-token " << next << std::endl;
  }
  return kExitOk;
}

// `meshrun workers drain NAME` / `undrain NAME`.
int RunDrain(const std::string& coordinator, const std::string& name, bool drain,
             const std::string& output) {
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(coordinator);
  if (!client.ok()) return ReportError(client.status());
  StatusOr<v1::DrainWorkerResponse> r = (*client)->DrainWorker(name, drain);
  if (!r.ok()) return ReportError(r.status());
  if (output == "json") {
    nlohmann::ordered_json jobs = nlohmann::ordered_json::array();
    for (const std::string& j : r->jobs()) jobs.push_back(j);
    std::cout << DumpJson(
                     nlohmann::ordered_json{{"worker", WorkerJson(r->worker())}, {"jobs", jobs}})
              << std::endl;
    return kExitOk;
  }
  std::string text = "worker " + EscapeControl(name) + (drain ? " drained" : " undrained");
  if (drain) {
    text += r->jobs_size() == 0 ? ": it takes no new ranks; no job runs on it"
                                : ": it takes no new ranks; " + std::to_string(r->jobs_size()) +
                                      " job(s) checkpoint now and move off it:";
    for (const std::string& j : r->jobs()) text += " " + EscapeControl(j);
  } else {
    text += ": it takes ranks again";
  }
  std::cout << text << std::endl;
  return kExitOk;
}

}  // namespace

void RegisterWorkersCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<WorkersFlags>();
  CLI::App* cmd = app.add_subcommand("workers", "List registered workers, their state and slots");
  cmd->add_option("-o,--output", f->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--page-size", f->page_size, "workers asked for per call (at most 1000)")
      ->check(WholeNumber(1, 1000))
      ->capture_default_str();
  cmd->add_option("--page-token", f->page_token, "only the page that `more workers:` named");
  cmd->add_flag("--one-page", f->one_page, "only the first page, and the token of the next");
  cmd->add_option("--state", f->states, "only workers in this state (repeatable)")
      ->check(CLI::IsMember({"READY", "BUSY", "LOST"}, CLI::ignore_case))
      ->transform([](std::string s) {
        for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return s;
      });
  AddCoordinatorOption(cmd, &f->coordinator);
  // `workers drain NAME` / `workers undrain NAME` (docs/cli.md; decision 0056).
  struct DrainFlags {
    std::string name, coordinator, output = "text";
  };
  std::vector<CLI::App*> drains;
  for (const bool drain : {true, false}) {
    auto d = std::make_shared<DrainFlags>();
    CLI::App* sub = cmd->add_subcommand(
        drain ? "drain" : "undrain",
        drain ? "Drain a worker: its jobs checkpoint now and re-mesh without it; it takes no "
                "new ranks"
              : "Undrain a worker: it takes ranks again");
    sub->add_option("NAME", d->name, "the worker's name (meshrun workers lists them)")->required();
    sub->add_option("-o,--output", d->output, "output format: text or json")
        ->check(CLI::IsMember({"text", "json"}));
    AddCoordinatorOption(sub, &d->coordinator);
    sub->callback([d, drain, f, &result] {
      const std::string coordinator = d->coordinator.empty() ? f->coordinator : d->coordinator;
      result.run = [d, drain, coordinator] {
        return RunDrain(coordinator, d->name, drain, d->output);
      };
    });
    drains.push_back(sub);
  }
  cmd->callback([f, drains, &result] {
    for (CLI::App* sub : drains) {
      if (sub->parsed()) return;
    }
    result.run = [f] { return RunWorkers(*f); };
  });
}

}  // namespace meshrun::client
