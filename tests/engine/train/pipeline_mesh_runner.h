// The in-process mesh runner of the pipeline tests (pipeline_mesh_test.cc,
// pipeline_zero_bubble_test.cc, pipeline_mesh_more_test.cc, pipeline_memory_test.cc; its
// RunMeshInProcess also optimizer_mesh_test.cc's): every rank of a job's mesh as a thread over the
// fake backend, each rank's losses, grad norms, evaluations and measured bubbles, and one rank's
// run to hold them to (1e-5 relative); each rank's own peak memory of each kind (every rank thread
// counts its tensors in a MemoryAccountScope of its own, so the figures are a rank's, as in a
// process of its own).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/fake_backend.h"
#include "engine/comm/store.h"
#include "engine/core/tensor.h"
#include "engine/train/trainer.h"

namespace meshrun {
namespace pipeline_mesh_runner {

namespace fs = std::filesystem;

struct PipeStepRecord {
  std::vector<double> losses, grad_norms;
  std::vector<double> evals;    // the validation loss every 5 steps
  std::vector<double> bubbles;  // StepMetrics::pipeline_bubble_ratio
  // StepMetrics::pipeline_ops and pipeline_op_seconds, per step.
  std::vector<std::array<int, 4>> ops;
  std::vector<std::array<double, 4>> op_seconds;
  // The rank's peak bytes of each kind over its run (Trainer::Run: from its start to its end,
  // evaluations included).
  MemoryBreakdown memory;
  // The bus bytes the rank moved over each axis up to its last step (StepMetrics::comm).
  std::map<MeshAxis, double> comm_bytes;
};

class PipeRecordSteps : public TrainObserver {
 public:
  explicit PipeRecordSteps(PipeStepRecord* out) : out_(out) {}
  void OnStep(const StepMetrics& m) override {
    out_->losses.push_back(m.loss);
    out_->grad_norms.push_back(m.grad_norm);
    out_->bubbles.push_back(m.pipeline_bubble_ratio);
    std::array<int, 4> n{};
    std::array<double, 4> t{};
    for (int k = 0; k < 4; ++k) n[k] = m.pipeline_ops[k], t[k] = m.pipeline_op_seconds[k];
    out_->ops.push_back(n);
    out_->op_seconds.push_back(t);
    out_->comm_bytes.clear();
    for (const auto& [key, counter] : m.comm) {
      if (key.first.kind == CommKind::kAxis) out_->comm_bytes[key.first.axis] += counter.bytes;
    }
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

struct PipeMesh {
  int P = 1, S = 1, T = 1, R = 1, C = 1;
};

class PipelineMeshRunner : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/meshrun_pipeline_mesh_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = new fs::path(pattern);
    std::ofstream out(*dir_ / "train.txt");
    uint32_t x = 1357;
    for (int line = 0; line < 400; ++line) {
      out << "row " << line << ": ";
      for (int w = 0; w < 8; ++w) {
        x = x * 1664525u + 1013904223u;
        out << "tok" << (x >> 24) % 37 << ' ';
      }
      out << '\n';
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }

  static JobSpec Spec(const std::string& arch, int n_layer, const PipeMesh& m) {
    JobSpec spec;
    spec.name = "pipeline-mesh-test";
    spec.model.arch = arch;
    spec.model.n_layer = n_layer;
    spec.model.n_head = 4;
    spec.model.d_model = 32;
    spec.model.seq_len = 16;
    spec.model.vocab_size = 256;
    if (arch == "llama") {
      spec.model.n_kv_head = 2;
      spec.model.d_ff = 64;
      spec.model.tie_embeddings = false;
    }
    spec.parallelism.pp_size = m.P;
    spec.parallelism.dp_replicate_size = m.R;
    spec.parallelism.dp_shard_size = m.S;
    spec.parallelism.cp_size = m.C;
    spec.parallelism.tp_size = m.T;
    spec.parallelism.comm_timeout_seconds = 60;
    spec.train.steps = 20;
    spec.train.global_batch_size = 8;
    spec.train.micro_batch_size = 2;
    spec.train.lr = 3e-3;
    spec.train.min_lr = 3e-4;
    spec.train.warmup_steps = 2;
    spec.train.grad_clip = 1.0;
    spec.data.train = (*dir_ / "train.txt").string();
    spec.data.format = "text";
    spec.data.val = spec.data.train;  // evaluated through the pipeline every 5 steps
    spec.data.eval_every = 5;
    spec.resources.threads = 1;
    return spec;
  }

  static TrainOptions FixedPeak() {
    TrainOptions options;
    options.peak_flops = 1e12;
    return options;
  }

  // Every rank of `spec`'s mesh as a thread; each rank's per-step losses and grad norms.
  static std::vector<StatusOr<PipeStepRecord>> Run(const JobSpec& spec, int64_t stop_after = 0) {
    const StatusOr<ParallelDims> dims = MeshOf(spec);
    EXPECT_TRUE(dims.ok()) << dims.status().ToString();
    if (!dims.ok()) return {};
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
    return RunMeshInProcess(spec, stop_after);
  }

  // Every rank's losses and grad norms equal the reference's (1e-5 relative).
  static void ExpectTrainsLike(const std::vector<StatusOr<PipeStepRecord>>& ranks,
                               const PipeStepRecord& want, size_t first_step = 0) {
    ASSERT_FALSE(ranks.empty());
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      ASSERT_TRUE(ranks[rank].ok()) << ranks[rank].status().ToString();
      const PipeStepRecord& got = *ranks[rank];
      ASSERT_EQ(got.losses.size() + first_step, want.losses.size());
      for (size_t k = 0; k < got.losses.size(); ++k) {
        const double loss = want.losses[first_step + k];
        const double norm = want.grad_norms[first_step + k];
        EXPECT_NEAR(got.losses[k], loss, 1e-5 * loss) << "step " << first_step + k + 1;
        EXPECT_NEAR(got.grad_norms[k], norm, 1e-5 * norm) << "step " << first_step + k + 1;
      }
      // The measured bubble is a part of the step (0 without pp).
      for (double b : got.bubbles) {
        EXPECT_GE(b, 0.0);
        EXPECT_LE(b, 1.0);
      }
      if (first_step == 0 && got.losses.size() == want.losses.size()) {
        ASSERT_EQ(got.evals.size(), want.evals.size());
        for (size_t e = 0; e < got.evals.size(); ++e) {
          EXPECT_NEAR(got.evals[e], want.evals[e], 1e-5 * want.evals[e]) << "evaluation " << e;
        }
      }
    }
  }

  // One rank's run of Spec(arch, n_layer) over `steps` steps (computed once per binary).
  static const PipeStepRecord& OneRank(const std::string& arch, int n_layer, int steps = 20) {
    static std::map<std::string, PipeStepRecord>* cache =
        new std::map<std::string, PipeStepRecord>();
    const std::string key = arch + std::to_string(n_layer) + "/" + std::to_string(steps);
    if (!cache->count(key)) {
      JobSpec spec = Spec(arch, n_layer, {});
      spec.train.steps = steps;
      std::vector<StatusOr<PipeStepRecord>> one = Run(spec);
      EXPECT_EQ(one.size(), 1u);
      EXPECT_TRUE(one[0].ok()) << one[0].status().ToString();
      (*cache)[key] = one[0].ok() ? *one[0] : PipeStepRecord();
      const PipeStepRecord& r = (*cache)[key];
      EXPECT_EQ(r.losses.size(), static_cast<size_t>(steps));
      EXPECT_EQ(r.evals.size(), static_cast<size_t>(steps / 5));
      for (double b : r.bubbles) EXPECT_EQ(b, 0.0);
      if (!r.losses.empty()) {
        EXPECT_LT(r.losses.back(), r.losses.front());
      }
    }
    return (*cache)[key];
  }

  static inline fs::path* dir_ = nullptr;
};

}  // namespace pipeline_mesh_runner

using pipeline_mesh_runner::PipelineMeshRunner;
using pipeline_mesh_runner::PipeMesh;
using pipeline_mesh_runner::PipeStepRecord;
using pipeline_mesh_runner::RunMeshInProcess;

}  // namespace meshrun
