// GrpcStore against an in-process fake coordinator: set/get/add/wait/check, bounded waits
// (split into several calls), the coordinator's errors passed through (ABORTED for a stale
// attempt, FAILED_PRECONDITION for a non-counter), retries while the coordinator is not up yet,
// and a Gloo mesh bootstrapped through it.
#include "rpc/grpc_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "engine/comm/gloo_backend.h"
#include "engine/comm/mesh_comms.h"
#include "tests/worker/fake_coordinator.h"

namespace meshrun {
namespace {

using namespace std::chrono_literals;
using testing::FakeCoordinator;
using testing::FakeServer;

std::shared_ptr<GrpcStore> StoreOn(const std::string& address, const std::string& job = "job",
                                   int attempt = 1, GrpcStoreOptions options = {}) {
  options.address = address;
  options.job_id = job;
  options.attempt = attempt;
  StatusOr<std::shared_ptr<GrpcStore>> store = GrpcStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? *store : nullptr;
}

TEST(GrpcStore, SetGetAddCheckWait) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  auto store = StoreOn(server.address());
  ASSERT_TRUE(store->Set("a", std::string("x\0y", 3)).ok());
  StatusOr<std::string> a = store->Get("a", 1s);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, std::string("x\0y", 3));
  EXPECT_EQ(*store->Add("n", 2), 2);
  EXPECT_EQ(*store->Add("n", 3), 5);
  EXPECT_EQ(*store->Get("n", 1s), "5");
  EXPECT_TRUE(*store->Check({"a", "n"}));
  EXPECT_FALSE(*store->Check({"a", "missing"}));
  EXPECT_TRUE(store->Wait({"a", "n"}, 1s).ok());
  // Another attempt's key space is separate.
  auto other = StoreOn(server.address(), "job", 2);
  EXPECT_FALSE(*other->Check({"a"}));
}

TEST(GrpcStore, GetWaitsForAKeySetLater) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  auto reader = StoreOn(server.address());
  auto writer = StoreOn(server.address());
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(writer->Set("late", "v").ok());
  });
  StatusOr<std::string> got = reader->Get("late", 10s);
  later.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "v");
}

TEST(GrpcStore, LongWaitsAreSplitAndTimeOutNamingTheKey) {
  FakeCoordinator fake;
  fake.max_wait = 100ms;  // a coordinator that bounds each wait tightly
  FakeServer server(&fake);
  GrpcStoreOptions options;
  options.max_wait_per_call = 150ms;
  auto store = StoreOn(server.address(), "job", 1, options);
  StatusOr<std::string> got = store->Get("never", 700ms);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("never"), std::string::npos) << got.status().message();
  EXPECT_GE(fake.store_gets(), 3) << "the wait was split into several calls";
  EXPECT_EQ(store->Wait({"never"}, 200ms).code(), StatusCode::kDeadlineExceeded);
}

TEST(GrpcStore, CoordinatorErrorsPassThrough) {
  FakeCoordinator fake;
  fake.SetCurrentAttempt("job", 2);
  FakeServer server(&fake);
  auto stale = StoreOn(server.address(), "job", 1);
  EXPECT_EQ(stale->Set("k", "v").code(), StatusCode::kAborted);
  EXPECT_EQ(stale->Get("k", 30s).status().code(), StatusCode::kAborted);
  EXPECT_EQ(fake.aborted_calls(), 2) << "ABORTED is not retried: one call each";
  auto current = StoreOn(server.address(), "job", 2);
  ASSERT_TRUE(current->Set("text", "abc").ok());
  EXPECT_EQ(current->Add("text", 1).status().code(), StatusCode::kFailedPrecondition);
}

// A retried addition carries the first try's request id, so a coordinator that applied it but
// whose reply was lost answers the first result (coordinator_store_manager_test checks that side);
// each new addition has a new id.
TEST(GrpcStore, RetriesAnAdditionUnderItsRequestId) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  auto store = StoreOn(server.address());
  fake.LoseAddReplies(2);
  EXPECT_EQ(*store->Add("n", 2), 2);
  EXPECT_EQ(*store->Add("n", 3), 5);
  const std::vector<std::string> ids = fake.add_request_ids();
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_FALSE(ids[0].empty());
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
  EXPECT_NE(ids[3], ids[0]);
  EXPECT_EQ(*store->Get("n", 1s), "5");
  // Another client's first id is not this one's first.
  ASSERT_TRUE(StoreOn(server.address())->Add("n", 0).ok());
  EXPECT_NE(fake.add_request_ids().back(), ids[0]);
}

TEST(GrpcStore, RetriesUntilTheCoordinatorIsUp) {
  FakeCoordinator fake;
  int port;
  {
    FakeServer probe(&fake);
    port = probe.port();
  }
  auto store = StoreOn("127.0.0.1:" + std::to_string(port));
  std::unique_ptr<FakeServer> server;
  std::thread start_later([&] {
    std::this_thread::sleep_for(500ms);
    server = std::make_unique<FakeServer>(&fake, port);
  });
  const Status set = store->Set("k", "v");
  start_later.join();
  ASSERT_TRUE(server->ok());
  EXPECT_TRUE(set.ok()) << set.ToString();
  EXPECT_EQ(*store->Get("k", 1s), "v");
}

TEST(GrpcStore, RefusesIncompleteScopes) {
  GrpcStoreOptions o;
  o.address = "127.0.0.1:1";
  o.job_id = "job";
  o.attempt = 0;
  EXPECT_EQ(GrpcStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.attempt = 1;
  o.job_id = "";
  EXPECT_EQ(GrpcStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.job_id = "job";
  o.address = "";
  EXPECT_EQ(GrpcStore::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(GrpcStore, BootstrapsAGlooMesh) {
  FakeCoordinator fake;
  FakeServer server(&fake);
  StatusOr<ParallelDims> dims = ParallelDims::Create(1, 2, 1, 2);
  ASSERT_TRUE(dims.ok());
  std::vector<float> sums(4, 0);
  std::vector<std::thread> ranks;
  std::vector<Status> results(4);
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      auto store = StoreOn(server.address(), "mesh-job", 1);
      StatusOr<std::shared_ptr<GlooBackend>> backend = GlooBackend::Create({});
      if (!backend.ok()) {
        results[r] = backend.status();
        return;
      }
      MeshCommsOptions options;
      options.timeout = 20s;
      StatusOr<std::unique_ptr<MeshComms>> comms =
          MeshComms::Create(*dims, r, store, **backend, std::make_shared<CommStats>(), options);
      if (!comms.ok()) {
        results[r] = comms.status();
        return;
      }
      float value = static_cast<float>(r + 1);
      results[r] = (*comms)->Get(MeshAxis::kDpShard).AllReduce(&value, 1);
      sums[r] = value;
    });
  }
  for (auto& t : ranks) t.join();
  // Every rank's status, not only the first that failed: a peer's error explains the others'.
  std::string statuses;
  for (int r = 0; r < 4; ++r) statuses += std::to_string(r) + ": " + results[r].ToString() + "\n";
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(results[r].ok()) << statuses;
  // dp_shard groups {0,2} and {1,3}.
  EXPECT_EQ(sums, (std::vector<float>{4, 6, 4, 6}));
}

}  // namespace
}  // namespace meshrun
