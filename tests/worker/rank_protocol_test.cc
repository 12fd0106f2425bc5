// The worker <-> rank protocol as pure functions: command line and environment of a rank, step
// lines to MetricsSample, checkpoint lines, line splitting; and the reconnect backoff.
#include "worker/rank_protocol.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "worker/backoff.h"

namespace meshrun {
namespace {

v1::RankAssignment Assignment() {
  v1::RankAssignment a;
  a.set_job_id("job-7");
  a.set_attempt(2);
  a.set_rank(3);
  a.set_world_size(4);
  a.set_local_rank(1);
  a.set_local_world_size(2);
  a.mutable_store()->set_address("127.0.0.1:5000");
  return a;
}

std::string EnvOf(const std::vector<std::pair<std::string, std::string>>& env,
                  const std::string& name) {
  for (const auto& [k, v] : env) {
    if (k == name) return v;
  }
  return "<unset>";
}

TEST(RankProtocol, CommandLineAndEnvironment) {
  RankLaunchConfig config{"/opt/meshrun/bin/meshrun", "/w/job-7/2/spec.yaml", "/w/job-7/2",
                          "10.0.0.5", 8};
  const RankCommand cmd = BuildRankCommand(Assignment(), config);
  EXPECT_EQ(cmd.argv,
            (std::vector<std::string>{"/opt/meshrun/bin/meshrun", "train", "-f",
                                      "/w/job-7/2/spec.yaml", "--nproc", "4", "-o", "json"}));
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_RANK"), "3");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_WORLD_SIZE"), "4");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_STORE_ADDRESS"), "127.0.0.1:5000");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_JOB_ID"), "job-7");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_ATTEMPT"), "2");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_HOST"), "10.0.0.5");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_REPORT_ALL_RANKS"), "1");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_LOCAL_RANK"), "1");
  EXPECT_EQ(EnvOf(cmd.env, "OMP_NUM_THREADS"), "4");  // 8 cores / 2 ranks on this worker
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_RESUME_CHECKPOINT"), "<unset>");
}

TEST(RankProtocol, ThreadsNeverBelowOne) {
  v1::RankAssignment a = Assignment();
  a.set_local_world_size(4);
  a.set_resume_checkpoint("/ck/step-00000010");
  const RankCommand cmd = BuildRankCommand(a, RankLaunchConfig{"m", "s", "d", "h", 2});
  EXPECT_EQ(EnvOf(cmd.env, "OMP_NUM_THREADS"), "1");
  EXPECT_EQ(EnvOf(cmd.env, "MESHRUN_RESUME_CHECKPOINT"), "/ck/step-00000010");
}

TEST(RankProtocol, MergeEnvironmentDropsInheritedMeshrunVariables) {
  const std::vector<std::string> env = MergeEnvironment(
      {"PATH=/bin", "MESHRUN_STORE_DIR=/tmp/x", "MESHRUN_RANK=9", "OMP_NUM_THREADS=16", "HOME=/h"},
      {{"MESHRUN_RANK", "1"}, {"OMP_NUM_THREADS", "2"}});
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "HOME=/h", "MESHRUN_RANK=1",
                                           "OMP_NUM_THREADS=2"}));
}

TEST(RankProtocol, RanksGetOnlyTheAllowListAndWhatTheOperatorPasses) {
  const std::vector<std::string> worker = {"PATH=/bin",
                                           "AWS_SECRET_ACCESS_KEY=hunter2",
                                           "LC_ALL=C",
                                           "NCCL_SOCKET_IFNAME=eth0",
                                           "HTTPS_PROXY=http://u:p@proxy",
                                           "CUDA_VISIBLE_DEVICES=0,1",
                                           "MY_DATASET_TOKEN=abc",
                                           "MESHRUN_TOKEN=client-secret"};
  EXPECT_EQ(MergeEnvironment(worker, {{"MESHRUN_RANK", "0"}}),
            (std::vector<std::string>{"PATH=/bin", "LC_ALL=C", "NCCL_SOCKET_IFNAME=eth0",
                                      "CUDA_VISIBLE_DEVICES=0,1", "MESHRUN_RANK=0"}));
  // --rank-env MY_DATASET_TOKEN passes that one; MESHRUN_* never come from the worker.
  EXPECT_EQ(MergeEnvironment(worker, {}, {"MY_DATASET_TOKEN", "MESHRUN_TOKEN"}),
            (std::vector<std::string>{"PATH=/bin", "LC_ALL=C", "NCCL_SOCKET_IFNAME=eth0",
                                      "CUDA_VISIBLE_DEVICES=0,1", "MY_DATASET_TOKEN=abc"}));
  EXPECT_FALSE(IsInheritedByRanks("AWS_SECRET_ACCESS_KEY"));
  EXPECT_FALSE(IsInheritedByRanks("PATHX"));
  EXPECT_TRUE(IsInheritedByRanks("LD_LIBRARY_PATH"));
}

TEST(RankProtocol, SafeJobIds) {
  EXPECT_TRUE(IsSafeJobId("job-1"));
  EXPECT_TRUE(IsSafeJobId("j_20260101.3"));
  EXPECT_FALSE(IsSafeJobId(""));
  EXPECT_FALSE(IsSafeJobId("."));
  EXPECT_FALSE(IsSafeJobId(".."));
  EXPECT_FALSE(IsSafeJobId("a/b"));
  EXPECT_FALSE(IsSafeJobId("a b"));
  EXPECT_FALSE(IsSafeJobId(std::string(129, 'x')));
}

TEST(RankProtocol, StepLineBecomesMetricsSample) {
  const std::string line =
      R"({"event":"step","step":12,"loss":2.5,"lr":0.001,"grad_norm":0.75,"step_seconds":0.2,)"
      R"("tokens_per_second":5120.0,"tflops":0.01,"mfu":0.05,"peak_memory_bytes":1048576})";
  std::optional<v1::MetricsSample> s = ParseStepLine(line, "job-7", 2, 3);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->job_id(), "job-7");
  EXPECT_EQ(s->attempt(), 2);
  ASSERT_TRUE(s->has_rank());
  EXPECT_EQ(s->rank(), 3);
  EXPECT_EQ(s->step(), 12);
  EXPECT_DOUBLE_EQ(s->loss(), 2.5);
  EXPECT_DOUBLE_EQ(s->lr(), 0.001);
  EXPECT_DOUBLE_EQ(s->grad_norm(), 0.75);
  EXPECT_DOUBLE_EQ(s->step_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(s->tokens_per_second(), 5120.0);
  EXPECT_DOUBLE_EQ(s->tflops(), 0.01);
  EXPECT_DOUBLE_EQ(s->mfu(), 0.05);
  EXPECT_EQ(s->memory_peak_bytes(), 1048576u);
  EXPECT_FALSE(s->has_val_loss());
  EXPECT_GT(s->time().seconds(), 0);
}

TEST(RankProtocol, StepLineCommAndMemory) {
  // Known (axis, op) names map to the proto enums; flattened groups ("dp_cp"), the trainer's
  // "metrics" label, unknown ops and malformed entries are skipped without failing the line.
  const std::string line =
      R"({"event":"step","step":3,"allocated_memory_bytes":4096,"reserved_memory_bytes":8192,)"
      R"("comm":[{"axis":"tp","op":"all_reduce","seconds":0.5,"bytes":1.5e6,"calls":12},)"
      R"({"axis":"cp","op":"send_recv","seconds":0.25,"bytes":1000,"calls":4},)"
      R"({"axis":"dp_shard","op":"reduce_scatter","seconds":0.1,"bytes":77.5,"calls":2},)"
      R"({"axis":"dp_cp","op":"all_gather","seconds":1,"bytes":8,"calls":1},)"
      R"({"axis":"metrics","op":"all_gather","seconds":1,"bytes":8,"calls":1},)"
      R"({"axis":"tp","op":"teleport","seconds":1,"bytes":8,"calls":1},)"
      R"({"axis":"TP","op":"all_reduce"},{"axis":"unspecified","op":"all_reduce"},)"
      R"({"axis":3,"op":"all_reduce"},"junk",{"op":"all_reduce"},)"
      R"({"axis":"dp_replicate","op":"all_reduce","seconds":-1,"bytes":"x","calls":5}]})";
  std::optional<v1::MetricsSample> s = ParseStepLine(line, "j", 1, 0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->memory_allocated_bytes(), 4096u);
  EXPECT_EQ(s->memory_reserved_bytes(), 8192u);
  ASSERT_EQ(s->comm_size(), 4);
  EXPECT_EQ(s->comm(0).axis(), v1::MESH_AXIS_TP);
  EXPECT_EQ(s->comm(0).op(), v1::COMM_OP_ALL_REDUCE);
  EXPECT_DOUBLE_EQ(s->comm(0).seconds(), 0.5);
  EXPECT_EQ(s->comm(0).bytes(), 1500000u);
  EXPECT_EQ(s->comm(0).calls(), 12u);
  EXPECT_EQ(s->comm(1).axis(), v1::MESH_AXIS_CP);
  EXPECT_EQ(s->comm(1).op(), v1::COMM_OP_SEND_RECV);
  EXPECT_EQ(s->comm(2).axis(), v1::MESH_AXIS_DP_SHARD);
  EXPECT_EQ(s->comm(2).op(), v1::COMM_OP_REDUCE_SCATTER);
  EXPECT_EQ(s->comm(2).bytes(), 77u);
  EXPECT_EQ(s->comm(3).axis(), v1::MESH_AXIS_DP_REPLICATE);
  EXPECT_DOUBLE_EQ(s->comm(3).seconds(), 0);  // negative clamps to 0
  EXPECT_EQ(s->comm(3).bytes(), 0u);          // not a number
  EXPECT_EQ(s->comm(3).calls(), 5u);

  // "comm" that is not an array is ignored.
  s = ParseStepLine(R"({"event":"step","step":3,"comm":{"tp":1}})", "j", 1, 0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->comm_size(), 0);
}

TEST(RankProtocol, OtherLinesAreNotSteps) {
  for (const std::string& line :
       {std::string(R"({"event":"summary","steps":20,"final_loss":2.0})"),
        std::string(R"({"event":"eval","step":10,"loss":2.2,"tokens":100})"),
        std::string(R"({"event":"step","step":"ten","loss":2})"),
        std::string(R"({"event":"step","loss":2})"), std::string(R"({"event":"step","step":)"),
        std::string("step 1/20 loss 2.0"), std::string(""), std::string("[1,2]")}) {
    EXPECT_FALSE(ParseStepLine(line, "j", 1, 0).has_value()) << line;
  }
}

TEST(RankProtocol, CheckpointLine) {
  std::optional<v1::CheckpointSaved> c =
      ParseCheckpointLine("checkpoint /tmp/ck/step-00000020", "job-7", 2);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step(), 20);
  EXPECT_EQ(c->path(), "/tmp/ck/step-00000020");
  EXPECT_EQ(c->job_id(), "job-7");
  EXPECT_EQ(c->attempt(), 2);
  EXPECT_FALSE(ParseCheckpointLine("checkpoint /tmp/ck/latest", "j", 1).has_value());
  EXPECT_FALSE(ParseCheckpointLine("checkpoint /tmp/ck/step-12x", "j", 1).has_value());
  EXPECT_FALSE(ParseCheckpointLine("resumed from /tmp/ck/step-00000020", "j", 1).has_value());
}

TEST(RankProtocol, LineSplitterJoinsPiecesAndCutsLongLines) {
  std::vector<std::string> lines;
  auto add = [&](std::string l) { lines.push_back(std::move(l)); };
  LineSplitter splitter(8);
  splitter.Feed("ab", add);
  splitter.Feed("c\r\nde", add);
  splitter.Feed("f\n\n0123456789", add);
  splitter.Flush(add);
  EXPECT_EQ(lines, (std::vector<std::string>{"abc", "def", "", "01234567", "89"}));
}

TEST(Backoff, GrowsToTheCapAndResets) {
  Backoff b(std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 2.0, /*jitter=*/0);
  std::vector<int64_t> delays;
  for (int i = 0; i < 6; ++i) delays.push_back(b.Next().count());
  EXPECT_EQ(delays, (std::vector<int64_t>{100, 200, 400, 800, 1000, 1000}));
  EXPECT_EQ(b.attempts(), 6);
  b.Reset();
  EXPECT_EQ(b.Next().count(), 100);
}

TEST(Backoff, JitterStaysInItsBandAndUnderTheCap) {
  Backoff b(std::chrono::milliseconds(1000), std::chrono::milliseconds(4000), 2.0, 0.25, 42);
  int64_t base = 1000;
  for (int i = 0; i < 20; ++i) {
    const int64_t d = b.Next().count();
    EXPECT_GE(d, static_cast<int64_t>(base * 0.75) - 1);
    EXPECT_LE(d, std::min<int64_t>(4000, static_cast<int64_t>(base * 1.25) + 1));
    base = std::min<int64_t>(4000, base * 2);
  }
}

}  // namespace
}  // namespace meshrun
