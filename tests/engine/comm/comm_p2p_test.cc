// Asynchronous point-to-point on the fake backend (Communicator::StartSend / StartRecv, decision
// 0064): the shared contract (p2p_checks.h), a middle rank receiving from both sides ahead, the
// bounded timeouts of an unanswered receive and an unreceived send, and a size mismatch.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/fake_backend.h"
#include "tests/engine/comm/collective_checks.h"
#include "tests/engine/comm/p2p_checks.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(CommP2PTest, StartedSendsAndReceivesMatchInPostingOrderOnTheFake) {
  auto world = FakeWorld::Create(2, "test/pp/0");
  std::vector<std::shared_ptr<CommStats>> stats;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 2; ++r) {
    stats.push_back(std::make_shared<CommStats>());
    comms.push_back(
        std::move(world->Connect({MeshAxis::kPp, "", r, 2, milliseconds(10000), stats[r]}))
            .value());
  }
  std::vector<std::string> errors(2);
  testing::RunRanks(2,
                    [&](int r) { errors[r] = testing::CheckAsyncP2P(*comms[r], stats[r].get()); });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(CommP2PTest, AMiddleRankReceivesFromBothSidesAheadAndWaitsOutOfOrder) {
  // A pipeline's middle stage: 5 receives posted from each neighbour before any arrives, then
  // waited for last first; the neighbours send theirs later, interleaved.
  constexpr int kMessages = 5;
  constexpr size_t kCount = 64;
  auto world = FakeWorld::Create(3, "test/pp/1");
  auto comms = world->ConnectAll(MeshAxis::kPp, nullptr, milliseconds(10000));
  std::vector<std::string> errors(3);
  testing::RunRanks(3, [&](int r) {
    Communicator& c = *comms[r];
    if (r == 1) {
      std::vector<std::vector<float>> in(2 * kMessages, std::vector<float>(kCount, -1.f));
      std::vector<CommWork> works;
      for (int k = 0; k < kMessages; ++k) {
        for (int side : {0, 2}) {
          auto w = c.StartRecv(in[(side / 2) * kMessages + k].data(), kCount, side);
          if (!w.ok()) {
            errors[r] = w.status().ToString();
            return;
          }
          works.push_back(std::move(w).value());
        }
      }
      for (int i = static_cast<int>(works.size()) - 1; i >= 0; --i) {
        if (Status s = c.Wait(works[i]); !s.ok()) {
          errors[r] = s.ToString();
          return;
        }
      }
      for (int side : {0, 2}) {
        for (int k = 0; k < kMessages; ++k) {
          for (size_t i = 0; i < kCount; ++i) {
            if (in[(side / 2) * kMessages + k][i] != testing::P2PValue(side, k, i)) {
              errors[r] = "from " + std::to_string(side) + " message " + std::to_string(k);
              return;
            }
          }
        }
      }
      return;
    }
    std::vector<std::vector<float>> out(kMessages, std::vector<float>(kCount));
    std::vector<CommWork> sends;
    for (int k = 0; k < kMessages; ++k) {
      for (size_t i = 0; i < kCount; ++i) out[k][i] = testing::P2PValue(r, k, i);
      std::this_thread::sleep_for(milliseconds(2));
      auto w = c.StartSend(out[k].data(), kCount, 1);
      if (!w.ok()) {
        errors[r] = w.status().ToString();
        return;
      }
      sends.push_back(std::move(w).value());
    }
    for (CommWork& w : sends) {
      if (Status s = c.Wait(w); !s.ok()) errors[r] = s.ToString();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(3, ""));
}

TEST(CommP2PTest, AnUnansweredReceiveAndAnUnreceivedSendTimeOutInTheirBound) {
  for (const bool send : {false, true}) {
    SCOPED_TRACE(send ? "send" : "recv");
    auto world = FakeWorld::Create(2, send ? "test/pp/send" : "test/pp/recv");
    auto comms = world->ConnectAll(MeshAxis::kPp, nullptr, milliseconds(10000));
    std::vector<float> buf(16, 1.f);
    const auto start = Clock::now();
    auto w = send ? comms[0]->StartSend(buf.data(), buf.size(), 1, CallOptions(milliseconds(200)))
                  : comms[0]->StartRecv(buf.data(), buf.size(), 1, CallOptions(milliseconds(200)));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    Status s = comms[0]->Wait(*w);
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    EXPECT_NE(s.message().find(send ? "pp send" : "pp recv"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("timeout 200 ms"), std::string::npos) << s.ToString();
    EXPECT_LT(Clock::now() - start, milliseconds(5000));
    EXPECT_FALSE(comms[0]->health().ok());
    EXPECT_EQ(comms[0]->StartSend(buf.data(), buf.size(), 1).status().code(),
              StatusCode::kFailedPrecondition);
    // The withdrawn post is gone: the peer's late counterpart finds nothing to match and times
    // out too (it never writes the failed rank's buffer).
    std::vector<float> other(16, 2.f);
    Status late =
        send ? comms[1]->Recv(other.data(), other.size(), 0, CallOptions(milliseconds(100)))
             : comms[1]->Send(other.data(), other.size(), 0, CallOptions(milliseconds(100)));
    EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded) << late.ToString();
    EXPECT_EQ(buf[0], 1.f);
  }
}

TEST(CommP2PTest, ASizeMismatchFailsTheReceiver) {
  auto world = FakeWorld::Create(2, "test/pp/mismatch");
  auto comms = world->ConnectAll(MeshAxis::kPp, nullptr, milliseconds(5000));
  std::vector<float> a(8, 1.f), b(4, 0.f);
  auto recv = comms[1]->StartRecv(b.data(), b.size(), 0);
  ASSERT_TRUE(recv.ok());
  auto send = comms[0]->StartSend(a.data(), a.size(), 1);
  ASSERT_TRUE(send.ok());
  EXPECT_TRUE(comms[0]->Wait(*send).ok());
  Status s = comms[1]->Wait(*recv);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("sent 32 bytes but this rank expected 16"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace meshrun
