// Asynchronous point-to-point on Gloo (Communicator::StartSend / StartRecv, decision 0064), ranks
// as forked processes over loopback TCP and a FileStore: the shared contract (p2p_checks.h) and
// the bounded timeouts of a started receive and send whose peer stays silent.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/comm/gloo_backend.h"
#include "tests/engine/comm/fork_util.h"
#include "tests/engine/comm/p2p_checks.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;

class GlooP2PTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    dir_ = (std::filesystem::temp_directory_path() /
            ("meshrun-gloo-p2p-" + std::to_string(::getpid()) + "-" + name))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

int P2PFail(int code, const std::string& what) {
  std::fprintf(stderr, "child failure %d: %s\n", code, what.c_str());
  return code;
}

TEST_F(GlooP2PTest, StartedSendsAndReceivesMatchInPostingOrder) {
  auto pids = testing::ForkRanks(2, [&](int rank) {
    auto store = FileStore::Create(dir_);
    auto backend = GlooBackend::Create();
    if (!store.ok() || !backend.ok()) return P2PFail(10, "setup");
    auto stats = std::make_shared<CommStats>();
    CommConfig config{MeshAxis::kPp, "test/pp/0", rank, 2, milliseconds(10000), stats};
    auto c = (*backend)->Connect(config, std::make_shared<PrefixStore>(config.group_id, *store));
    if (!c.ok()) return P2PFail(11, c.status().ToString());
    const std::string err = testing::CheckAsyncP2P(**c, stats.get());
    return err.empty() ? 0 : P2PFail(12, err);
  });
  EXPECT_EQ(testing::WaitAll(pids, milliseconds(20000)), (std::vector<int>{0, 0}));
}

TEST_F(GlooP2PTest, AStartedReceiveAndSendToASilentPeerTimeOutInTheirBound) {
  const std::vector<std::string> ops = {"recv", "send"};
  auto pids = testing::ForkRanks(2, [&](int rank) {
    auto store = FileStore::Create(dir_);
    auto backend = GlooBackend::Create();
    if (!store.ok() || !backend.ok()) return P2PFail(10, "setup");
    std::vector<std::unique_ptr<Communicator>> comms;
    for (const std::string& op : ops) {
      CommConfig config{MeshAxis::kPp, "silent/" + op, rank, 2, milliseconds(10000), nullptr};
      auto c = (*backend)->Connect(config, std::make_shared<PrefixStore>(config.group_id, *store));
      if (!c.ok()) return P2PFail(11, c.status().ToString());
      comms.push_back(std::move(c).value());
    }
    if (rank == 1) {
      return (*store)->Get("done", milliseconds(15000)).ok() ? 0 : P2PFail(12, "no done");
    }
    std::vector<float> a(4096, 1.f);
    for (size_t i = 0; i < ops.size(); ++i) {
      Communicator& c = *comms[i];
      const auto start = std::chrono::steady_clock::now();
      auto w = ops[i] == "recv"
                   ? c.StartRecv(a.data(), a.size(), 1, CallOptions(milliseconds(300)))
                   : c.StartSend(a.data(), a.size(), 1, CallOptions(milliseconds(300)));
      if (!w.ok()) return P2PFail(13, ops[i] + ": " + w.status().ToString());
      Status s = c.Wait(*w);
      if (s.code() != StatusCode::kDeadlineExceeded)
        return P2PFail(14, ops[i] + ": " + s.ToString());
      if (s.message().find("pp " + ops[i]) == std::string::npos) return P2PFail(15, s.ToString());
      if (std::chrono::steady_clock::now() - start > milliseconds(5000)) {
        return P2PFail(16, ops[i] + " took longer than its bound");
      }
      if (c.health().ok()) return P2PFail(17, ops[i] + ": still healthy after a timeout");
    }
    return (*store)->Set("done", "1").ok() ? 0 : P2PFail(18, "set");
  });
  EXPECT_EQ(testing::WaitAll(pids, milliseconds(20000)), (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace meshrun
