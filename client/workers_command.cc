// `meshrun workers` (see workers_command.h).
#include "client/workers_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "client/coordinator_client.h"

namespace meshrun::client {
namespace {

struct WorkersFlags {
  std::string output = "text";
  std::string coordinator;
};

int RunWorkers(const WorkersFlags& f) {
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  StatusOr<std::vector<v1::WorkerInfo>> workers = (*client)->ListWorkers();
  if (!workers.ok()) return ReportError(workers.status());
  if (f.output == "json") {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const v1::WorkerInfo& w : *workers) list.push_back(WorkerJson(w));
    std::cout << DumpJson(list) << std::endl;
    return kExitOk;
  }
  if (workers->empty()) {
    std::cout << "no workers registered (start one with `meshrun-worker`, or a local cluster "
                 "with `meshrun up`)"
              << std::endl;
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "SLOTS", "DEVICE", "ADDRESS", "METRICS", "LAST HEARTBEAT"}};
  for (const v1::WorkerInfo& w : *workers) {
    rows.push_back({w.name(), WorkerStateName(w.state()),
                    std::to_string(w.slots_in_use()) + "/" + std::to_string(w.slots()) + " busy",
                    w.device(), w.address(), w.metrics_address(),
                    FormatTime(w.last_heartbeat_at())});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

}  // namespace

void RegisterWorkersCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<WorkersFlags>();
  CLI::App* cmd = app.add_subcommand("workers", "List registered workers, their state and slots");
  cmd->add_option("-o,--output", f->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  AddCoordinatorOption(cmd, &f->coordinator);
  cmd->callback([f, &result] { result.run = [f] { return RunWorkers(*f); }; });
}

}  // namespace meshrun::client
