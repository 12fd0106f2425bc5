// An in-process coordinator serving mutual TLS with tokens, as the adversary tests attack it:
// its config from TestCerts' "coordinator" pair, channels that present a worker's certificate
// (or none, as a client), and a fake worker registered with its session open.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/tls.h"
#include "coordinator/server.h"
#include "tests/fakes/fake_grpc_worker.h"
#include "tests/integration/test_certs.h"

namespace meshrun::testing {

// Listens on a loopback port of the kernel's choice; heartbeats time out after 30 s.
inline coordinator::CoordinatorConfig MutualTlsConfig(const TestCerts& certs,
                                                      const std::string& state_dir,
                                                      const std::string& token_file) {
  coordinator::CoordinatorConfig config;
  config.listen = "127.0.0.1:0";
  config.state_dir = state_dir;
  config.heartbeat_timeout = std::chrono::seconds(30);
  config.tls.cert = certs.cert("coordinator");
  config.tls.key = certs.key("coordinator");
  config.tls.ca = certs.ca();
  config.token_file = token_file;
  return config;
}

// A channel to `address` that trusts the CA and presents `client`'s certificate ("" for none).
inline std::shared_ptr<grpc::Channel> MutualTlsChannel(const TestCerts& certs,
                                                       const std::string& address,
                                                       const std::string& client) {
  TlsFiles files;
  files.ca = certs.ca();
  if (!client.empty()) {
    files.cert = certs.cert(client);
    files.key = certs.key(client);
  }
  StatusOr<TlsMaterial> material = LoadTls(files, false, true);
  EXPECT_TRUE(material.ok()) << material.status().ToString();
  return grpc::CreateChannel(address, ChannelCredentials(&*material));
}

// A fake worker registered over `channel` with its session open and accepted.
inline std::unique_ptr<FakeGrpcWorker> RegisteredWorker(std::shared_ptr<grpc::Channel> channel,
                                                        const std::string& name, int slots) {
  auto w = std::make_unique<FakeGrpcWorker>(std::move(channel), name, slots);
  grpc::Status s = w->Register();
  EXPECT_TRUE(s.ok()) << s.error_message();
  w->Open();
  EXPECT_TRUE(w->WaitAccepted());
  return w;
}

}  // namespace meshrun::testing
