// Lion (train.optimizer: lion) on every mesh of the equivalence suite
// (tests/integration/parallel_test.cc), in one process: the ranks are threads over the fake
// backend, and every rank's loss and global grad norm at every step equal one rank's (within
// float32 rounding). Lion's state is elementwise, so it follows the shard like AdamW's: nothing
// of the mesh reaches the optimizer. Also: the optimizer's state is what the memory model
// counts for both optimizers (engine/train/memory_model.cc and common/memory_estimate.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/memory_estimate.h"
#include "engine/train/counted_step.h"
#include "engine/train/memory_model.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"
#include "tests/engine/train/pipeline_mesh_runner.h"
#include "tests/fakes/byte_level.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

struct OptimizerMesh {
  int R = 1, S = 1, C = 1, T = 1;
  std::string cp_strategy = "allgather";
  std::string recompute = "none";
  bool reshard = true;
  std::string Name() const {
    return "R" + std::to_string(R) + "S" + std::to_string(S) + "C" + std::to_string(C) + "T" +
           std::to_string(T) + (C > 1 ? "_" + cp_strategy : "") +
           (recompute != "none" ? "_ac_" + recompute : "") + (reshard ? "" : "_keep");
  }
};

class OptimizerMeshTest : public ::testing::TestWithParam<OptimizerMesh> {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/meshrun_optimizer_mesh_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = new fs::path(pattern);
    std::ofstream out(*dir_ / "train.txt");
    uint32_t x = 2468;
    for (int line = 0; line < 200; ++line) {
      out << "row " << line << ": ";
      for (int w = 0; w < 8; ++w) {
        x = x * 1664525u + 1013904223u;
        out << "tok" << (x >> 24) % 41 << ' ';
      }
      out << '\n';
    }
    // A byte-level tokenizer (ids 0..255 the bytes, 256 its end-of-text token) for document
    // masks and instruction data, and instruction records rendered by a template.
    fs::create_directories(*dir_ / "tokenizer");
    std::ofstream(*dir_ / "tokenizer" / "tokenizer.json") << ByteTokenizerJson();
    std::ofstream jsonl(*dir_ / "train.jsonl");
    for (int i = 0; i < 60; ++i) {
      jsonl << R"({"prompt": "q)" << i % 13 << R"(", "completion": "a)" << i * 3 % 11 << R"("})"
            << '\n';
    }
  }
  static std::string ByteTokenizerJson() {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[testing::ByteLevelChar(b)] = b;
    vocab["<|endoftext|>"] = 256;
    const nlohmann::json j = {
        {"version", "1.0"},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    return j.dump();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }

  static JobSpec LionSpec(const OptimizerMesh& m) {
    JobSpec spec;
    spec.name = "optimizer-mesh-test";
    spec.model.n_layer = 2;
    spec.model.n_head = 4;
    spec.model.d_model = 32;
    spec.model.seq_len = 32;
    spec.model.vocab_size = 256;
    spec.parallelism.dp_replicate_size = m.R;
    spec.parallelism.dp_shard_size = m.S;
    spec.parallelism.cp_size = m.C;
    spec.parallelism.tp_size = m.T;
    spec.parallelism.cp_comm_strategy = m.cp_strategy;
    spec.parallelism.fsdp_reshard_after_forward = m.reshard;
    spec.parallelism.comm_timeout_seconds = 60;
    spec.train.activation_checkpointing = m.recompute;
    spec.train.optimizer = "lion";
    spec.train.steps = 5;
    spec.train.global_batch_size = 4;
    spec.train.micro_batch_size = 1;
    spec.train.lr = 1e-3;
    spec.train.min_lr = 1e-4;
    spec.train.warmup_steps = 1;
    spec.train.weight_decay = 0.3;
    spec.data.train = (*dir_ / "train.txt").string();
    spec.data.format = "text";
    spec.resources.threads = 1;
    return spec;
  }

  static TrainOptions FixedPeak() {
    TrainOptions options;
    options.peak_flops = 1e12;
    return options;
  }

  static const RunSummary& OneRank() {
    static RunSummary* alone = [] {
      StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(LionSpec({}), FixedPeak());
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      StatusOr<RunSummary> s = (*t)->Run(nullptr);
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      return new RunSummary(std::move(s).value());
    }();
    return *alone;
  }

  static fs::path* dir_;
};

fs::path* OptimizerMeshTest::dir_ = nullptr;

TEST_P(OptimizerMeshTest, LionOnThisMeshTrainsLikeOneRank) {
  const RunSummary& alone = OneRank();
  ASSERT_EQ(alone.losses.size(), 5u);
  EXPECT_LT(alone.losses.back(), alone.losses.front());
  // Every rank as a thread over the fake backend (pipeline_mesh_runner.h).
  const std::vector<StatusOr<PipeStepRecord>> ranks = RunMeshInProcess(LionSpec(GetParam()));
  ASSERT_FALSE(ranks.empty());
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    ASSERT_TRUE(ranks[rank].ok()) << ranks[rank].status().ToString();
    const PipeStepRecord& s = *ranks[rank];
    ASSERT_EQ(s.losses.size(), alone.losses.size());
    for (size_t k = 0; k < s.losses.size(); ++k) {
      EXPECT_NEAR(s.losses[k], alone.losses[k], 1e-5 * alone.losses[k]) << "step " << k + 1;
    }
  }
}

// The architectures the counted step is held to: GPT-2; a Llama with grouped-query heads,
// biases on q, k and v (Qwen2's) and a sliding window shorter than the sequence (Mistral's);
// Gemma (GeGLU, (1+w) RMSNorm, scaled embeddings, a head_dim that is not d_model/n_head).
// (Two key/value heads of the four, or four under tp 4: tp divides them.)
void SetArchitecture(const std::string& arch, JobSpec* spec) {
  spec->model.arch = arch;
  const int kv_heads = spec->parallelism.tp_size > 2 ? 4 : 2;
  if (arch == "llama") {
    spec->model.n_kv_head = kv_heads;
    spec->model.d_ff = 48;
    spec->model.attention_bias = true;
    spec->model.sliding_window = 12;
    spec->model.tie_embeddings = false;
  } else if (arch == "gemma") {
    spec->model.n_kv_head = kv_heads;
    spec->model.d_ff = 40;
    spec->model.head_dim = 12;
  }
}

// The data the counted step is held to: plain text (bytes), documents (data.attention:
// document, through a tokenizer with an end-of-text token) and instruction records (JSONL
// rendered by a template: loss masks, and each sample its own document). The count reads none
// of it (zeros), so what the data holds must change no buffer's size.
void SetData(const std::string& data, const fs::path& dir, JobSpec* spec) {
  if (data == "text") return;
  spec->model.vocab_size = 260;
  spec->data.tokenizer = (dir / "tokenizer").string();
  spec->data.attention = "document";
  if (data == "instructions") {
    spec->data.train = (dir / "train.jsonl").string();
    spec->data.format = "auto";
    spec->data.chat_template = "Q: {prompt}\nA: {completion}";
  }
}

// The counting device (engine/train/counted_step.h) against the real step, for both optimizers,
// the three architectures, the three activation-checkpointing modes and the three kinds of data:
// every rank of the mesh, run as a thread on the CPU over the fake backend, peaks at exactly the
// bytes of each kind its count says, and moves exactly the bus bytes per axis its count says.
TEST_P(OptimizerMeshTest, EveryRankAllocatesAndSendsWhatItsCountSays) {
  for (const std::string data : {"text", "documents", "instructions"})
    for (const std::string arch : {"gpt2", "llama", "gemma"})
      for (const std::string recompute : {"none", "selective", "full"})
        for (const std::string optimizer : {"adamw", "lion"}) {
          SCOPED_TRACE(data + ", " + arch + ", activation_checkpointing " + recompute + ", " +
                       optimizer);
          JobSpec spec = LionSpec(GetParam());
          SetArchitecture(arch, &spec);
          SetData(data, *dir_, &spec);
          spec.train.activation_checkpointing = recompute;
          spec.train.optimizer = optimizer;
          spec.train.steps = 2;
          ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).ToString();
          const std::vector<StatusOr<PipeStepRecord>> ranks = RunMeshInProcess(spec);
          ASSERT_FALSE(ranks.empty());
          for (size_t rank = 0; rank < ranks.size(); ++rank) {
            SCOPED_TRACE("rank " + std::to_string(rank));
            ASSERT_TRUE(ranks[rank].ok()) << ranks[rank].status().ToString();
            // Every micro-batch, so that the bytes per step are the whole step's.
            const StatusOr<CountedRank> counted =
                CountRank(spec, static_cast<int>(rank), {.every_micro_batch = true});
            ASSERT_TRUE(counted.ok()) << counted.status().ToString();
            // Every kind, "other" too (token ids, positions and document bounds mirrored on
            // the device: without the count giving documents, 1,408 against 1,536 bytes).
            for (int k = 0; k < kNumMemoryKinds; ++k) {
              EXPECT_EQ(counted->memory.peak[k], ranks[rank]->memory.peak[k])
                  << MemoryKindName(static_cast<MemoryKind>(k));
            }
            EXPECT_GT(counted->memory.peak[static_cast<int>(MemoryKind::kOptimizer)], 0);
            // The planner's memory model (rank 0's coordinates) says the same.
            if (rank == 0) {
              const MemoryPrediction model = PredictRankMemory(spec);
              for (int k = 0; k < kNumMemoryKinds - 1; ++k) {
                EXPECT_EQ(model.bytes[k], ranks[rank]->memory.peak[k])
                    << "memory model, " << MemoryKindName(static_cast<MemoryKind>(k));
              }
            }
            // The default count (2 of the step's micro-batches) peaks as high.
            const StatusOr<CountedRank> few = CountRank(spec, static_cast<int>(rank));
            ASSERT_TRUE(few.ok()) << few.status().ToString();
            for (int k = 0; k < kNumMemoryKinds; ++k) {
              EXPECT_EQ(few->memory.peak[k], counted->memory.peak[k]);
            }
            const double steps = static_cast<double>(ranks[rank]->losses.size());
            for (const auto& [axis, bytes] : ranks[rank]->comm_bytes) {
              const auto it = counted->comm_bytes.find(axis);
              const double got = it == counted->comm_bytes.end() ? 0 : it->second;
              EXPECT_NEAR(got, bytes / steps, 1e-9 * bytes) << MeshAxisName(axis);
            }
            EXPECT_EQ(counted->comm_bytes.size(), ranks[rank]->comm_bytes.size());
          }
        }
}

// The meshes of tests/integration/parallel_test.cc's MeshEquivalence.
INSTANTIATE_TEST_SUITE_P(
    EquivalenceMeshes, OptimizerMeshTest,
    ::testing::Values(OptimizerMesh{2, 1, 1, 1}, OptimizerMesh{1, 2, 1, 1},
                      OptimizerMesh{1, 1, 2, 1, "allgather"}, OptimizerMesh{1, 1, 2, 1, "ring"},
                      OptimizerMesh{1, 1, 1, 2}, OptimizerMesh{1, 2, 1, 2},
                      OptimizerMesh{2, 2, 1, 1}, OptimizerMesh{1, 2, 2, 1},
                      OptimizerMesh{1, 1, 2, 2, "ring"}, OptimizerMesh{2, 1, 2, 2, "allgather"},
                      OptimizerMesh{1, 1, 1, 4}, OptimizerMesh{1, 4, 1, 1},
                      OptimizerMesh{1, 1, 4, 1, "ring"},
                      OptimizerMesh{1, 2, 1, 2, "allgather", "full"},
                      OptimizerMesh{1, 1, 2, 2, "ring", "selective"},
                      OptimizerMesh{1, 2, 2, 1, "allgather", "selective"},
                      OptimizerMesh{1, 2, 1, 1, "allgather", "none", false}),
    [](const ::testing::TestParamInfo<OptimizerMesh>& info) { return info.param.Name(); });

// The optimizer term of both memory models is the optimizer's own: its state names times the
// rank's shard (the engine's model) and times the parameters per shard (the worker's estimate).
TEST(OptimizerMemoryTest, BothModelsCountTheOptimizersOwnState) {
  for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kLion}) {
    SCOPED_TRACE(OptimizerName(kind));
    JobSpec spec;
    spec.train.optimizer = OptimizerName(kind);
    spec.parallelism.dp_shard_size = 2;
    spec.parallelism.tp_size = 2;
    ASSERT_EQ(OptimizerOf(spec.train), kind);
    const MemoryPrediction p = PredictRankMemory(spec);
    // The optimizer Trainer builds over the shard of rank 0 of this mesh.
    std::unique_ptr<Optimizer> opt = MakeOptimizer(kind, 1000, Device{});
    EXPECT_EQ(opt->state_bytes(), OptimizerStateBytes(kind, 1000));
    EXPECT_EQ(opt->state_bytes(), opt->num_states() * 1000 * 4);
    EXPECT_EQ(p.of(MemoryKind::kOptimizer) % (opt->num_states() * 4), 0);
    const StatusOr<ParallelDims> mesh = MeshOf(spec);
    ASSERT_TRUE(mesh.ok());
    const RankMemoryEstimate e = EstimateRankMemory(spec, *mesh);
    EXPECT_DOUBLE_EQ(e.state_bytes, e.parameters / 4 * 4 * (2 + opt->num_states()));
  }
  // Lion holds half of AdamW's optimizer memory.
  JobSpec adamw, lion;
  lion.train.optimizer = "lion";
  EXPECT_EQ(2 * PredictRankMemory(lion).of(MemoryKind::kOptimizer),
            PredictRankMemory(adamw).of(MemoryKind::kOptimizer));
}

}  // namespace
}  // namespace meshrun
