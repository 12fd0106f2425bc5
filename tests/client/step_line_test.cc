// The rank's step report end to end without processes: StepMetrics -> RankStep (what the rank
// reports) -> StepLineJson (what `meshrun train -o json` prints) and -> SampleOfStep (what the
// worker forwards) keeps every number, memory kind and (axis, op) comm counter (docs/cli.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/train/trainer.h"
#include "rank/rank_reports.h"
#include "worker/rank_protocol.h"

namespace meshrun {
namespace {

StepMetrics Sample() {
  StepMetrics m;
  m.step = 7;
  m.loss = 3.25;
  m.lr = 2.5e-4;
  m.grad_norm = 0.5;
  m.step_seconds = 0.125;
  m.tokens_per_second = 4096;
  m.tflops = 0.002;
  m.mfu = 0.0375;
  m.allocated_memory_bytes = 1 << 20;
  m.peak_memory_bytes = 3 << 20;
  m.reserved_memory_bytes = 4 << 20;
  auto on = [](MeshAxis axis) { return CommCharge::Axis(axis); };
  m.comm[{on(MeshAxis::kTp), CommOp::kAllReduce}] = {0.75, 6.0e6, 48};
  m.comm[{on(MeshAxis::kDpShard), CommOp::kAllGather}] = {0.5, 1.5e6, 16};
  m.comm[{on(MeshAxis::kDpShard), CommOp::kReduceScatter}] = {0.25, 1.5e6, 8};
  m.comm[{on(MeshAxis::kCp), CommOp::kSendRecv}] = {0.125, 2048, 4};
  m.comm[{on(MeshAxis::kDpReplicate), CommOp::kAllReduce}] = {0.0625, 1024, 2};
  // No metric series for these: dropped by the worker, shown in the step line.
  m.comm[{CommCharge::Metrics(), CommOp::kAllGather}] = {0.001, 24, 7};
  m.comm[{CommCharge::Control(), CommOp::kAllGather}] = {0.002, 8, 3};
  m.comm[{on(MeshAxis::kDpCp), CommOp::kBroadcast}] = {0.003, 16, 1};
  return m;
}

TEST(StepLine, JsonCarriesConventionFields) {
  const nlohmann::json line = nlohmann::json::parse(rank::StepLineJson(rank::StepReport(Sample())));
  for (const char* key :
       {"event", "step", "loss", "lr", "step_seconds", "tokens_per_second", "tflops", "mfu",
        "allocated_memory_bytes", "peak_memory_bytes", "reserved_memory_bytes", "comm"}) {
    EXPECT_TRUE(line.contains(key)) << key;
  }
  EXPECT_EQ(line["event"], "step");
  ASSERT_TRUE(line["comm"].is_array());
  ASSERT_EQ(line["comm"].size(), 8u);  // every series the rank recorded, by its one label
  std::map<std::pair<std::string, std::string>, int> calls;
  for (const nlohmann::json& c : line["comm"]) calls[{c["axis"], c["op"]}] = c["calls"];
  const std::map<std::pair<std::string, std::string>, int> want = {
      {{"tp", "all_reduce"}, 48},          {{"dp_shard", "all_gather"}, 16},
      {{"dp_shard", "reduce_scatter"}, 8}, {{"cp", "send_recv"}, 4},
      {{"dp_replicate", "all_reduce"}, 2}, {{"metrics", "all_gather"}, 7},
      {{"control", "all_gather"}, 3},      {{"dp_cp", "broadcast"}, 1}};
  EXPECT_EQ(calls, want);
}

TEST(StepLine, RoundTripThroughSampleOfStep) {
  const StepMetrics m = Sample();
  std::optional<v1::MetricsSample> s = SampleOfStep(rank::StepReport(m), "job-1", 3, 5);
  EXPECT_EQ(s->job_id(), "job-1");
  EXPECT_EQ(s->attempt(), 3);
  EXPECT_EQ(s->rank(), 5);
  EXPECT_EQ(s->step(), m.step);
  EXPECT_DOUBLE_EQ(s->loss(), m.loss);
  EXPECT_DOUBLE_EQ(s->lr(), m.lr);
  EXPECT_DOUBLE_EQ(s->grad_norm(), m.grad_norm);
  EXPECT_DOUBLE_EQ(s->step_seconds(), m.step_seconds);
  EXPECT_DOUBLE_EQ(s->tokens_per_second(), m.tokens_per_second);
  EXPECT_DOUBLE_EQ(s->tflops(), m.tflops);
  EXPECT_DOUBLE_EQ(s->mfu(), m.mfu);
  EXPECT_EQ(s->memory_allocated_bytes(), static_cast<uint64_t>(m.allocated_memory_bytes));
  EXPECT_EQ(s->memory_peak_bytes(), static_cast<uint64_t>(m.peak_memory_bytes));
  EXPECT_EQ(s->memory_reserved_bytes(), static_cast<uint64_t>(m.reserved_memory_bytes));

  // The same (axis, op) entries, less those without a metric series.
  std::map<std::pair<int, int>, CommCounter> want = {
      {{v1::MESH_AXIS_TP, v1::COMM_OP_ALL_REDUCE}, {0.75, 6.0e6, 48}},
      {{v1::MESH_AXIS_DP_SHARD, v1::COMM_OP_ALL_GATHER}, {0.5, 1.5e6, 16}},
      {{v1::MESH_AXIS_DP_SHARD, v1::COMM_OP_REDUCE_SCATTER}, {0.25, 1.5e6, 8}},
      {{v1::MESH_AXIS_CP, v1::COMM_OP_SEND_RECV}, {0.125, 2048, 4}},
      {{v1::MESH_AXIS_DP_REPLICATE, v1::COMM_OP_ALL_REDUCE}, {0.0625, 1024, 2}}};
  ASSERT_EQ(s->comm_size(), static_cast<int>(want.size()));
  for (const v1::CommStats& c : s->comm()) {
    auto it = want.find({c.axis(), c.op()});
    ASSERT_NE(it, want.end()) << c.ShortDebugString();
    EXPECT_DOUBLE_EQ(c.seconds(), it->second.seconds) << c.ShortDebugString();
    EXPECT_EQ(c.bytes(), static_cast<uint64_t>(it->second.bytes)) << c.ShortDebugString();
    EXPECT_EQ(c.calls(), it->second.calls) << c.ShortDebugString();
    want.erase(it);
  }
  EXPECT_TRUE(want.empty());
}

TEST(StepLine, NoCommunicationIsAnEmptyArray) {
  StepMetrics m;
  m.step = 1;
  const nlohmann::json line = nlohmann::json::parse(rank::StepLineJson(rank::StepReport(m)));
  EXPECT_TRUE(line["comm"].is_array());
  EXPECT_TRUE(line["comm"].empty());
  EXPECT_EQ(SampleOfStep(rank::StepReport(m), "j", 1, 0).comm_size(), 0);
}

}  // namespace
}  // namespace meshrun
