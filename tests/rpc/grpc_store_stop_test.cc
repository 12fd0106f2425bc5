// GrpcStore across a coordinator's clean stop (issue #31): gRPC's shutdown can end store calls
// with CANCELLED, which the rank never asks for; StoreSet and StoreGet retry it like UNAVAILABLE,
// so a checkpoint barrier that straddles a SIGTERM completes as one that straddles a kill -9.
#include <gtest/gtest.h>

#include "rpc/grpc_store.h"
#include "tests/worker/fake_coordinator.h"

namespace meshrun {
namespace {

using namespace std::chrono_literals;

TEST(GrpcStoreStop, CancelledCallsOfAStoppingCoordinatorAreRetried) {
  testing::FakeCoordinator fake;
  testing::FakeServer server(&fake);
  GrpcStoreOptions options;
  options.address = server.address();
  options.job_id = "job";
  options.attempt = 1;
  StatusOr<std::shared_ptr<GrpcStore>> store = GrpcStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  fake.CancelStoreCalls(2);
  const Status set = (*store)->Set("checkpoint/4/written/0", "1");
  EXPECT_TRUE(set.ok()) << set.ToString();
  fake.CancelStoreCalls(2);
  StatusOr<std::string> got = (*store)->Get("checkpoint/4/written/0", 10s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "1");
  fake.CancelStoreCalls(1);
  EXPECT_TRUE((*store)->Wait({"checkpoint/4/written/0"}, 10s).ok());
}

}  // namespace
}  // namespace meshrun
