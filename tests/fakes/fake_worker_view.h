// A WorkerView whose live workers the test sets, and which records every message JobManager
// sends to each worker. Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/worker_manager.h"

namespace meshrun::testing {

class FakeWorkerView final : public coordinator::WorkerView {
 public:
  // Adds (or replaces) a live worker; the id is the name.
  void Add(const std::string& name, int slots, const std::string& device = "cpu") {
    std::lock_guard<std::mutex> lock(mu_);
    workers_[name] = {name, name, device, slots};
  }
  // `meshrun workers drain NAME` as WorkerManager::SetDrained keeps it.
  void SetDrained(const std::string& name, bool drained) {
    std::lock_guard<std::mutex> lock(mu_);
    workers_[name].drained = drained;
  }
  void Remove(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    workers_.erase(name);
  }

  std::vector<coordinator::LiveWorker> LiveWorkers() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<coordinator::LiveWorker> out;
    for (const auto& [name, w] : workers_) out.push_back(w);
    return out;
  }
  void Send(const std::string& worker_id, const v1::WorkerSessionResponse& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_[worker_id].push_back(message);
  }

  // Messages sent to `worker` of one kind, and then forgets them (so a test reads each once).
  std::vector<v1::WorkerSessionResponse> Take(const std::string& worker,
                                              v1::WorkerSessionResponse::KindCase kind) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::WorkerSessionResponse> out, keep;
    for (auto& m : sent_[worker]) (m.kind_case() == kind ? out : keep).push_back(std::move(m));
    sent_[worker] = std::move(keep);
    return out;
  }
  // The kinds of the messages sent to `worker` not yet taken, in the order they were sent.
  std::vector<v1::WorkerSessionResponse::KindCase> Kinds(const std::string& worker) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::WorkerSessionResponse::KindCase> out;
    for (const auto& m : sent_[worker]) out.push_back(m.kind_case());
    return out;
  }
  std::vector<v1::RankAssignment> TakeAssignments(const std::string& worker) {
    std::vector<v1::RankAssignment> out;
    for (auto& m : Take(worker, v1::WorkerSessionResponse::kAssign)) out.push_back(m.assign());
    return out;
  }
  std::vector<v1::StopOrder> TakeStops(const std::string& worker) {
    std::vector<v1::StopOrder> out;
    for (auto& m : Take(worker, v1::WorkerSessionResponse::kStop)) out.push_back(m.stop());
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, coordinator::LiveWorker> workers_;
  std::map<std::string, std::vector<v1::WorkerSessionResponse>> sent_;
};

}  // namespace meshrun::testing
