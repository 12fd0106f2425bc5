// The client's connection to meshrun-coordinator: finds its address (--coordinator, else
// MESHRUN_COORDINATOR), wraps the user-facing RPCs of CoordinatorService with deadlines and
// readable errors, and turns jobs and workers into the JSON shapes and tables of
// docs/cli.md.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/escape.h"
#include "common/status.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "proto/state_names.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace meshrun::client {

inline constexpr char kEnvCoordinator[] = "MESHRUN_COORDINATOR";

// --coordinator when given, else $MESHRUN_COORDINATOR; INVALID_ARGUMENT with a hint otherwise.
StatusOr<std::string> ResolveCoordinatorAddress(const std::string& flag);

// How the client secures its connection (docs/security.md). Flags of every command that takes
// --coordinator; each falls back to its environment variable.
struct ConnectionFlags {
  std::string tls_ca;           // --tls-ca, else $MESHRUN_TLS_CA: TLS, verifying the coordinator
  std::string tls_server_name;  // --tls-server-name, else $MESHRUN_TLS_SERVER_NAME
  std::string token_file;       // --token-file (first token), else $MESHRUN_TOKEN,
                                // else $MESHRUN_TOKEN_FILE
  bool insecure = false;        // --insecure, or MESHRUN_INSECURE=1: plaintext to a non-loopback
                                // coordinator
  // False for the plaintext loopback coordinator `meshrun up`/`demo` start themselves: the
  // MESHRUN_TLS_*/MESHRUN_TOKEN* variables a user exported for a real cluster do not apply.
  bool from_environment = true;
};
// What `meshrun up` and `demo` connect to their own loopback coordinator with: plaintext, no
// token, whatever the environment says.
inline ConnectionFlags LocalConnection() {
  ConnectionFlags flags;
  flags.from_environment = false;
  return flags;
}
// The flags the command line filled (one command runs per process).
ConnectionFlags& GlobalConnectionFlags();

// Adds `--coordinator HOST:PORT` to a command, and the ConnectionFlags options (bound to
// GlobalConnectionFlags()).
CLI::Option* AddCoordinatorOption(CLI::App* cmd, std::string* address);

// One channel to the coordinator. Unary calls have a deadline (call_timeout) and fail fast when
// nothing listens. Errors keep the coordinator's message (it names the field and a fix); a
// coordinator that cannot be reached becomes
// `--coordinator: cannot reach the coordinator at HOST:PORT: … (hint: …)`. Thread-safe.
class CoordinatorClient {
 public:
  // With GlobalConnectionFlags() and their environment variables: TLS when a CA is given,
  // plaintext only to a loopback address or with --insecure (INVALID_ARGUMENT otherwise), and
  // the bearer token on every call when one is given.
  static StatusOr<std::unique_ptr<CoordinatorClient>> Connect(const std::string& address_flag);
  static StatusOr<std::unique_ptr<CoordinatorClient>> Connect(const std::string& address_flag,
                                                              const ConnectionFlags& flags);
  // `token` empty: calls carry no authorization.
  CoordinatorClient(std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                    std::string address, std::string token = "", bool tls = false);

  // Retries UNAVAILABLE with the same request_id for up to `retry_for`.
  StatusOr<std::string> SubmitJob(const v1::JobSpec& spec, const std::string& request_id,
                                  std::chrono::milliseconds retry_for = std::chrono::seconds(10));
  // The whole request (wait_for_capacity, dry_run) and the whole response (placement).
  StatusOr<v1::SubmitJobResponse> SubmitJob(
      const v1::SubmitJobRequest& request,
      std::chrono::milliseconds retry_for = std::chrono::seconds(10));
  StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Every page, newest first.
  StatusOr<std::vector<v1::Job>> ListJobs();
  StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason = "");
  StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // GetJob with the request as given (summary: no ranks, their counts instead).
  StatusOr<v1::GetJobResponse> GetJob(const v1::GetJobRequest& request);
  // One page of ranks, of workers.
  StatusOr<v1::ListRanksResponse> ListRanks(const v1::ListRanksRequest& request);
  StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request);
  // `meshrun workers drain/undrain NAME` (DrainWorker).
  StatusOr<v1::DrainWorkerResponse> DrainWorker(const std::string& name, bool drain);
  StatusOr<v1::GetJobLogsResponse> GetJobLogs(const std::string& job_id, std::optional<int> rank);

  // Streams a job's events to on_event until the stream ends (OK: after the terminal state
  // event, or the replay with replay_only) or on_event returns false (OK too). No deadline.
  Status WatchJob(const v1::WatchJobRequest& request,
                  const std::function<bool(const v1::JobEvent&)>& on_event);

  const std::string& address() const { return address_; }

 private:
  Status Convert(const grpc::Status& status) const;
  // Deadline (when `deadline`) and the bearer token of one call.
  void Prepare(grpc::ClientContext* ctx, bool deadline = true) const;

  std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  std::string address_;
  std::string token_;
  bool tls_ = false;
  std::chrono::milliseconds call_timeout_{10000};
};

// ---- Presentation -------------------------------------------------------------------------

// "RUNNING", "READY", "SUCCEEDED" (enum names without their prefix): proto/state_names.h.
using meshrun::JobStateName;
using meshrun::RankStateName;
using meshrun::WorkerStateName;
bool IsTerminal(v1::JobState state);
// RFC 3339 ("2026-01-02T03:04:05Z"), "" for an unset timestamp.
std::string FormatTime(const google::protobuf::Timestamp& t);
// "12s", "3m04s", "1h02m" for a number of seconds.
std::string FormatDuration(double seconds);

// The JSON shapes of docs/cli.md (more fields than listed are welcome).
nlohmann::ordered_json JobListEntryJson(const v1::Job& job);  // jobs -o json, one entry
nlohmann::ordered_json JobStatusJson(const v1::Job& job);     // status -o json
// An elastic job's meshes (status -o json's "meshes"): attempt, mesh, world_size, from_step,
// cause, started_at, steps_lost, seconds_without_training.
nlohmann::ordered_json JobMeshesJson(const v1::Job& job);
nlohmann::ordered_json WorkerJson(const v1::WorkerInfo& w);  // workers -o json, one entry
nlohmann::ordered_json RankJson(const v1::RankInfo& r);      // status -o json, one rank

// A table of ranks' coordinates, from the mesh's list of axes (proto/mesh_axis.h): the headers
// ("PP" on a pipelined mesh, "DP_REPLICATE", …) and one rank's cells, outermost axis first.
std::vector<std::string> RankAxisHeaders(bool pipelined);
std::vector<std::string> RankAxisCells(const v1::RankInfo& r, bool pipelined);
// "dp_replicate=0 dp_shard=1 cp=0 tp=0" (pp= first on a pipelined mesh), for a line about a rank.
std::string RankAxesText(const v1::RankInfo& r);

// A table for people: a header row and left-aligned columns two spaces apart; every cell
// escaped with EscapeText (common/escape.h).
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

// `value` as one line of JSON for stdout: invalid UTF-8 replaced (U+FFFD), and DEL, the C1
// and bidirectional controls written as \uNNNN (EscapeJsonText), so that JSON printed on a
// terminal is as harmless as the tables.
template <typename Json>
std::string DumpJson(const Json& value) {
  return EscapeJsonText(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

}  // namespace meshrun::client
