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
            {w.name(), WorkerStateName(w.state()),
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
  cmd->callback([f, &result] { result.run = [f] { return RunWorkers(*f); }; });
}

}  // namespace meshrun::client
