// gRPC <-> meshrun::Status. Both use abseil's canonical code numbers, so the codes convert by a
// cast; the messages pass unchanged. Header-only, the one copy shared by
// the coordinator's adapter, the worker, the rank and the client.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "common/status.h"

namespace meshrun {

inline Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return OkStatus();
  return Status(static_cast<StatusCode>(status.error_code()), status.error_message());
}

inline grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

}  // namespace meshrun
