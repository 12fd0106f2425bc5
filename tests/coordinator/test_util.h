// Helpers shared by the coordinator tests: valid specs and submit requests, temporary state
// folders, bounded waiting, and calling a handler.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "common/job_spec.h"
#include "common/status.h"
#include "meshrun/v1/coordinator.pb.h"
#include "proto/spec_convert.h"

namespace meshrun::testing {

// Calls a unary handler of CoordinatorService (fn takes the done callback) and returns the status
// it answered with; the handlers tested with it answer synchronously.
template <typename Fn>
Status Call(Fn&& fn) {
  std::optional<Status> out;
  fn([&](const Status& s) { out = s; });
  EXPECT_TRUE(out.has_value());
  return out.value_or(InternalError("no answer"));
}

// A valid spec with the given mesh (model sizes chosen so every tp/cp up to 8 divides them).
inline v1::JobSpec SpecProto(int r, int s, int c, int t, int max_restarts = 0,
                             const std::string& device = "cpu") {
  JobSpec spec;
  spec.name = "test-job";
  spec.model.n_head = 8;
  spec.model.d_model = 64;
  spec.model.seq_len = 64;
  spec.parallelism.dp_replicate_size = r;
  spec.parallelism.dp_shard_size = s;
  spec.parallelism.cp_size = c;
  spec.parallelism.tp_size = t;
  spec.parallelism.cp_comm_strategy = "allgather";
  spec.train.steps = 4;
  spec.train.global_batch_size = 8 * r * s;
  spec.train.micro_batch_size = 1;
  spec.data.train = "/data/tiny.txt";
  spec.resources.device = device;
  spec.restart.max_restarts = max_restarts;
  v1::JobSpec proto = meshrun::JobSpecToProto(spec);
  proto.set_source_yaml("name: test-job\n");
  return proto;
}

inline v1::SubmitJobRequest SubmitRequest(int r, int s, int c, int t, int max_restarts = 0) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = SpecProto(r, s, c, t, max_restarts);
  return req;
}

// A fresh folder under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    path_ =
        (std::filesystem::temp_directory_path() /
         ("meshrun-coord-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++)))
            .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// Polls `done` every 5 ms for at most `limit`; true when it became true.
inline bool WaitFor(const std::function<bool()>& done,
                    std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

}  // namespace meshrun::testing
