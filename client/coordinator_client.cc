// CoordinatorClient and the presentation helpers (see coordinator_client.h).
#include "client/coordinator_client.h"

#include <google/protobuf/util/time_util.h>
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "common/tls.h"
#include "proto/mesh_axis.h"
#include "rpc/backoff.h"
#include "rpc/grpc_status.h"

namespace meshrun::client {
namespace {

using json = nlohmann::ordered_json;
using std::chrono::milliseconds;

}  // namespace

namespace {

// HOST:PORT, [IPV6]:PORT, or a gRPC URI (dns:///…, unix:…, ipv4:…), as dialled.
Status CheckAddress(const std::string& address, const char* where) {
  if (address.find(":/") != std::string::npos || address.rfind("unix:", 0) == 0 ||
      address.rfind("ipv4:", 0) == 0 || address.rfind("ipv6:", 0) == 0) {
    return OkStatus();
  }
  const size_t colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  const std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  bool digits = !port.empty() && port.size() <= 5;
  for (char ch : port) digits &= ch >= '0' && ch <= '9';
  if (host.empty() || !digits || std::stoi(port) == 0 || std::stoi(port) > 65535) {
    return InvalidArgumentError(std::string(where) + ": '" + address +
                                "' is not HOST:PORT (hint: e.g. --coordinator 127.0.0.1:50051; "
                                "`meshrun up` prints its address)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::string> ResolveCoordinatorAddress(const std::string& flag) {
  if (!flag.empty()) {
    MESHRUN_RETURN_IF_ERROR(CheckAddress(flag, "--coordinator"));
    return flag;
  }
  const char* env = std::getenv(kEnvCoordinator);
  if (env != nullptr && *env != '\0') {
    MESHRUN_RETURN_IF_ERROR(CheckAddress(env, kEnvCoordinator));
    return std::string(env);
  }
  return InvalidArgumentError(
      "--coordinator: no coordinator address (hint: pass --coordinator HOST:PORT or export "
      "MESHRUN_COORDINATOR=HOST:PORT; `meshrun up` starts a local cluster and prints it)");
}

ConnectionFlags& GlobalConnectionFlags() {
  static ConnectionFlags flags;
  return flags;
}

CLI::Option* AddCoordinatorOption(CLI::App* cmd, std::string* address) {
  ConnectionFlags& flags = GlobalConnectionFlags();
  cmd->add_option("--tls-ca", flags.tls_ca,
                  "PEM CA of the coordinator's certificate: connect with TLS (default: "
                  "$MESHRUN_TLS_CA)");
  cmd->add_option("--tls-server-name", flags.tls_server_name,
                  "name expected in the coordinator's certificate (default: the host dialled)");
  cmd->add_option("--token-file", flags.token_file,
                  "file whose first token is sent as the bearer token (default: $MESHRUN_TOKEN, "
                  "else $MESHRUN_TOKEN_FILE)");
  cmd->add_flag("--insecure", flags.insecure,
                "allow plaintext to a non-loopback coordinator (also MESHRUN_INSECURE=1)");
  return cmd->add_option("--coordinator", *address,
                         "HOST:PORT of meshrun-coordinator (default: $MESHRUN_COORDINATOR)");
}

StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    const std::string& address_flag) {
  return Connect(address_flag, GlobalConnectionFlags());
}

StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    const std::string& address_flag, const ConnectionFlags& flags) {
  MESHRUN_ASSIGN_OR_RETURN(std::string address, ResolveCoordinatorAddress(address_flag));
  auto env = [&flags](const char* name) {
    const char* value = flags.from_environment ? std::getenv(name) : nullptr;
    return std::string(value != nullptr ? value : "");
  };
  // TLS: a CA to verify the coordinator with.
  TlsFiles files;
  files.ca = !flags.tls_ca.empty() ? flags.tls_ca : env(kEnvTlsCa);
  files.server_name =
      !flags.tls_server_name.empty() ? flags.tls_server_name : env(kEnvTlsServerName);
  std::optional<TlsMaterial> tls;
  if (!files.ca.empty()) {
    TlsFlagNames names;
    names.ca = flags.tls_ca.empty() ? kEnvTlsCa : "--tls-ca";
    MESHRUN_ASSIGN_OR_RETURN(TlsMaterial material, LoadTls(files, false, true, names));
    tls = std::move(material);
  } else if (!files.server_name.empty()) {
    return InvalidArgumentError(
        "--tls-server-name: needs TLS (hint: pass --tls-ca FILE or export MESHRUN_TLS_CA=FILE)");
  }
  const bool insecure = flags.insecure || env("MESHRUN_INSECURE") == "1";
  MESHRUN_RETURN_IF_ERROR(CheckPlaintextTarget("--coordinator", address, tls.has_value(), insecure,
                                               "--tls-ca FILE (or export MESHRUN_TLS_CA=FILE)"));
  // The bearer token: --token-file, else MESHRUN_TOKEN, else MESHRUN_TOKEN_FILE.
  std::string token;
  if (!flags.token_file.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                             ReadTokenFile("--token-file", flags.token_file));
    token = tokens.front();
  } else if (!env(kEnvToken).empty()) {
    token = env(kEnvToken);
  } else if (!env(kEnvTokenFile).empty()) {
    MESHRUN_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                             ReadTokenFile(kEnvTokenFile, env(kEnvTokenFile)));
    token = tokens.front();
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Logs and job lists can be large.
  args.SetMaxReceiveMessageSize(64 << 20);
  ApplyServerName(tls ? &*tls : nullptr, &args);
  auto channel =
      grpc::CreateCustomChannel(address, ChannelCredentials(tls ? &*tls : nullptr), args);
  return std::make_unique<CoordinatorClient>(v1::CoordinatorService::NewStub(channel), address,
                                             token, tls.has_value());
}

CoordinatorClient::CoordinatorClient(std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                                     std::string address, std::string token, bool tls)
    : stub_(std::move(stub)), address_(std::move(address)), token_(std::move(token)), tls_(tls) {}

void CoordinatorClient::Prepare(grpc::ClientContext* ctx, bool deadline) const {
  if (deadline) ctx->set_deadline(std::chrono::system_clock::now() + call_timeout_);
  if (!token_.empty()) ctx->AddMetadata(kAuthorizationHeader, "Bearer " + token_);
}

Status CoordinatorClient::Convert(const grpc::Status& status) const {
  if (status.ok()) return OkStatus();
  const std::string message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (tls_ && (message.find("andshake") != std::string::npos ||
                   message.find("SSL") != std::string::npos)) {
        return UnavailableError(
            "--tls-ca: the TLS handshake with the coordinator at " + address_ +
            " failed: " + message +
            " (hint: --tls-ca or MESHRUN_TLS_CA must be the CA that signed the coordinator's "
            "certificate, and that certificate must name the host dialled, or pass "
            "--tls-server-name NAME)");
      }
      if (!tls_ && message.find("Socket closed") != std::string::npos) {
        return UnavailableError(
            "--coordinator: the coordinator at " + address_ + " closed the connection: " + message +
            " (hint: if it serves TLS, pass --tls-ca FILE or export MESHRUN_TLS_CA=FILE)");
      }
      return UnavailableError("--coordinator: cannot reach the coordinator at " + address_ + ": " +
                              (message.empty() ? "unavailable" : message) +
                              " (hint: check that meshrun-coordinator runs there, or start a "
                              "local cluster with `meshrun up`)");
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // gRPC refuses an oversized message before the coordinator sees it, in its own words.
      if (message.find("larger than max") != std::string::npos) {
        return ResourceExhaustedError(
            "request: the coordinator at " + address_ + " refused it as too large (" + message +
            ") (hint: keep specs small, data is named by path; the operator raises the limit "
            "with meshrun-coordinator --max-request-bytes)");
      }
      return FromGrpcStatus(status);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return DeadlineExceededError(
          "--coordinator: the coordinator at " + address_ + " did not answer in time" +
          (message.empty() ? "" : ": " + message) + " (hint: it may be overloaded; retry)");
    default:
      if (message.empty()) {
        return Status(static_cast<StatusCode>(status.error_code()),
                      std::string("coordinator: ") +
                          StatusCodeName(static_cast<StatusCode>(status.error_code())));
      }
      return FromGrpcStatus(status);
  }
}

StatusOr<std::string> CoordinatorClient::SubmitJob(const v1::JobSpec& spec,
                                                   const std::string& request_id,
                                                   milliseconds retry_for) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_request_id(request_id);
  MESHRUN_ASSIGN_OR_RETURN(v1::SubmitJobResponse response, SubmitJob(request, retry_for));
  return response.job_id();
}

StatusOr<v1::SubmitJobResponse> CoordinatorClient::SubmitJob(const v1::SubmitJobRequest& request,
                                                             milliseconds retry_for) {
  const auto give_up = std::chrono::steady_clock::now() + retry_for;
  Backoff backoff(milliseconds(100), milliseconds(1000));
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::SubmitJobResponse response;
    const grpc::Status s = stub_->SubmitJob(&ctx, request, &response);
    if (s.ok()) return response;
    // The request_id makes a retry safe: the coordinator answers the first job's id.
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::steady_clock::now() >= give_up) {
      return Convert(s);
    }
    std::this_thread::sleep_for(backoff.Next());
  }
}

StatusOr<v1::Job> CoordinatorClient::GetJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  const grpc::Status s = stub_->GetJob(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response.job();
}

StatusOr<std::vector<v1::Job>> CoordinatorClient::ListJobs() {
  std::vector<v1::Job> jobs;
  std::string token;
  for (int page = 0; page < 1000; ++page) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ListJobsRequest request;
    request.set_page_token(token);
    v1::ListJobsResponse response;
    const grpc::Status s = stub_->ListJobs(&ctx, request, &response);
    if (!s.ok()) return Convert(s);
    for (v1::Job& job : *response.mutable_jobs()) jobs.push_back(std::move(job));
    token = response.next_page_token();
    if (token.empty()) break;
  }
  return jobs;
}

StatusOr<v1::Job> CoordinatorClient::CancelJob(const std::string& job_id,
                                               const std::string& reason) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::CancelJobResponse response;
  const grpc::Status s = stub_->CancelJob(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response.job();
}

StatusOr<std::vector<v1::WorkerInfo>> CoordinatorClient::ListWorkers() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::ListWorkersRequest request;
  v1::ListWorkersResponse response;
  const grpc::Status s = stub_->ListWorkers(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return std::vector<v1::WorkerInfo>(response.workers().begin(), response.workers().end());
}

StatusOr<v1::DrainWorkerResponse> CoordinatorClient::DrainWorker(const std::string& name,
                                                                 bool drain) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::DrainWorkerRequest request;
  request.set_name(name);
  request.set_drain(drain);
  v1::DrainWorkerResponse response;
  const grpc::Status s = stub_->DrainWorker(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response;
}

StatusOr<v1::GetJobResponse> CoordinatorClient::GetJob(const v1::GetJobRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::GetJobResponse response;
  const grpc::Status s = stub_->GetJob(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response;
}

StatusOr<v1::ListRanksResponse> CoordinatorClient::ListRanks(const v1::ListRanksRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::ListRanksResponse response;
  const grpc::Status s = stub_->ListRanks(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response;
}

StatusOr<v1::ListWorkersResponse> CoordinatorClient::ListWorkers(
    const v1::ListWorkersRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::ListWorkersResponse response;
  const grpc::Status s = stub_->ListWorkers(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response;
}

StatusOr<v1::GetJobLogsResponse> CoordinatorClient::GetJobLogs(const std::string& job_id,
                                                               std::optional<int> rank) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::GetJobLogsRequest request;
  request.set_job_id(job_id);
  if (rank) request.set_rank(*rank);
  v1::GetJobLogsResponse response;
  const grpc::Status s = stub_->GetJobLogs(&ctx, request, &response);
  if (!s.ok()) return Convert(s);
  return response;
}

Status CoordinatorClient::WatchJob(const v1::WatchJobRequest& request,
                                   const std::function<bool(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext ctx;
  Prepare(&ctx, /*deadline=*/false);
  auto reader = stub_->WatchJob(&ctx, request);
  v1::WatchJobResponse response;
  bool stopped_early = false;
  while (reader->Read(&response)) {
    if (!on_event(response.event())) {
      stopped_early = true;
      ctx.TryCancel();
      break;
    }
  }
  if (stopped_early) {
    while (reader->Read(&response)) {
    }
    (void)reader->Finish();
    return OkStatus();
  }
  return Convert(reader->Finish());
}

// ---- Presentation -------------------------------------------------------------------------

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "";
  google::protobuf::Timestamp whole = t;
  whole.set_nanos(0);
  return google::protobuf::util::TimeUtil::ToString(whole);
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const long long s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof(text), "%llds", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  }
  return text;
}

json JobListEntryJson(const v1::Job& job) {
  return json{{"job_id", job.job_id()},
              {"name", job.name()},
              {"state", JobStateName(job.state())},
              {"step", job.step()},
              {"steps", job.steps()},
              {"submitted_at", FormatTime(job.submitted_at())},
              {"attempt", job.attempt()},
              {"restarts", job.restarts()},
              {"world_size", job.world_size()},
              {"message", job.message()}};
}

std::vector<std::string> RankAxisHeaders(bool pipelined) {
  std::vector<std::string> out;
  for (MeshAxis axis : kMeshOwnAxes) {
    if (!AxisShown(axis, pipelined)) continue;
    std::string name = MeshAxisName(axis);
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    out.push_back(std::move(name));
  }
  return out;
}

std::vector<std::string> RankAxisCells(const v1::RankInfo& r, bool pipelined) {
  std::vector<std::string> out;
  for (const AxisPlace& a : RankAxes(r)) {
    if (AxisShown(a.axis, pipelined)) out.push_back(std::to_string(a.index));
  }
  return out;
}

std::string RankAxesText(const v1::RankInfo& r) {
  const std::vector<AxisPlace> places = RankAxes(r);
  const bool pipelined = RankPipelined(places);
  std::string out;
  for (const AxisPlace& a : places) {
    if (!AxisShown(a.axis, pipelined)) continue;
    if (!out.empty()) out += ' ';
    out += std::string(MeshAxisName(a.axis)) + "=" + std::to_string(a.index);
  }
  return out;
}

json RankJson(const v1::RankInfo& r) {
  // Every own axis, by name (the list's order: pp first).
  json coords = json::object();
  for (const AxisPlace& a : RankAxes(r)) coords[MeshAxisName(a.axis)] = a.index;
  return json{{"rank", r.rank()},
              {"worker", r.worker_name().empty() ? r.worker_id() : r.worker_name()},
              {"coords", std::move(coords)},
              {"state", RankStateName(r.state())},
              {"local_rank", r.local_rank()},
              {"pid", r.pid()},
              {"exit_code", r.exit_code()},
              {"signal", r.signal()},
              {"error", r.error()}};
}

json JobStatusJson(const v1::Job& job) {
  json ranks = json::array();
  for (const v1::RankInfo& r : job.ranks()) ranks.push_back(RankJson(r));
  return json{{"job_id", job.job_id()},
              {"name", job.name()},
              {"state", JobStateName(job.state())},
              {"attempt", job.attempt()},
              {"restarts", job.restarts()},
              {"step", job.step()},
              {"steps", job.steps()},
              {"loss", job.loss()},
              {"tokens_per_second", job.tokens_per_second()},
              {"mfu", job.mfu()},
              {"world_size", job.world_size()},
              {"message", job.message()},
              {"submitted_at", FormatTime(job.submitted_at())},
              {"started_at", FormatTime(job.started_at())},
              {"finished_at", FormatTime(job.finished_at())},
              {"last_checkpoint", job.last_checkpoint()},
              {"ranks", ranks}};
}

json JobMeshesJson(const v1::Job& job) {
  json out = json::array();
  for (const v1::JobMesh& m : job.meshes()) {
    out.push_back({{"attempt", m.attempt()},
                   {"mesh",
                    {{"dp_replicate", m.mesh().dp_replicate_size()},
                     {"dp_shard", m.mesh().dp_shard_size()},
                     {"cp", m.mesh().cp_size()},
                     {"tp", m.mesh().tp_size()}}},
                   {"world_size", m.world_size()},
                   {"from_step", m.from_step()},
                   {"cause", m.cause()},
                   {"started_at", FormatTime(m.started_at())},
                   {"steps_lost", m.steps_lost()},
                   {"seconds_without_training", m.seconds_without_training()}});
  }
  return out;
}

json WorkerJson(const v1::WorkerInfo& w) {
  json out{{"name", w.name()},
           {"state", WorkerStateName(w.state())},
           {"slots", w.slots()},
           {"device", w.device()},
           {"address", w.address()},
           {"worker_id", w.worker_id()},
           {"slots_in_use", w.slots_in_use()},
           {"metrics_address", w.metrics_address()},
           {"last_heartbeat_at", FormatTime(w.last_heartbeat_at())}};
  if (w.drained()) out["drained"] = true;  // `meshrun workers drain NAME`
  return out;
}

void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& cells) {
  // Cells hold what the coordinator sent (names, messages, paths, addresses): each escaped,
  // tabs too, so that a cell stays one cell of one line.
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : cells) {
    std::vector<std::string>& escaped = rows.emplace_back();
    for (const std::string& cell : row) escaped.push_back(EscapeText(cell, /*keep_tab=*/false));
  }
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << '\n';
  }
  out.flush();
}

}  // namespace meshrun::client
