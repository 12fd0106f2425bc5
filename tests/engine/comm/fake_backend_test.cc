// The Communicator contract on the in-process fake backend: every op against a serial reference
// for n = 1…4, the bus bytes of docs/parallelism.md, axis relabelling, and bounded failures
// (injected hangs and failures, mismatched calls, Send-Send deadlocks, bad arguments).
#include "engine/comm/fake_backend.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "tests/engine/comm/collective_checks.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;

using testing::RunRanks;

class FakeCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(FakeCollectivesTest, EveryOpMatchesTheSerialReference) {
  const int n = GetParam();
  auto world = FakeWorld::Create(n, "test/tp/0");
  auto comms = world->ConnectAll(MeshAxis::kTp, nullptr);
  std::vector<std::string> errors(n);
  RunRanks(n, [&](int r) { errors[r] = testing::CheckCollectives(*comms[r]); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) EXPECT_TRUE(comms[r]->health().ok());
}

INSTANTIATE_TEST_SUITE_P(Sizes, FakeCollectivesTest, ::testing::Values(1, 2, 3, 4));

TEST(BusBytesTest, Formulas) {
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kAllReduce, 4000, 4), 6000);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kAllGather, 1600, 4), 1200);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kReduceScatter, 1600, 4), 1200);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kBroadcast, 4000, 4), 3000);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kSend, 40, 4), 40);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kSendRecv, 40, 2), 40);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kRecv, 40, 2), 0);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kBarrier, 0, 8), 0);
  EXPECT_DOUBLE_EQ(BusBytes(CommOp::kAllGather, 12, 8), 10.5);
  for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kSend}) {
    EXPECT_EQ(BusBytes(op, 1 << 20, 1), 0) << CommOpName(op);
  }
}

TEST(FakeStatsTest, CountedBytesEqualTheFormulas) {
  constexpr int n = 4;
  auto world = FakeWorld::Create(n);
  std::vector<std::shared_ptr<CommStats>> stats;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    stats.push_back(std::make_shared<CommStats>());
    comms.push_back(
        std::move(world->Connect({MeshAxis::kDpShardCp, "", r, n, milliseconds(5000), stats[r]}))
            .value());
  }
  RunRanks(n, [&](int r) {
    Communicator& c = *comms[r];
    std::vector<float> a(1000, 1.f), out(400), in(100, 1.f);
    ASSERT_TRUE(c.AllReduce(a.data(), 1000).ok());              // S = 4000
    ASSERT_TRUE(c.AllGather(in.data(), out.data(), 100).ok());  // S = 1600 (output)
    ASSERT_TRUE(
        c.AllGather(in.data(), out.data(), 100, CallOptions::Axis(MeshAxis::kDpShard)).ok());
    ASSERT_TRUE(c.ReduceScatter(out.data(), in.data(), 100).ok());  // S = 1600 (input)
    ASSERT_TRUE(c.Broadcast(a.data(), 1000, 2).ok());               // S = 4000
    ASSERT_TRUE(c.SendRecv(in.data(), 10, (r + 1) % n, out.data(), 10, (r + n - 1) % n).ok());
    if (r == 0) {
      ASSERT_TRUE(c.Send(in.data(), 25, 1, CallOptions::Axis(MeshAxis::kCp)).ok());
    } else if (r == 1) {
      ASSERT_TRUE(c.Recv(out.data(), 25, 0, CallOptions::Axis(MeshAxis::kCp)).ok());
    }
    ASSERT_TRUE(c.Barrier().ok());
  });
  for (int r = 0; r < n; ++r) {
    const CommStats& s = *stats[r];
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kAllReduce).bytes, 6000);
    EXPECT_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kAllReduce).calls, 1u);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kAllGather).bytes, 1200);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShard, CommOp::kAllGather).bytes, 1200)
        << "charged to the label";
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kReduceScatter).bytes, 1200);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kBroadcast).bytes, 3000);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kSendRecv).bytes, 40);
    EXPECT_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kBarrier).calls, 1u);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kDpShardCp, CommOp::kBarrier).bytes, 0);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kCp, CommOp::kSend).bytes, r == 0 ? 100 : 0);
    EXPECT_EQ(s.Get(MeshAxis::kCp, CommOp::kRecv).calls, r == 1 ? 1u : 0u);
    EXPECT_DOUBLE_EQ(s.Get(MeshAxis::kCp, CommOp::kRecv).bytes, 0);
    EXPECT_DOUBLE_EQ(s.AxisTotal(MeshAxis::kDpShardCp).bytes, 6000 + 1200 + 1200 + 3000 + 40);
    EXPECT_GT(s.AxisTotal(MeshAxis::kDpShardCp).seconds, 0);
  }
}

// The trainer's own reductions are charged to their kind, one series whichever group carried
// them, and stay out of every axis's total (docs/decisions/0028).
TEST(FakeStatsTest, MetricsAndControlTrafficIsItsOwnSeries) {
  EXPECT_STREQ(CommChargeLabel(CommCharge::Axis(MeshAxis::kDpShard)), "dp_shard");
  EXPECT_STREQ(CommChargeLabel(CommCharge::Axis(MeshAxis::kDpCp)), "dp_cp");
  EXPECT_STREQ(CommChargeLabel(CommCharge::Metrics()), "metrics");
  EXPECT_STREQ(CommChargeLabel(CommCharge::Control()), "control");
  const int n = 2;
  auto stats = std::make_shared<CommStats>();
  auto tp = FakeWorld::Create(n, "comm/tp/0")->ConnectAll(MeshAxis::kTp, stats);
  auto dp_cp = FakeWorld::Create(n, "comm/dp_cp/0")->ConnectAll(MeshAxis::kDpCp, stats);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      double mine = r, all[2];
      const CallOptions metrics = CallOptions::Charged(CommCharge::Metrics());
      ASSERT_TRUE(tp[r]->AllGatherBytes(&mine, all, sizeof(double), metrics).ok());
      ASSERT_TRUE(dp_cp[r]->AllGatherBytes(&mine, all, sizeof(double), metrics).ok());
      ASSERT_TRUE(dp_cp[r]
                      ->AllGatherBytes(&mine, all, sizeof(double),
                                       CallOptions::Charged(CommCharge::Control()))
                      .ok());
      std::vector<float> x(4, 1.0f);
      ASSERT_TRUE(tp[r]->AllReduce(x.data(), x.size()).ok());  // the communicator's own axis
    });
  }
  for (auto& t : threads) t.join();
  const std::map<CommStats::Key, CommCounter> snap = stats->Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(stats->Get(CommCharge::Metrics(), CommOp::kAllGather).calls, 2u * n);
  EXPECT_DOUBLE_EQ(stats->Get(CommCharge::Metrics(), CommOp::kAllGather).bytes, 2 * n * 8.0);
  EXPECT_EQ(stats->Get(CommCharge::Control(), CommOp::kAllGather).calls, 1u * n);
  EXPECT_EQ(stats->Get(MeshAxis::kTp, CommOp::kAllReduce).calls, 1u * n);
  EXPECT_DOUBLE_EQ(stats->AxisTotal(MeshAxis::kTp).bytes, n * 16.0);  // metrics left out
  EXPECT_EQ(stats->AxisTotal(MeshAxis::kDpCp).calls, 0u);
}

TEST(FakeStatsTest, SizeOneGroupsCountNothingAndCopy) {
  auto stats = std::make_shared<CommStats>();
  auto comm =
      std::move(FakeWorld::Create(1)->Connect({MeshAxis::kTp, "", 0, 1, milliseconds(100), stats}))
          .value();
  std::vector<float> in = {1, 2, 3}, out(3);
  ASSERT_TRUE(comm->AllReduce(in.data(), 3).ok());
  ASSERT_TRUE(comm->AllGather(in.data(), out.data(), 3).ok());
  EXPECT_EQ(out, in);
  out.assign(3, 0);
  ASSERT_TRUE(comm->ReduceScatter(in.data(), out.data(), 3).ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE(comm->Barrier().ok());
  EXPECT_TRUE(stats->Snapshot().empty());
  EXPECT_EQ(comm->Send(in.data(), 3, 0).code(), StatusCode::kInvalidArgument);
}

TEST(FakeFaultTest, InjectedHangEndsInDeadlineExceededWithinTheTimeout) {
  constexpr int n = 3;
  auto world = FakeWorld::Create(n, "comm/tp/7");
  world->InjectFault(2, 1, FakeFault::kHang);  // rank 2's second call hangs
  auto comms = world->ConnectAll(MeshAxis::kTp, nullptr);
  std::vector<Status> first(n), second(n), third(n);
  RunRanks(n, [&](int r) {
    std::vector<float> a(16, 1.f);
    first[r] = comms[r]->AllReduce(a.data(), 16, {milliseconds(2000)});
    second[r] = comms[r]->AllReduce(a.data(), 16, {milliseconds(200)});
    third[r] = comms[r]->AllReduce(a.data(), 16, {milliseconds(200)});
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(first[r].ok()) << first[r].ToString();
    EXPECT_EQ(second[r].code(), StatusCode::kDeadlineExceeded) << second[r].ToString();
    EXPECT_NE(second[r].message().find("tp all_reduce"), std::string::npos);
    EXPECT_NE(second[r].message().find("comm/tp/7"), std::string::npos);
    EXPECT_EQ(third[r].code(), StatusCode::kFailedPrecondition) << third[r].ToString();
    EXPECT_EQ(comms[r]->health().code(), StatusCode::kDeadlineExceeded);
  }
  EXPECT_NE(second[0].message().find("rank(s) 2 did not join"), std::string::npos)
      << second[0].ToString();
  EXPECT_NE(second[2].message().find("injected hang"), std::string::npos);
}

TEST(FakeFaultTest, InjectedFailureFailsAtOnceAndPeersTimeOut) {
  constexpr int n = 2;
  auto world = FakeWorld::Create(n);
  world->InjectFault(1, 0, FakeFault::kFail);
  auto comms = world->ConnectAll(MeshAxis::kDpReplicate, nullptr);
  std::vector<Status> result(n);
  RunRanks(n, [&](int r) {
    std::vector<float> a(8), b(16);
    result[r] = comms[r]->AllGather(a.data(), b.data(), 8, {milliseconds(100)});
  });
  EXPECT_EQ(result[1].code(), StatusCode::kUnavailable) << result[1].ToString();
  EXPECT_EQ(result[0].code(), StatusCode::kDeadlineExceeded) << result[0].ToString();
  EXPECT_NE(result[0].message().find("dp_replicate all_gather"), std::string::npos);
}

TEST(FakeFaultTest, MismatchedCollectivesAreReportedNotHung) {
  auto world = FakeWorld::Create(2);
  auto comms = world->ConnectAll(MeshAxis::kTp, nullptr);
  std::vector<Status> result(2);
  RunRanks(2, [&](int r) {
    std::vector<float> a(8), b(16);
    result[r] = r == 0 ? comms[0]->AllReduce(a.data(), 8, {milliseconds(2000)})
                       : comms[1]->AllGather(a.data(), b.data(), 8, {milliseconds(2000)});
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(result[r].code(), StatusCode::kInternal) << result[r].ToString();
    EXPECT_NE(result[r].message().find("collective mismatch"), std::string::npos);
  }
}

TEST(FakeFaultTest, SendSendDeadlockTimesOutLikeGloo) {
  auto world = FakeWorld::Create(2);
  auto comms = world->ConnectAll(MeshAxis::kCp, nullptr);
  std::vector<Status> result(2);
  RunRanks(2, [&](int r) {
    std::vector<float> a(4);
    result[r] = comms[r]->Send(a.data(), 4, 1 - r, {milliseconds(100)});
  });
  // Both sends are unmatched; neither peer ever posts a Recv.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(result[r].code(), StatusCode::kDeadlineExceeded) << result[r].ToString();
    EXPECT_NE(result[r].message().find("cp send"), std::string::npos);
  }
}

TEST(FakeFaultTest, MessageSizeMismatchIsAnError) {
  auto world = FakeWorld::Create(2);
  auto comms = world->ConnectAll(MeshAxis::kCp, nullptr);
  std::vector<Status> result(2);
  RunRanks(2, [&](int r) {
    std::vector<float> a(8);
    result[r] = r == 0 ? comms[0]->Send(a.data(), 8, 1, {milliseconds(500)})
                       : comms[1]->Recv(a.data(), 4, 0, {milliseconds(500)});
  });
  EXPECT_EQ(result[1].code(), StatusCode::kInternal) << result[1].ToString();
}

TEST(FakeArgsTest, BadArgumentsAreInvalidAndLeaveTheCommunicatorUsable) {
  auto world = FakeWorld::Create(2);
  auto comms = world->ConnectAll(MeshAxis::kTp, nullptr);
  std::vector<float> a(4);
  EXPECT_EQ(comms[0]->Broadcast(a.data(), 4, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Send(a.data(), 4, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Send(a.data(), 4, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->AllReduce(nullptr, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->SendRecv(a.data(), 4, 0, a.data(), 4, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(comms[0]->health().ok());
  std::vector<Status> result(2);
  RunRanks(2, [&](int r) { result[r] = comms[r]->Barrier({milliseconds(1000)}); });
  EXPECT_TRUE(result[0].ok() && result[1].ok());
}

TEST(FakeBackendTest, ConnectJoinsOneWorldPerGroupId) {
  FakeBackend backend;
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::unique_ptr<Communicator>> comms(3);
  RunRanks(3, [&](int r) {
    CommConfig config{MeshAxis::kCp, "comm/cp/0", r, 3, milliseconds(2000), nullptr};
    auto c = backend.Connect(config, store);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    comms[r] = std::move(c).value();
  });
  EXPECT_EQ(backend.GroupIds(), (std::vector<std::string>{"comm/cp/0"}));
  std::vector<std::string> errors(3);
  RunRanks(3, [&](int r) { errors[r] = testing::CheckCollectives(*comms[r]); });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace meshrun
