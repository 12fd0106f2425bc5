// HealthServer (--health-listen): an in-process server on port 0 answers grpc.health.v1 for ""
// (readiness, following SetReady) and "liveness", serves nothing else (not even the reflection
// the coordinator registers for every server), and refuses bad addresses naming the flag.
#include "common/health_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <gtest/gtest.h>

#include "tests/coordinator/grpc_test_util.h"
#include "tests/deploy/manifest_support.h"

namespace meshrun {
namespace {

using deploy_test::HealthCheck;

TEST(HealthServerTest, ReadinessFollowsSetReadyAndLivenessStaysServing) {
  auto server = HealthServer::Start("127.0.0.1:0", /*ready=*/false);
  ASSERT_TRUE(server.ok()) << server.status().message();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(HealthCheck(port, ""), 2);  // NOT_SERVING
  EXPECT_EQ(HealthCheck(port, HealthServer::kLivenessService), 1);
  (*server)->SetReady(true);
  EXPECT_EQ(HealthCheck(port, ""), 1);
  (*server)->SetReady(false);
  EXPECT_EQ(HealthCheck(port, ""), 2);
  EXPECT_EQ(HealthCheck(port, HealthServer::kLivenessService), 1);
  // An unknown service name is NOT_FOUND, not SERVING.
  EXPECT_EQ(HealthCheck(port, "meshrun.v1.CoordinatorService"), -1);

  (*server)->Shutdown();
  (*server)->SetReady(true);  // ignored once stopped
  EXPECT_EQ(HealthCheck(port, "", std::chrono::milliseconds(500)), -1);
}

TEST(HealthServerTest, ServesNothingButHealth) {
  // The coordinator registers server reflection for every server of the process.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto server = HealthServer::Start("127.0.0.1:0", /*ready=*/true);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                     grpc::InsecureChannelCredentials());
  EXPECT_EQ(testing::HealthStatus(channel), 1);
  EXPECT_EQ(testing::ReflectionListServices(channel), "");
}

TEST(HealthServerTest, BadAddressesNameTheFlag) {
  auto malformed = HealthServer::Start("no-port", true);
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(malformed.status().message().find("--health-listen: 'no-port' is not HOST:PORT"),
            std::string::npos)
      << malformed.status().message();

  auto first = HealthServer::Start("127.0.0.1:0", true);
  ASSERT_TRUE(first.ok());
  auto taken = HealthServer::Start("127.0.0.1:" + std::to_string((*first)->port()), true);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(taken.status().message().find("--health-listen: cannot listen on"), std::string::npos)
      << taken.status().message();
}

}  // namespace
}  // namespace meshrun
