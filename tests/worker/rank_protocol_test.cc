// The worker <-> rank protocol as pure functions: command line, environment and RankStart of a
// rank, step reports to MetricsSample, frame and line splitting; and the reconnect backoff.
#include "worker/rank_protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "rpc/backoff.h"
#include "supervisor/openmp_environment.h"

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

v1::RankStart StartOf(const RankCommand& cmd) {
  v1::RankStart start;
  int frames = 0;
  FrameSplitter splitter;
  splitter.Feed(cmd.input, [&](std::string frame) {
    ++frames;
    EXPECT_TRUE(start.ParseFromString(frame));
  });
  EXPECT_EQ(frames, 1);
  return start;
}

TEST(RankProtocol, CommandLineAndRankStart) {
  RankLaunchConfig config;
  config.meshrun_binary = "/opt/meshrun/bin/meshrun";
  config.working_dir = "/w/job-7/2";
  config.host = "10.0.0.5";
  config.cores = 8;
  config.tls.ca = "/etc/meshrun/ca.pem";
  config.data_roots = {"/data"};
  config.threads = 3;
  const RankCommand cmd = BuildRankCommand(Assignment(), config);
  EXPECT_EQ(cmd.argv, (std::vector<std::string>{"/opt/meshrun/bin/meshrun", "__rank"}));
  // Only what OpenMP itself reads travels in the environment: the threads, and the wait policy
  // (passive unless the worker's environment chose one: decision 0025).
  ASSERT_EQ(cmd.env.size(), 2u);
  EXPECT_EQ(EnvOf(cmd.env, "OMP_NUM_THREADS"), "4");  // 8 cores / 2 ranks on this worker
  if (OpenMpWaitUnset()) {
    EXPECT_EQ(EnvOf(cmd.env, "OMP_WAIT_POLICY"), "passive");
  }
  const v1::RankStart start = StartOf(cmd);
  EXPECT_EQ(start.assignment().rank(), 3);
  EXPECT_EQ(start.assignment().world_size(), 4);
  EXPECT_EQ(start.assignment().job_id(), "job-7");
  EXPECT_EQ(start.assignment().attempt(), 2);
  EXPECT_EQ(start.assignment().store().address(), "127.0.0.1:5000");
  // The spec exactly as assigned; this worker's facts beside it (decision 0048).
  EXPECT_EQ(start.assignment().spec().SerializeAsString(), Assignment().spec().SerializeAsString());
  EXPECT_EQ(start.threads(), 3);
  EXPECT_EQ(start.host(), "10.0.0.5");
  EXPECT_EQ(start.tls().ca(), "/etc/meshrun/ca.pem");
  ASSERT_TRUE(start.has_file_roots());
  EXPECT_EQ(start.file_roots().data_size(), 1);
  EXPECT_EQ(start.file_roots().checkpoint_size(), 0);
}

TEST(RankProtocol, RanksWaitPassivelyUnlessTheWorkerWasToldOtherwise) {
  RankLaunchConfig config;
  config.cores = 2;
  const char* saved_policy = std::getenv("OMP_WAIT_POLICY");
  const char* saved_spin = std::getenv("GOMP_SPINCOUNT");
  const std::string policy = saved_policy ? saved_policy : "", spin = saved_spin ? saved_spin : "";
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  RankCommand cmd = BuildRankCommand(Assignment(), config);
  EXPECT_EQ(EnvOf(cmd.env, "OMP_WAIT_POLICY"), "passive");
  EXPECT_EQ(EnvOf(cmd.env, "GOMP_SPINCOUNT"), "<unset>");
  setenv("GOMP_SPINCOUNT", "10000", 1);
  cmd = BuildRankCommand(Assignment(), config);
  EXPECT_EQ(EnvOf(cmd.env, "GOMP_SPINCOUNT"), "10000");
  EXPECT_EQ(EnvOf(cmd.env, "OMP_WAIT_POLICY"), "<unset>");
  // The worker's own copies are not inherited a second time.
  EXPECT_EQ(MergeEnvironment({"GOMP_SPINCOUNT=5", "OMP_WAIT_POLICY=active", "PATH=/bin"}, cmd.env,
                             {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}),
            (std::vector<std::string>{"PATH=/bin", "OMP_NUM_THREADS=1", "GOMP_SPINCOUNT=10000"}));
  if (saved_policy) setenv("OMP_WAIT_POLICY", policy.c_str(), 1);
  if (saved_spin) {
    setenv("GOMP_SPINCOUNT", spin.c_str(), 1);
  } else {
    unsetenv("GOMP_SPINCOUNT");
  }
}

TEST(RankProtocol, ThreadsNeverBelowOne) {
  v1::RankAssignment a = Assignment();
  a.set_local_world_size(4);
  RankLaunchConfig config;
  config.meshrun_binary = "m";
  config.cores = 2;
  const RankCommand cmd = BuildRankCommand(a, config);
  EXPECT_EQ(EnvOf(cmd.env, "OMP_NUM_THREADS"), "1");
  const v1::RankStart start = StartOf(cmd);
  EXPECT_FALSE(start.has_file_roots());  // unconfined
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

TEST(RankProtocol, StepReportBecomesMetricsSample) {
  v1::RankStep step;
  step.set_step(12);
  step.set_loss(3.5);
  step.set_lr(1e-4);
  step.set_grad_norm(0.75);
  step.set_step_seconds(0.25);
  step.set_tokens_per_second(2048);
  step.set_tflops(0.5);
  step.set_mfu(0.25);
  step.set_allocated_memory_bytes(100);
  step.set_peak_memory_bytes(200);
  step.set_reserved_memory_bytes(-5);  // clamped to 0
  auto comm = [&](v1::CommKind kind, v1::MeshAxis axis, v1::CommOp op, double seconds, double bytes,
                  int calls) {
    v1::RankCommCounter* c = step.add_comm();
    c->set_kind(kind);
    c->set_axis(axis);
    c->set_op(op);
    c->set_seconds(seconds);
    c->set_bytes(bytes);
    c->set_calls(calls);
  };
  const v1::CommKind on_axis = v1::COMM_KIND_AXIS;
  comm(on_axis, v1::MESH_AXIS_TP, v1::COMM_OP_ALL_REDUCE, 0.5, 4096, 8);
  comm(on_axis, v1::MESH_AXIS_DP_SHARD, v1::COMM_OP_REDUCE_SCATTER, 0.25, 1024.5, 2);
  // Left out: a flattened group, the trainer's own kinds, values the proto lacks.
  comm(on_axis, v1::MESH_AXIS_DP_CP, v1::COMM_OP_ALL_REDUCE, 0.1, 8, 1);
  comm(v1::COMM_KIND_METRICS, v1::MESH_AXIS_UNSPECIFIED, v1::COMM_OP_ALL_GATHER, 0.1, 8, 1);
  comm(v1::COMM_KIND_CONTROL, v1::MESH_AXIS_UNSPECIFIED, v1::COMM_OP_ALL_GATHER, 0.1, 8, 1);
  comm(on_axis, v1::MESH_AXIS_TP, v1::COMM_OP_UNSPECIFIED, 0.1, 8, 1);
  comm(on_axis, static_cast<v1::MeshAxis>(99), v1::COMM_OP_ALL_REDUCE, 0.1, 8, 1);
  comm(v1::COMM_KIND_UNSPECIFIED, v1::MESH_AXIS_TP, v1::COMM_OP_ALL_REDUCE, 0.1, 8, 1);
  const v1::MetricsSample s = SampleOfStep(step, "job-7", 2, 3);
  EXPECT_EQ(s.job_id(), "job-7");
  EXPECT_EQ(s.attempt(), 2);
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.step(), 12);
  EXPECT_GT(s.time().seconds(), 0);
  EXPECT_DOUBLE_EQ(s.loss(), 3.5);
  EXPECT_DOUBLE_EQ(s.lr(), 1e-4);
  EXPECT_DOUBLE_EQ(s.grad_norm(), 0.75);
  EXPECT_DOUBLE_EQ(s.step_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(s.tokens_per_second(), 2048);
  EXPECT_DOUBLE_EQ(s.tflops(), 0.5);
  EXPECT_DOUBLE_EQ(s.mfu(), 0.25);
  EXPECT_EQ(s.memory_allocated_bytes(), 100u);
  EXPECT_EQ(s.memory_peak_bytes(), 200u);
  EXPECT_EQ(s.memory_reserved_bytes(), 0u);
  ASSERT_EQ(s.comm_size(), 2);
  EXPECT_EQ(s.comm(0).axis(), v1::MESH_AXIS_TP);
  EXPECT_EQ(s.comm(0).op(), v1::COMM_OP_ALL_REDUCE);
  EXPECT_EQ(s.comm(0).bytes(), 4096u);
  EXPECT_EQ(s.comm(0).calls(), 8u);
  EXPECT_EQ(s.comm(1).axis(), v1::MESH_AXIS_DP_SHARD);
  EXPECT_EQ(s.comm(1).op(), v1::COMM_OP_REDUCE_SCATTER);
  EXPECT_EQ(s.comm(1).bytes(), 1024u);
}

TEST(RankProtocol, FramesSplitAcrossReadsAndRejectOversizedOnes) {
  const std::string stream = Frame("abc") + Frame("") + Frame(std::string(70000, 'x'));
  std::vector<std::string> got;
  FrameSplitter splitter;
  for (size_t i = 0; i < stream.size(); i += 7) {
    splitter.Feed(std::string_view(stream).substr(i, 7), [&](std::string f) { got.push_back(f); });
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "abc");
  EXPECT_EQ(got[1], "");
  EXPECT_EQ(got[2].size(), 70000u);
  EXPECT_EQ(splitter.pending(), 0u);
  FrameSplitter small(16);
  small.Feed(Frame(std::string(17, 'y')), [&](std::string) { ADD_FAILURE(); });
  EXPECT_TRUE(small.broken());
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
