// In-memory WorkerSessionStream and WatchJobStream: they record what the coordinator sends and
// how it finished the stream. Thread-safe.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/streams.h"

namespace meshrun::testing {

class FakeSessionStream final : public coordinator::WorkerSessionStream {
 public:
  bool Send(const v1::WorkerSessionResponse& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return false;
    sent_.push_back(message);
    return true;
  }
  void Finish(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = status;
  }
  std::string Peer() const override { return "fake"; }

  std::vector<v1::WorkerSessionResponse> sent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }
  // Messages of one kind (e.g. kAssign), in order.
  std::vector<v1::WorkerSessionResponse> sent(v1::WorkerSessionResponse::KindCase kind) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::WorkerSessionResponse> out;
    for (const auto& m : sent_) {
      if (m.kind_case() == kind) out.push_back(m);
    }
    return out;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.clear();
  }
  std::optional<Status> finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<v1::WorkerSessionResponse> sent_;
  std::optional<Status> finished_;
};

class FakeWatchStream final : public coordinator::WatchJobStream {
 public:
  // Refuses (returns false) after `capacity` events, like a client that fell behind.
  explicit FakeWatchStream(size_t capacity = SIZE_MAX) : capacity_(capacity) {}

  bool Send(const v1::WatchJobResponse& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || events_.size() >= capacity_) return false;
    events_.push_back(message.event());
    return true;
  }
  void Finish(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) finished_ = status;
  }
  std::vector<v1::JobEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::optional<Status> finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<v1::JobEvent> events_;
  std::optional<Status> finished_;
};

}  // namespace meshrun::testing
