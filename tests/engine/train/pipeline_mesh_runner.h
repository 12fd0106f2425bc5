// Runs a job's mesh in one process, every rank a thread over the fake backend, for the pipeline
// tests: each rank's per-step losses and grad norms, its validation losses and measured bubbles,
// and its own peak memory of each kind (every rank thread counts its tensors in a
// MemoryAccountScope of its own, so the figures are a rank's, as in a process of its own).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/fake_backend.h"
#include "engine/comm/store.h"
#include "engine/core/tensor.h"
#include "engine/train/trainer.h"

namespace meshrun {

struct PipeStepRecord {
  std::vector<double> losses, grad_norms;
  std::vector<double> evals;    // the validation losses, in order
  std::vector<double> bubbles;  // StepMetrics::pipeline_bubble_ratio
  // The rank's peak bytes of each kind over its run (Trainer::Run: from its start to its end,
  // evaluations included).
  MemoryBreakdown memory;
};

class PipeRecordSteps : public TrainObserver {
 public:
  explicit PipeRecordSteps(PipeStepRecord* out) : out_(out) {}
  void OnStep(const StepMetrics& m) override {
    out_->losses.push_back(m.loss);
    out_->grad_norms.push_back(m.grad_norm);
    out_->bubbles.push_back(m.pipeline_bubble_ratio);
  }
  void OnEval(const EvalMetrics& e) override { out_->evals.push_back(e.loss); }

 private:
  PipeStepRecord* out_;
};

// Every rank of `spec`'s mesh (a valid spec on cpu) as a thread; each rank's record, in rank
// order. stop_after > 0: TrainOptions::stop_after_step.
inline std::vector<StatusOr<PipeStepRecord>> RunMeshInProcess(const JobSpec& spec,
                                                              int64_t stop_after = 0) {
  const StatusOr<ParallelDims> dims = MeshOf(spec);
  if (!dims.ok()) return {dims.status()};
  if (Status valid = ValidateJobSpec(spec); !valid.ok()) return {valid};
  const int world = dims->world_size();
  auto backend = std::make_shared<FakeBackend>();
  std::shared_ptr<Store> store = std::make_shared<InMemoryStore>();
  std::vector<StatusOr<PipeStepRecord>> results(world, InternalError("the rank did not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      MemoryAccountScope account;  // this rank's tensors, counted apart
      results[rank] = [&]() -> StatusOr<PipeStepRecord> {
        RankContext ctx;
        ctx.rank = rank;
        if (world > 1) {
          MeshCommsOptions comm_options;
          comm_options.timeout = std::chrono::seconds(60);
          MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<MeshComms> comms,
                                   MeshComms::Create(*dims, rank, store, *backend,
                                                     std::make_shared<CommStats>(), comm_options));
          ctx.comms = std::move(comms);
          ctx.store = store;
        }
        TrainOptions options;
        options.peak_flops = 1e12;  // no GEMM measurement
        options.stop_after_step = stop_after;
        MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                                 Trainer::Create(spec, options, ctx));
        PipeStepRecord record;
        PipeRecordSteps observer(&record);
        MESHRUN_RETURN_IF_ERROR(trainer->Run(&observer).status());
        record.memory = MemoryBreakdownOf(DeviceType::kCpu);
        return record;
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace meshrun
