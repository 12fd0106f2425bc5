// The asynchronous pipeline executor (decision 0064): its receives (PipelineReceives) keep the
// lockstep timetable's peak of receive buffers, the memory model's count, while posting ahead of
// it; its send buffers; and its training equal to the lockstep executor's bit for bit under
// every schedule (the same operations in the same order on every rank).
#include <gtest/gtest.h>

#include "engine/train/memory_model.h"
#include "engine/train/pipeline.h"
#include "tests/engine/train/pipeline_mesh_runner.h"

namespace meshrun {
namespace {

using pipeline_mesh_runner::PipelineMeshRunner;
using pipeline_mesh_runner::PipeMesh;
using pipeline_mesh_runner::PipeRecordSteps;
using pipeline_mesh_runner::PipeStepRecord;

struct AsyncShape {
  PpSchedule schedule;
  const char* name;
  int P, M, v;
};

const AsyncShape kAsyncShapes[] = {
    {PpSchedule::k1F1B, "1f1b", 2, 4, 1},
    {PpSchedule::k1F1B, "1f1b", 4, 8, 1},
    {PpSchedule::k1F1B, "1f1b", 4, 3, 1},
    {PpSchedule::kInterleaved1F1B, "interleaved_1f1b", 2, 8, 2},
    {PpSchedule::kInterleaved1F1B, "interleaved_1f1b", 4, 8, 2},
    {PpSchedule::kInterleaved1F1B, "interleaved_1f1b", 2, 4, 3},
    {PpSchedule::kZeroBubble, "zero_bubble", 2, 8, 1},
    {PpSchedule::kZeroBubble, "zero_bubble", 4, 8, 1},
};

TEST(PipelineAsyncReceivesTest, PostAheadWithinTheLockstepPeakAndBeforeTheirConsumer) {
  for (const AsyncShape& s : kAsyncShapes) {
    SCOPED_TRACE(std::string(s.name) + " P " + std::to_string(s.P) + " M " + std::to_string(s.M) +
                 " v " + std::to_string(s.v));
    std::vector<std::vector<PipeOp>> ops(s.P);
    for (int p = 0; p < s.P; ++p) ops[p] = PipelineOps(s.schedule, s.P, p, s.M, s.v);
    const StatusOr<PipeTimetable> table = BuildTimetable(ops, s.P, s.v, s.M);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    // The memory model's count of the lockstep timetable, through a spec of this shape.
    JobSpec spec;
    spec.parallelism.pp_size = s.P;
    spec.parallelism.pp_schedule = s.name;
    spec.parallelism.pp_virtual_stages = s.v;
    spec.train.micro_batch_size = 1;
    spec.train.global_batch_size = s.M;
    int ahead = 0;
    for (int p = 0; p < s.P; ++p) {
      SCOPED_TRACE("stage " + std::to_string(p));
      const std::vector<PipeRecv> recvs = PipelineReceives(ops, *table, s.P, s.v, p);
      EXPECT_EQ(PipelineReceiveBuffersHeld(ops[p], recvs, s.P, s.v, p),
                PipelineBuffersAtPeak(spec, p));
      // Every input a chunk's operation reads is received once, posted no later than it, and
      // the posts keep their order.
      const int G = s.P * s.v;
      size_t expected = 0;
      for (const PipeOp& op : ops[p]) {
        const int g = op.chunk * s.P + p;
        if (op.kind == PipeOpKind::kForward && g > 0) ++expected;
        if (op.kind == PipeOpKind::kBackward && g == G - 1 && g > 0) ++expected;  // no forward
        if (op.kind == PipeOpKind::kBackward && g < G - 1) ++expected;
      }
      EXPECT_EQ(recvs.size(), expected);
      int last = 0;
      for (const PipeRecv& r : recvs) {
        EXPECT_GE(r.before_op, last);
        last = r.before_op;
        int consumer = -1;
        for (size_t j = 0; j < ops[p].size() && consumer < 0; ++j) {
          const PipeOp& op = ops[p][j];
          if (op.chunk == r.chunk && op.micro == r.micro && op.kind != PipeOpKind::kWeight &&
              (r.gradient ? op.kind == PipeOpKind::kBackward : true)) {
            consumer = static_cast<int>(j);
          }
        }
        ASSERT_GE(consumer, 0);
        EXPECT_LE(r.before_op, consumer);
      }
      // Never after the lockstep's post (after the slot whose operation produced it, before
      // the rank's next operation), and ahead of it where the peak allows.
      const int next = (p + 1) % s.P, prev = (p + s.P - 1) % s.P;
      std::vector<int> lockstep;
      int own = 0;
      for (size_t t = 0; t < table->slots.size(); ++t) {
        if (table->slots[t][p] >= 0) ++own;
        const int f = table->slots[t][prev], b = table->slots[t][next];
        if (f >= 0 && ops[prev][f].kind == PipeOpKind::kForward) lockstep.push_back(own);
        if (b >= 0 && ops[next][b].kind == PipeOpKind::kBackward &&
            ops[next][b].chunk * s.P + next > 0) {
          lockstep.push_back(own);
        }
      }
      ASSERT_EQ(lockstep.size(), recvs.size());
      for (size_t i = 0; i < recvs.size(); ++i) {
        EXPECT_LE(recvs[i].before_op, lockstep[i]);
        if (recvs[i].before_op < lockstep[i]) ++ahead;
      }
    }
    // Every shape has room to post some receive ahead (its lockstep peak is not held between
    // every two operations).
    EXPECT_GT(ahead, 0);
  }
}

TEST(PipelineAsyncReceivesTest, SendBuffersAreARingOfTwoWhereTheStageSends) {
  // pp 2 1F1B: stage 0 sends its forwards' outputs, stage 1 its backwards' input gradients.
  EXPECT_EQ(PipelineSendBuffers(PipelineOps(PpSchedule::k1F1B, 2, 0, 4, 1), 2, 1, 0), 2);
  EXPECT_EQ(PipelineSendBuffers(PipelineOps(PpSchedule::k1F1B, 2, 1, 4, 1), 2, 1, 1), 2);
  // One micro-batch: one message each way.
  EXPECT_EQ(PipelineSendBuffers(PipelineOps(PpSchedule::k1F1B, 2, 0, 1, 1), 2, 1, 0), 1);
  EXPECT_EQ(PipelineSendBuffers(PipelineOps(PpSchedule::k1F1B, 2, 1, 1, 1), 2, 1, 1), 1);
}

// Every rank of `spec` as a thread over the fake backend under one executor.
std::vector<StatusOr<PipeStepRecord>> RunExecutor(const JobSpec& spec, bool lockstep) {
  const ParallelDims dims = MeshOf(spec).value();
  const int world = dims.world_size();
  auto backend = std::make_shared<FakeBackend>();
  std::shared_ptr<Store> store = std::make_shared<InMemoryStore>();
  std::vector<StatusOr<PipeStepRecord>> results(world, InternalError("the rank did not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = [&]() -> StatusOr<PipeStepRecord> {
        RankContext ctx;
        ctx.rank = rank;
        MeshCommsOptions comm_options;
        comm_options.timeout = std::chrono::seconds(60);
        MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<MeshComms> comms,
                                 MeshComms::Create(dims, rank, store, *backend,
                                                   std::make_shared<CommStats>(), comm_options));
        ctx.comms = std::move(comms);
        ctx.store = store;
        TrainOptions options;
        options.peak_flops = 1e12;
        options.pipeline_lockstep = lockstep;
        MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                                 Trainer::Create(spec, options, ctx));
        PipeStepRecord record;
        PipeRecordSteps observer(&record);
        MESHRUN_RETURN_IF_ERROR(trainer->Run(&observer).status());
        return record;
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

class PipelineAsyncExecutorTest : public PipelineMeshRunner {};

TEST_F(PipelineAsyncExecutorTest, TrainsLikeTheLockstepTimetableBitForBit) {
  struct Case {
    const char* schedule;
    int P, S, v, layers;
  };
  for (const Case& c : {Case{"1f1b", 2, 1, 1, 4}, Case{"interleaved_1f1b", 2, 1, 2, 4},
                        Case{"zero_bubble", 2, 1, 1, 4}, Case{"1f1b", 4, 1, 1, 4},
                        Case{"interleaved_1f1b", 2, 2, 2, 4}}) {
    SCOPED_TRACE(std::string(c.schedule) + " pp " + std::to_string(c.P) + " dp_shard " +
                 std::to_string(c.S));
    JobSpec spec = Spec("llama", c.layers, PipeMesh{c.P, c.S, 1, 1, 1});
    spec.parallelism.pp_schedule = c.schedule;
    spec.parallelism.pp_virtual_stages = c.v;
    spec.train.steps = 6;
    spec.data.eval_every = 3;
    const std::vector<StatusOr<PipeStepRecord>> async = RunExecutor(spec, false);
    const std::vector<StatusOr<PipeStepRecord>> lockstep = RunExecutor(spec, true);
    ASSERT_EQ(async.size(), lockstep.size());
    for (size_t r = 0; r < async.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_TRUE(async[r].ok()) << async[r].status().ToString();
      ASSERT_TRUE(lockstep[r].ok()) << lockstep[r].status().ToString();
      EXPECT_EQ(async[r]->losses.size(), 6u);
      EXPECT_EQ(async[r]->losses, lockstep[r]->losses);
      EXPECT_EQ(async[r]->grad_norms, lockstep[r]->grad_norms);
      EXPECT_EQ(async[r]->evals, lockstep[r]->evals);
    }
  }
}

}  // namespace
}  // namespace meshrun
