// GrpcStore (see grpc_store.h): each Store operation is one or a few unary calls; waits longer
// than one call's share are split, and UNAVAILABLE (or CANCELLED: a stopping coordinator) is
// retried with backoff while time is left.
#include "rpc/grpc_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <thread>

#include "proto/duration.h"
#include "rpc/backoff.h"
#include "rpc/grpc_status.h"

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Extra deadline on a waiting call beyond the wait asked of the coordinator, so that the
// coordinator's DEADLINE_EXCEEDED (naming the key) arrives before the call's own.
constexpr milliseconds kWaitMargin{5000};

void SetDeadline(grpc::ClientContext* ctx, milliseconds timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

milliseconds Remaining(Clock::time_point deadline) {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

// What a coordinator that is stopping or restarting answers: UNAVAILABLE (it is down, or said
// so), or CANCELLED (a call it cut off while stopping; this side never cancels a store call).
// Both are retried while the budget lasts, so a SIGTERM looks like a kill -9 to the ranks.
bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED;
}

std::string Describe(const GrpcStoreOptions& o, const std::string& key) {
  return "store key '" + key + "' of " + o.job_id + "/" + std::to_string(o.attempt);
}

}  // namespace

StatusOr<std::shared_ptr<GrpcStore>> GrpcStore::Create(const GrpcStoreOptions& options) {
  if (options.address.empty()) {
    return InvalidArgumentError(
        "assignment.store.address: empty (hint: the worker sets it to the coordinator's address)");
  }
  if (options.job_id.empty()) {
    return InvalidArgumentError(
        "assignment.job_id: empty (hint: the worker sets it with the store)");
  }
  if (options.attempt < 1) {
    return InvalidArgumentError("assignment.attempt: " + std::to_string(options.attempt) +
                                " is below 1 (hint: attempts are numbered from 1)");
  }
  std::optional<TlsMaterial> tls;
  if (options.tls.any()) {
    TlsFlagNames names;
    names.cert = "tls.cert";
    names.key = "tls.key";
    names.ca = "tls.ca";
    MESHRUN_ASSIGN_OR_RETURN(TlsMaterial material, LoadTls(options.tls, true, true, names));
    tls = std::move(material);
  }
  grpc::ChannelArguments args;
  // Reconnect quickly after a coordinator restart instead of gRPC's default of up to 120 s.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  ApplyServerName(tls ? &*tls : nullptr, &args);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, ChannelCredentials(tls ? &*tls : nullptr), args);
  return std::make_shared<GrpcStore>(v1::CoordinatorService::NewStub(channel), options);
}

GrpcStore::GrpcStore(std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                     GrpcStoreOptions options)
    : stub_(std::move(stub)), options_(std::move(options)) {
  std::random_device device;
  char text[32];
  std::snprintf(text, sizeof(text), "%08x%08x%08x-", device(), device(), device());
  add_id_prefix_ = text;
}

Status GrpcStore::Set(const std::string& key, const std::string& value) {
  v1::StoreSetRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  request.set_key(key);
  request.set_value(value);
  const Clock::time_point give_up = Clock::now() + options_.unavailable_budget;
  Backoff backoff(milliseconds(50), milliseconds(1000));
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.call_timeout);
    v1::StoreSetResponse response;
    const grpc::Status s = stub_->StoreSet(&ctx, request, &response);
    if (!Transient(s.error_code()) || Clock::now() >= give_up) {
      if (s.ok()) return OkStatus();
      return Status(FromGrpcStatus(s).code(),
                    "StoreSet " + Describe(options_, key) + ": " + s.error_message());
    }
    std::this_thread::sleep_for(std::min(backoff.Next(), Remaining(give_up)));
  }
}

StatusOr<std::pair<bool, std::string>> GrpcStore::GetOnce(const std::string& key, bool wait,
                                                          milliseconds timeout) {
  v1::StoreGetRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  request.set_key(key);
  request.set_wait(wait);
  if (wait) {
    // A zero timeout means "the coordinator's default"; ask for at least 1 ms.
    const int64_t ms = std::max<int64_t>(1, timeout.count());
    SetDuration(milliseconds(ms), request.mutable_timeout());
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx, wait ? timeout + kWaitMargin : options_.call_timeout);
  v1::StoreGetResponse response;
  const grpc::Status s = stub_->StoreGet(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::make_pair(response.found(), response.value());
}

StatusOr<std::string> GrpcStore::Get(const std::string& key, Duration timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  Backoff backoff(milliseconds(50), milliseconds(1000));
  Status last;
  while (true) {
    const milliseconds left = Remaining(deadline);
    const milliseconds ask = std::clamp(left, milliseconds(1), options_.max_wait_per_call);
    StatusOr<std::pair<bool, std::string>> got = GetOnce(key, /*wait=*/true, ask);
    if (got.ok() && got->first) return std::move(got->second);
    last = got.ok() ? NotFoundError("not set") : got.status();
    const StatusCode code = last.code();
    const bool transient = code == StatusCode::kUnavailable || code == StatusCode::kCancelled;
    const bool retry = code == StatusCode::kDeadlineExceeded || transient || got.ok();
    if (!retry) {
      return Status(code, "StoreGet " + Describe(options_, key) + ": " + last.message());
    }
    if (Clock::now() >= deadline) break;
    if (transient || got.ok()) {
      std::this_thread::sleep_for(std::min(backoff.Next(), Remaining(deadline)));
    }
  }
  return DeadlineExceededError("StoreGet " + Describe(options_, key) + ": not set within " +
                               std::to_string(timeout.count()) + " ms (last: " + last.ToString() +
                               ") (hint: a peer rank never published it; check the other ranks' "
                               "logs)");
}

StatusOr<int64_t> GrpcStore::Add(const std::string& key, int64_t delta) {
  v1::StoreAddRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  request.set_key(key);
  request.set_delta(delta);
  // One id for every retry of this addition: a retry whose first try was applied (the reply
  // lost to a coordinator kill or a broken connection, which also reads UNAVAILABLE) is answered
  // the first result instead of adding again.
  request.set_request_id(add_id_prefix_ + std::to_string(add_sequence_.fetch_add(1)));
  const Clock::time_point give_up = Clock::now() + options_.unavailable_budget;
  Backoff backoff(milliseconds(50), milliseconds(1000));
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.call_timeout);
    v1::StoreAddResponse response;
    const grpc::Status s = stub_->StoreAdd(&ctx, request, &response);
    if (!Transient(s.error_code()) || Clock::now() >= give_up) {
      if (s.ok()) return response.value();
      return Status(FromGrpcStatus(s).code(),
                    "StoreAdd " + Describe(options_, key) + ": " + s.error_message());
    }
    std::this_thread::sleep_for(std::min(backoff.Next(), Remaining(give_up)));
  }
}

Status GrpcStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  for (const std::string& key : keys) {
    StatusOr<std::string> value = Get(key, std::max(milliseconds(1), Remaining(deadline)));
    if (!value.ok()) return value.status();
  }
  return OkStatus();
}

StatusOr<bool> GrpcStore::Check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    StatusOr<std::pair<bool, std::string>> got = GetOnce(key, /*wait=*/false, milliseconds(0));
    if (!got.ok()) {
      return Status(got.status().code(),
                    "StoreGet " + Describe(options_, key) + ": " + got.status().message());
    }
    if (!got->first) return false;
  }
  return true;
}

}  // namespace meshrun
