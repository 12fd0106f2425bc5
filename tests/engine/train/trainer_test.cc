// The trainer in one process: the ranks of a mesh are threads over the fake backend (no sockets,
// no child processes) against one rank that trains the same global batches alone. What is
// checked is what the parallelism promises (docs/parallelism.md): the same loss at every step
// within float32 rounding, and per axis exactly the bus bytes of engine/train/comm_volume's
// formulas. Nothing here reads a clock.
#include "engine/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/fake_backend.h"
#include "engine/comm/store.h"
#include "engine/train/comm_volume.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

// A few kilobytes of varied text, written once per test into a fresh folder (nothing is
// downloaded; the same bytes every run).
class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_trainer_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::ofstream out(dir_ / "train.txt");
    uint32_t x = 12345;
    for (int line = 0; line < 200; ++line) {
      out << "line " << line << ": ";
      for (int w = 0; w < 8; ++w) {
        x = x * 1664525u + 1013904223u;
        out << "word" << (x >> 24) % 37 << ' ';
      }
      out << '\n';
    }
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  JobSpec Spec(int dp_shard, int tp, int cp = 1, int dp_replicate = 1) const {
    JobSpec spec;
    spec.name = "trainer-test";
    spec.model.n_layer = 2;
    spec.model.n_head = 4;
    spec.model.d_model = 32;
    spec.model.seq_len = 32;
    spec.model.vocab_size = 256;
    spec.parallelism.dp_replicate_size = dp_replicate;
    spec.parallelism.dp_shard_size = dp_shard;
    spec.parallelism.cp_size = cp;
    spec.parallelism.tp_size = tp;
    spec.parallelism.comm_timeout_seconds = 60;
    spec.train.steps = 3;
    spec.train.global_batch_size = 4;
    spec.train.micro_batch_size = 1;
    spec.train.lr = 1e-3;
    spec.train.warmup_steps = 1;
    spec.data.train = (dir_ / "train.txt").string();
    spec.data.format = "text";
    spec.resources.threads = 1;  // the ranks are threads of one process: one OpenMP thread each
    return spec;
  }

  fs::path dir_;
};

TrainOptions Options() {
  TrainOptions options;
  options.peak_flops = 1e12;  // MFU against a fixed figure: no GEMM measurement at start
  return options;
}

StatusOr<RunSummary> TrainAlone(const JobSpec& spec) {
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(spec, Options()));
  return trainer->Run(nullptr);
}

// Every rank of spec's mesh as a thread over one FakeBackend and one in-memory store.
std::vector<StatusOr<RunSummary>> TrainAsThreads(const JobSpec& spec) {
  StatusOr<ParallelDims> dims =
      ParallelDims::Create(spec.parallelism.dp_replicate_size, spec.parallelism.dp_shard_size,
                           spec.parallelism.cp_size, spec.parallelism.tp_size);
  EXPECT_TRUE(dims.ok()) << dims.status().ToString();
  if (!dims.ok()) return {};
  const int world = dims->world_size();
  auto backend = std::make_shared<FakeBackend>();
  std::shared_ptr<Store> store = std::make_shared<InMemoryStore>();
  std::vector<StatusOr<RunSummary>> results(world, InternalError("the rank did not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = [&]() -> StatusOr<RunSummary> {
        MeshCommsOptions comm_options;
        comm_options.timeout = std::chrono::seconds(spec.parallelism.comm_timeout_seconds);
        MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<MeshComms> comms,
                                 MeshComms::Create(*dims, rank, store, *backend,
                                                   std::make_shared<CommStats>(), comm_options));
        RankContext ctx;
        ctx.rank = rank;
        ctx.comms = std::move(comms);
        ctx.store = store;
        MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                                 Trainer::Create(spec, Options(), ctx));
        return trainer->Run(nullptr);
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

void ExpectLikeOneRank(const JobSpec& spec, const RunSummary& alone) {
  const std::vector<StatusOr<RunSummary>> ranks = TrainAsThreads(spec);
  ASSERT_FALSE(ranks.empty());
  const std::map<std::string, double> want = ExpectedCommBytesPerStep(spec);
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    ASSERT_TRUE(ranks[rank].ok()) << ranks[rank].status().ToString();
    const RunSummary& s = *ranks[rank];
    ASSERT_EQ(s.losses.size(), alone.losses.size());
    for (size_t k = 0; k < s.losses.size(); ++k) {
      EXPECT_NEAR(s.losses[k], alone.losses[k], 1e-4 * alone.losses[k]) << "step " << k + 1;
    }
    ASSERT_EQ(s.comm_bytes.size(), want.size());
    for (const auto& [axis, got] : s.comm_bytes) {
      const double bytes = want.at(MeshAxisName(axis));  // the formulas' keys are the labels
      EXPECT_NEAR(got, bytes, 1e-9 * std::max(1.0, bytes)) << MeshAxisName(axis);
    }
  }
}

TEST_F(TrainerTest, DpShardTimesTpOverTheFakeBackendTrainsLikeOneRank) {
  StatusOr<RunSummary> alone = TrainAlone(Spec(1, 1));
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  ASSERT_EQ(alone->losses.size(), 3u);
  for (const auto& [axis, bytes] : alone->comm_bytes) EXPECT_EQ(bytes, 0) << MeshAxisName(axis);

  const JobSpec spec = Spec(/*dp_shard=*/2, /*tp=*/2);
  const std::map<std::string, double> want = ExpectedCommBytesPerStep(spec);
  EXPECT_GT(want.at("tp"), 0);
  EXPECT_GT(want.at("dp_shard"), 0);
  ExpectLikeOneRank(spec, *alone);
}

TEST_F(TrainerTest, CpTimesDpReplicateOverTheFakeBackendTrainsLikeOneRank) {
  StatusOr<RunSummary> alone = TrainAlone(Spec(1, 1));
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  const JobSpec spec = Spec(/*dp_shard=*/1, /*tp=*/1, /*cp=*/2, /*dp_replicate=*/2);
  const std::map<std::string, double> want = ExpectedCommBytesPerStep(spec);
  EXPECT_GT(want.at("cp"), 0);
  EXPECT_GT(want.at("dp_replicate"), 0);
  ExpectLikeOneRank(spec, *alone);
}

}  // namespace
}  // namespace meshrun
