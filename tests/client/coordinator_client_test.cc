// How the client picks its connection security from flags and the environment
// (client/coordinator_client.h): the variables apply to commands that name a coordinator, and
// not to the loopback coordinator `meshrun up`/`demo` start themselves.
#include "client/coordinator_client.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace meshrun::client {
namespace {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(CoordinatorClient, ExportedTlsCaApplies) {
  ScopedEnv ca("MESHRUN_TLS_CA", "/nonexistent/ca.pem");
  auto client = CoordinatorClient::Connect("127.0.0.1:1", ConnectionFlags{});
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("MESHRUN_TLS_CA"), std::string::npos)
      << client.status().ToString();
}

TEST(CoordinatorClient, LocalClusterConnectionIgnoresTheEnvironment) {
  ScopedEnv ca("MESHRUN_TLS_CA", "/nonexistent/ca.pem");
  ScopedEnv token_file("MESHRUN_TOKEN_FILE", "/nonexistent/tokens");
  auto client = CoordinatorClient::Connect("127.0.0.1:1", LocalConnection());
  EXPECT_TRUE(client.ok()) << client.status().ToString();
}

TEST(CoordinatorClient, PlaintextToANonLoopbackAddressIsRefused) {
  auto client = CoordinatorClient::Connect("10.1.2.3:7070", LocalConnection());
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("--tls-ca"), std::string::npos)
      << client.status().ToString();
}

TEST(CoordinatorClient, AnAddressWithoutAPortIsInvalidInputNotATlsError) {
  for (const std::string bad : {"notaport", "host:", ":50051", "host:abc", "host:70000"}) {
    auto address = ResolveCoordinatorAddress(bad);
    ASSERT_FALSE(address.ok()) << bad;
    EXPECT_EQ(address.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(address.status().message().rfind("--coordinator: '" + bad + "' is not HOST:PORT", 0),
              0u)
        << address.status().ToString();
  }
  for (const std::string good :
       {"127.0.0.1:50051", "[::1]:7070", "dns:///coord:50051", "coordinator.svc:443"}) {
    EXPECT_TRUE(ResolveCoordinatorAddress(good).ok()) << good;
  }
}

}  // namespace
}  // namespace meshrun::client
