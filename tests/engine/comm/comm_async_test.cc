// The asynchronous half of the Communicator contract (StartAllReduce / StartReduceScatter /
// StartAllGather, then Wait): results equal the blocking calls on a backend that completes in
// Start (fake), exposed and overlapped seconds (an overlapping test backend that reports the
// call's device time), the error shape of a failed Wait (the blocking calls' shape, which the
// Gloo and NCCL timeouts share), and the size-1 communicators MeshComms takes from the backend.
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/fake_backend.h"
#include "engine/comm/mesh_comms.h"
#include "tests/engine/comm/collective_checks.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;

using testing::RunRanks;

TEST(CommAsyncTest, StartWaitEqualsTheBlockingCallsOnTheFake) {
  constexpr int n = 3;
  auto world = FakeWorld::Create(n, "test/dp_shard/0");
  std::vector<std::shared_ptr<CommStats>> stats;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    stats.push_back(std::make_shared<CommStats>());
    comms.push_back(
        std::move(world->Connect({MeshAxis::kDpShard, "", r, n, milliseconds(5000), stats[r]}))
            .value());
  }
  RunRanks(n, [&](int r) {
    Communicator& c = *comms[r];
    EXPECT_FALSE(c.overlaps());
    std::vector<float> sum(4, static_cast<float>(r + 1));
    std::vector<float> shard(2, static_cast<float>(r)), gathered(2 * n, -1.f);
    std::vector<float> full(2 * n), mine(2, 0.f);
    for (int i = 0; i < 2 * n; ++i) full[i] = static_cast<float>(i + r);
    auto ar = c.StartAllReduce(sum.data(), sum.size());
    ASSERT_TRUE(ar.ok()) << ar.status().ToString();
    auto ag = c.StartAllGather(shard.data(), gathered.data(), 2);
    ASSERT_TRUE(ag.ok());
    auto rs = c.StartReduceScatter(full.data(), mine.data(), 2,
                                   CallOptions::Axis(MeshAxis::kDpReplicate));
    ASSERT_TRUE(rs.ok());
    EXPECT_TRUE(ar->pending());
    // Any order of waits.
    ASSERT_TRUE(c.Wait(*rs).ok());
    ASSERT_TRUE(c.Wait(*ag).ok());
    ASSERT_TRUE(c.Wait(*ar).ok());
    EXPECT_FALSE(ar->pending());
    for (float v : sum) EXPECT_EQ(v, 6.f);  // 1 + 2 + 3
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(gathered[2 * q], static_cast<float>(q));
      EXPECT_EQ(gathered[2 * q + 1], static_cast<float>(q));
    }
    // mine[i] = Σ_q full_q[2r + i] = Σ_q (2r + i + q)
    for (int i = 0; i < 2; ++i) EXPECT_EQ(mine[i], static_cast<float>(n * (2 * r + i) + 3));
    Status again = c.Wait(*ar);
    EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.ToString();
    EXPECT_TRUE(c.health().ok()) << "a bad Wait leaves the communicator usable";
  });
  for (int r = 0; r < n; ++r) {
    const CommCounter ar = stats[r]->Get(MeshAxis::kDpShard, CommOp::kAllReduce);
    EXPECT_EQ(ar.calls, 1u);
    EXPECT_DOUBLE_EQ(ar.bytes, 16.0 * 2 * (n - 1) / n);
    EXPECT_DOUBLE_EQ(ar.exposed_seconds, ar.seconds) << "a CPU backend overlaps nothing";
    EXPECT_DOUBLE_EQ(ar.overlapped_seconds(), 0);
    EXPECT_EQ(stats[r]->Get(MeshAxis::kDpReplicate, CommOp::kReduceScatter).calls, 1u)
        << "charged to the label";
  }
}

// The raw-bytes gather (FSDP's bf16 gathers): every rank's bytes in rank order, counted as an
// all_gather of those bytes.
TEST(CommAsyncTest, StartAllGatherBytesGathersRawBytes) {
  constexpr int n = 3;
  auto world = FakeWorld::Create(n, "test/dp_shard/1");
  std::vector<std::shared_ptr<CommStats>> stats;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    stats.push_back(std::make_shared<CommStats>());
    comms.push_back(
        std::move(world->Connect({MeshAxis::kDpShard, "", r, n, milliseconds(5000), stats[r]}))
            .value());
  }
  RunRanks(n, [&](int r) {
    const uint16_t mine[3] = {static_cast<uint16_t>(10 * r), static_cast<uint16_t>(10 * r + 1),
                              static_cast<uint16_t>(10 * r + 2)};
    std::vector<uint16_t> all(3 * n, 0);
    auto w = comms[r]->StartAllGatherBytes(mine, all.data(), sizeof(mine));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(comms[r]->Wait(*w).ok());
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < 3; ++i) EXPECT_EQ(all[3 * q + i], 10 * q + i);
    }
  });
  const CommCounter ag = stats[0]->Get(MeshAxis::kDpShard, CommOp::kAllGather);
  EXPECT_EQ(ag.calls, 1u);
  EXPECT_DOUBLE_EQ(ag.bytes, 6.0 * n * (n - 1) / n);
}

TEST(CommAsyncTest, SizeOneAndEmptyCallsCompleteAtOnce) {
  auto solo = MakeSoloCommunicator({MeshAxis::kTp, "g", 0, 1, milliseconds(100), nullptr});
  std::vector<float> in = {1, 2, 3}, out(3, 0);
  auto w = solo->StartAllGather(in.data(), out.data(), 3);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(solo->Wait(*w).ok());
  EXPECT_EQ(out, in);
  auto empty = solo->StartAllReduce(nullptr, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(solo->Wait(*empty).ok());
  EXPECT_EQ(solo->StartAllReduce(nullptr, 4).status().code(), StatusCode::kInvalidArgument);
}

// A size-2 group whose calls "run on a device": Start returns at once, Wait reports a device
// time of `busy` seconds (or `fail`).
class OverlappingCommunicator final : public Communicator {
 public:
  OverlappingCommunicator(CommConfig config, double busy, Status fail = OkStatus())
      : Communicator(std::move(config)), busy_(busy), fail_(std::move(fail)) {}
  bool overlaps() const override { return true; }
  int started = 0, waited = 0;

 protected:
  Status DoAllReduce(float*, size_t, Duration) override { return OkStatus(); }
  Status DoReduceScatter(const float*, float*, size_t, Duration) override { return OkStatus(); }
  Status DoAllGather(const void*, void*, size_t, Duration) override { return OkStatus(); }
  Status DoBroadcast(void*, size_t, int, Duration) override { return OkStatus(); }
  Status DoSendRecv(const void*, size_t, int, void*, size_t, int, Duration) override {
    return OkStatus();
  }
  Status DoBarrier(Duration) override { return OkStatus(); }
  StatusOr<int64_t> DoStart(AsyncOp, const void*, void*, size_t, Duration) override {
    return static_cast<int64_t>(started++);
  }
  Status DoWait(int64_t, Duration, double* busy_seconds) override {
    ++waited;
    if (!fail_.ok()) return fail_;
    *busy_seconds = busy_;
    return OkStatus();
  }

 private:
  double busy_;
  Status fail_;
};

TEST(CommAsyncTest, OverlappedSecondsAreTheCallsTimeTheCallerDidNotWaitFor) {
  auto stats = std::make_shared<CommStats>();
  // 1000 s of device time: far more than the caller can spend blocked in Start and Wait here.
  OverlappingCommunicator c({MeshAxis::kDpShard, "comm/dp_shard/0", 0, 2, milliseconds(500), stats},
                            1000.0);
  std::vector<float> grad(8, 1.f), shard(4);
  auto w = c.StartReduceScatter(grad.data(), shard.data(), 4);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(c.started, 1);
  EXPECT_EQ(c.waited, 0) << "Start does not wait";
  ASSERT_TRUE(c.Wait(*w).ok());
  const CommCounter rs = stats->Get(MeshAxis::kDpShard, CommOp::kReduceScatter);
  EXPECT_EQ(rs.calls, 1u);
  EXPECT_DOUBLE_EQ(rs.seconds, 1000.0);
  EXPECT_DOUBLE_EQ(rs.bytes, 32.0 / 2);
  EXPECT_LT(rs.exposed_seconds, rs.seconds);
  EXPECT_GT(rs.overlapped_seconds(), 0);
  EXPECT_DOUBLE_EQ(rs.exposed_seconds + rs.overlapped_seconds(), rs.seconds);
}

TEST(CommAsyncTest, AFailedWaitHasTheBlockingCallsErrorShapeAndIsSticky) {
  OverlappingCommunicator c({MeshAxis::kTp, "comm/tp/3", 1, 2, milliseconds(750), nullptr}, 0,
                            DeadlineExceededError("ncclAllReduce did not complete in time"));
  std::vector<float> x(4, 1.f);
  auto w = c.StartAllReduce(x.data(), 4);
  ASSERT_TRUE(w.ok());
  Status s = c.Wait(*w);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "tp all_reduce (group comm/tp/3, rank 1 of 2), timeout 750 ms: ncclAllReduce did not "
            "complete in time");
  EXPECT_FALSE(c.health().ok());
  EXPECT_EQ(c.StartAllReduce(x.data(), 4).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.AllReduce(x.data(), 4).code(), StatusCode::kFailedPrecondition);
}

// MeshComms asks the backend for its size-1 communicators (a device backend copies on its
// device there).
class SoloCountingBackend final : public CommBackend {
 public:
  std::string name() const override { return "solo-counting"; }
  StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                  std::shared_ptr<Store> store) override {
    return fake_.Connect(config, std::move(store));
  }
  std::unique_ptr<Communicator> MakeSolo(CommConfig config) override {
    ++solos;
    return MakeSoloCommunicator(std::move(config));
  }
  int solos = 0;

 private:
  FakeBackend fake_;
};

TEST(CommAsyncTest, MeshCommsTakesSizeOneCommunicatorsFromTheBackend) {
  auto backend = std::make_shared<SoloCountingBackend>();
  auto store = std::make_shared<InMemoryStore>();
  auto dims = ParallelDims::Create(1, 1, 1, 1);
  ASSERT_TRUE(dims.ok());
  auto mesh = MeshComms::Create(*dims, 0, store, backend, nullptr);
  ASSERT_TRUE(mesh.ok()) << mesh.status().ToString();
  EXPECT_EQ(backend->solos, static_cast<int>(kAllMeshAxes.size()));
  (*mesh)->SetComputeStream(nullptr);  // host communicators ignore it
}

}  // namespace
}  // namespace meshrun
