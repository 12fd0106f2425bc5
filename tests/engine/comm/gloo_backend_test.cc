// Gloo over loopback TCP with ranks as forked processes and a FileStore in a temp dir: every
// op against the serial reference for 2 and 4 ranks, MeshComms on a 2×2 mesh, and a peer
// killed with SIGKILL making the survivors' next collective fail in time instead of hanging.
#include "engine/comm/gloo_backend.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "engine/comm/mesh_comms.h"
#include "tests/engine/comm/collective_checks.h"
#include "tests/engine/comm/fork_util.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class GlooTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    dir_ = (std::filesystem::temp_directory_path() /
            ("meshrun-gloo-" + std::to_string(::getpid()) + "-" + name))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // In a child: this rank's communicator of an n-rank group named "tp".
  StatusOr<std::unique_ptr<Communicator>> ConnectChild(int rank, int n,
                                                       std::shared_ptr<CommStats> stats,
                                                       milliseconds timeout) {
    MESHRUN_ASSIGN_OR_RETURN(auto store, FileStore::Create(dir_));
    MESHRUN_ASSIGN_OR_RETURN(auto backend, GlooBackend::Create());
    CommConfig config{MeshAxis::kTp, "test/tp/0", rank, n, timeout, std::move(stats)};
    return backend->Connect(config, std::make_shared<PrefixStore>("test/tp/0", store));
  }

  std::string dir_;
};

int Fail(int code, const std::string& what) {
  std::fprintf(stderr, "child failure %d: %s\n", code, what.c_str());
  return code;
}

TEST_F(GlooTest, EveryOpMatchesTheReferenceOnTwoAndFourRanks) {
  for (int n : {2, 4}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::filesystem::remove_all(dir_);
    auto pids = testing::ForkRanks(n, [&](int rank) {
      auto stats = std::make_shared<CommStats>();
      auto comm = ConnectChild(rank, n, stats, milliseconds(10000));
      if (!comm.ok()) return Fail(10, comm.status().ToString());
      const std::string err = testing::CheckCollectives(**comm);
      if (!err.empty()) return Fail(11, err);
      // Bus bytes of the all_reduces CheckCollectives ran: Σ counts·4·2(n−1)/n.
      double want = 0;
      for (size_t count : testing::CheckCounts()) {
        want += BusBytes(CommOp::kAllReduce, count * sizeof(float), n);
      }
      const double got = stats->Get(MeshAxis::kTp, CommOp::kAllReduce).bytes;
      if (got != want) {
        return Fail(12, "all_reduce bytes " + std::to_string(got) + " != " + std::to_string(want));
      }
      return 0;
    });
    EXPECT_EQ(testing::WaitAll(pids, milliseconds(20000)), std::vector<int>(n, 0));
  }
}

TEST_F(GlooTest, MeshCommsOnATwoByTwoMesh) {
  auto dims = ParallelDims::Create(1, 2, 1, 2);
  ASSERT_TRUE(dims.ok());
  auto pids = testing::ForkRanks(4, [&](int rank) {
    auto store = FileStore::Create(dir_);
    auto backend = GlooBackend::Create();
    if (!store.ok() || !backend.ok()) return Fail(10, "setup");
    MeshCommsOptions options;
    options.timeout = milliseconds(10000);
    auto mesh = MeshComms::Create(*dims, rank, *store, **backend, nullptr, options);
    if (!mesh.ok()) return Fail(11, mesh.status().ToString());
    for (MeshAxis axis : kAllMeshAxes) {
      float v = static_cast<float>(rank);
      Status s = (*mesh)->Get(axis).AllReduce(&v, 1);
      if (!s.ok()) return Fail(12, s.ToString());
      float want = 0;
      for (int member : dims->GroupOf(rank, axis)) want += static_cast<float>(member);
      if (v != want) return Fail(13, std::string(MeshAxisName(axis)) + " sum " + std::to_string(v));
    }
    return 0;
  });
  EXPECT_EQ(testing::WaitAll(pids, milliseconds(20000)), std::vector<int>(4, 0));
}

TEST_F(GlooTest, AKilledPeerFailsTheNextCollectiveInTime) {
  constexpr int n = 3;
  constexpr int kVictim = 2;
  auto pids = testing::ForkRanks(n, [&](int rank) {
    auto comm = ConnectChild(rank, n, nullptr, milliseconds(10000));
    if (!comm.ok()) return Fail(10, comm.status().ToString());
    std::vector<float> a(1024, 1.f);
    Status s = (*comm)->AllReduce(a.data(), a.size());
    if (!s.ok()) return Fail(11, s.ToString());
    auto store = *FileStore::Create(dir_);
    if (!store->Add("ready", 1).ok()) return Fail(12, "add");
    if (rank == kVictim) {
      ::pause();  // until the parent kills it
      return 0;
    }
    if (!store->Get("go", milliseconds(10000)).ok()) return Fail(13, "no go");
    // Bounded by its own timeout; the test's WaitAll bounds the whole (no clock asserted here).
    s = (*comm)->AllReduce(a.data(), a.size(), {milliseconds(3000)});
    if (s.ok()) return Fail(14, "all_reduce succeeded without the victim");
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded) {
      return Fail(16, s.ToString());
    }
    if (s.message().find("tp all_reduce (group test/tp/0") == std::string::npos) {
      return Fail(17, s.ToString());
    }
    std::fprintf(stderr, "rank %d saw: %s\n", rank, s.ToString().c_str());
    Status again = (*comm)->Barrier({milliseconds(1000)});
    if (again.code() != StatusCode::kFailedPrecondition) return Fail(18, again.ToString());
    return 0;
  });
  auto store = FileStore::Create(dir_);
  ASSERT_TRUE(store.ok());
  // Wait (bounded) until every child has connected and finished one all_reduce.
  const auto deadline = Clock::now() + milliseconds(15000);
  bool ready = false;
  while (Clock::now() < deadline && !ready) {
    auto v = (*store)->Get("ready", milliseconds(100));
    ready = v.ok() && *v == std::to_string(n);
    if (!ready) std::this_thread::sleep_for(milliseconds(10));
  }
  ::kill(pids[kVictim], SIGKILL);
  ASSERT_TRUE(ready) << "children did not get ready";
  ASSERT_TRUE((*store)->Set("go", "1").ok());
  const std::vector<int> codes = testing::WaitAll(pids, milliseconds(15000));
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[kVictim], -SIGKILL);
}

TEST_F(GlooTest, ASilentPeerTimesOutEveryOp) {
  // One fresh 2-rank group per op (a timeout leaves a communicator unusable); rank 1 joins
  // each group and stays silent.
  const std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                        "barrier",    "recv",           "send_recv",  "send"};
  auto pids = testing::ForkRanks(2, [&](int rank) {
    auto store = FileStore::Create(dir_);
    auto backend = GlooBackend::Create();
    if (!store.ok() || !backend.ok()) return Fail(10, "setup");
    std::vector<std::unique_ptr<Communicator>> comms;
    for (const std::string& op : ops) {
      CommConfig config{MeshAxis::kCp, "silent/" + op, rank, 2, milliseconds(10000), nullptr};
      auto c = (*backend)->Connect(config, std::make_shared<PrefixStore>(config.group_id, *store));
      if (!c.ok()) return Fail(11, c.status().ToString());
      comms.push_back(std::move(c).value());
    }
    if (rank == 1) return (*store)->Get("done", milliseconds(15000)).ok() ? 0 : Fail(12, "no done");
    std::vector<float> a(4096, 1.f), b(8192);
    const CallOptions opts(milliseconds(300));
    for (size_t i = 0; i < ops.size(); ++i) {
      Communicator& c = *comms[i];
      Status s;
      if (ops[i] == "all_reduce") s = c.AllReduce(a.data(), a.size(), opts);
      if (ops[i] == "reduce_scatter") s = c.ReduceScatter(b.data(), a.data(), a.size(), opts);
      if (ops[i] == "all_gather") s = c.AllGather(a.data(), b.data(), a.size(), opts);
      if (ops[i] == "broadcast") s = c.Broadcast(a.data(), a.size(), 1, opts);
      if (ops[i] == "barrier") s = c.Barrier(opts);
      if (ops[i] == "recv") s = c.Recv(a.data(), a.size(), 1, opts);
      if (ops[i] == "send") s = c.Send(a.data(), a.size(), 1, opts);
      if (ops[i] == "send_recv") s = c.SendRecv(a.data(), a.size(), 1, b.data(), a.size(), 1, opts);
      if (s.code() != StatusCode::kDeadlineExceeded) return Fail(13, ops[i] + ": " + s.ToString());
      if (s.message().find("cp " + ops[i]) == std::string::npos) return Fail(14, s.ToString());
    }
    return (*store)->Set("done", "1").ok() ? 0 : Fail(16, "set");
  });
  EXPECT_EQ(testing::WaitAll(pids, milliseconds(20000)), (std::vector<int>{0, 0}));
}

TEST_F(GlooTest, BootstrapWithoutPeersTimesOut) {
  auto store = FileStore::Create(dir_);
  ASSERT_TRUE(store.ok());
  auto backend = GlooBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  CommConfig config{MeshAxis::kDpShard, "test/dp_shard/0", 0, 2, milliseconds(300), nullptr};
  auto comm = (*backend)->Connect(config, std::make_shared<PrefixStore>("g", *store));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("test/dp_shard/0"), std::string::npos);
}

TEST(GlooCreateTest, UnknownInterfaceIsUnavailable) {
  GlooOptions options;
  options.iface = "meshrun-no-such-if0";
  auto backend = GlooBackend::Create(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace meshrun
