// HealthServer: gRPC's default health service on a server of its own, with the process-wide
// server plugins (server reflection, registered by the coordinator) removed from it.
#include "common/health_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>

#include <chrono>

namespace meshrun {
namespace {

// Drops every ServerBuilderPlugin (reflection registers itself for all servers of the
// process), so the health port serves grpc.health.v1.Health and nothing else.
class NoPluginsOption : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

}  // namespace

StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& listen, bool ready) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return InvalidArgumentError("--health-listen: '" + listen +
                                "' is not HOST:PORT (hint: e.g. 0.0.0.0:8081, or port 0)");
  }
  // Process-wide, but harmless: every meshrun server wants the standard health service.
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<HealthServer> s(new HealthServer());
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<NoPluginsOption>());
  // A port another process holds is an error, not a silently shared SO_REUSEPORT socket.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  s->unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
  builder.RegisterCallbackGenericService(s->unimplemented_.get());
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0 || s->server_->GetHealthCheckService() == nullptr) {
    return FailedPreconditionError("--health-listen: cannot listen on '" + listen +
                                   "' (hint: the port may be in use; pick another)");
  }
  auto* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(kLivenessService, true);
  health->SetServingStatus("", ready);
  return s;
}

void HealthServer::SetReady(bool ready) {
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ == nullptr || shut_down_) return;
  // After Shutdown the default service ignores changes: NOT_SERVING stays.
  server_->GetHealthCheckService()->SetServingStatus("", ready);
}

void HealthServer::Shutdown(int drain_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (server_ == nullptr || shut_down_) return;
    shut_down_ = true;
    server_->GetHealthCheckService()->Shutdown();
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(drain_ms));
  server_->Wait();
}

HealthServer::~HealthServer() {
  Shutdown();
}

}  // namespace meshrun
