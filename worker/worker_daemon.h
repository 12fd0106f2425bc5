// WorkerDaemon: what `meshrun-worker` is, minus flag parsing. Turns the coordinator's
// RankAssignments into rank processes (`meshrun __rank` under the RankSupervisor, told their
// RankStart on stdin) and their lifecycle, typed reports and output into session reports
// (SessionClient); writes each attempt's spec.yaml under --work-dir for operators.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/path_policy.h"
#include "common/status.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "supervisor/rank_supervisor.h"
#include "worker/gpu_inventory.h"
#include "worker/rank_protocol.h"
#include "worker/session_client.h"

namespace meshrun {

class WorkerMetrics;

struct WorkerConfig {
  std::string name;
  int slots = 1;
  std::string device = "cpu";
  std::string address = "127.0.0.1";  // where peers reach this worker's ranks (MESHRUN_HOST)
  std::string metrics_address;        // advertised in the registration
  std::string work_dir;               // <work_dir>/<job>/<attempt>/spec.yaml
  std::string meshrun_binary;         // absolute path of `meshrun`
  int cores = 1;                      // CPU cores shared by this worker's ranks
  // SIGTERM → SIGKILL grace when a StopOrder names none, and on shutdown.
  std::chrono::milliseconds default_grace{5000};
  SessionOptions session;  // registration is filled from the fields above
  // --data-root, --checkpoint-root: every path an assignment names is checked (and resolved)
  // before its rank starts; default unconfined (docs/security.md "Confined paths").
  PathPolicy paths;
  // The TLS files ranks reach the coordinator's store with (absolute; all empty: plaintext),
  // passed in their RankStart.
  TlsFiles rank_tls;
  // --rank-env NAME (repeatable): variables of the worker's environment passed on to its
  // ranks beyond the allow-list of IsInheritedByRanks (rank_protocol.h).
  std::vector<std::string> rank_env_pass;
  // Bytes of host memory the ranks of this worker share (--memory-bytes; default the
  // machine's physical memory): a cpu rank whose estimated peak (common/memory_estimate.h)
  // times its local ranks does not fit is refused before it starts. 0: no check.
  int64_t memory_bytes = 0;
  // --device cuda: the GPUs it offers (gpu_inventory.h; one slot each by default). Each rank
  // gets one of them (its local rank's when free) through CUDA_VISIBLE_DEVICES, with
  // NCCL_SOCKET_IFNAME = nccl_ifname (the interface of --address; empty: not set) and
  // MESHRUN_PEAK_TFLOPS = peak_tflops (--peak-tflops; 0: not set).
  std::vector<GpuDevice> gpus;
  std::string nccl_ifname;
  double peak_tflops = 0;
};

// Owns the supervisor and the session. Thread-safe: the session calls it from its threads, the
// supervisor from its own; `mu_` guards the table of active ranks.
class WorkerDaemon : public SessionHandler {
 public:
  WorkerDaemon(WorkerConfig config, std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
               WorkerMetrics* metrics);
  ~WorkerDaemon() override;

  void Start();
  // Stops every rank (SIGTERM, SIGKILL after `grace`), reports their exits while the session
  // lasts (bounded), then closes the session. Idempotent.
  void Shutdown(std::chrono::milliseconds grace);
  // Non-OK once the coordinator refused the registration for good.
  Status fatal() const;

  SessionClient& session() { return *session_; }
  size_t active_ranks() const;

  // SessionHandler.
  void OnAssign(const v1::RankAssignment& assignment) override;
  void OnStop(const v1::StopOrder& order) override;
  std::vector<v1::RunningRank> RunningRanks() override;
  int FreeSlots() override;
  void OnConnected(bool connected) override;
  void OnFatal(const Status& status) override;

 private:
  struct Active {
    v1::MeshCoords coords;
    int pid = 0;
    int gpu = -1;  // index into config_.gpus of a cuda rank
  };
  struct Prepared {
    std::string dir;  // <work_dir>/<job>/<attempt>, the rank's working folder
    int threads = 1;  // the rank's CPU threads (RankStart.threads)
  };
  // Checks the assignment against this worker's limits (paths, threads, memory) and creates the
  // rank's working folder. The spec is read, never re-encoded: the rank gets the coordinator's
  // message unchanged, and this worker's facts (threads, roots) beside it in RankStart
  // (decision 0048). Not validated here either: the coordinator and the rank validate it.
  StatusOr<Prepared> PrepareAttempt(const v1::RankAssignment& a);
  // Reports an assignment that never became a process (RankExited, exit_code −1).
  void ReportNotStarted(const v1::RankAssignment& a, const std::string& error);
  void OnRankStarted(const RankKey& key, pid_t pid);
  void OnRankLine(const RankKey& key, bool is_stderr, std::string line);
  void OnRankReport(const RankKey& key, const std::string& frame);
  void OnRankExited(const RankKey& key, const RankExit& exit);
  void UpdateSlotMetrics();  // requires mu_

  WorkerConfig config_;
  WorkerMetrics* metrics_;
  mutable std::mutex mu_;
  std::map<RankKey, Active> active_;  // guarded by mu_
  Status fatal_;                      // guarded by mu_
  bool shut_down_ = false;            // guarded by mu_
  std::unique_ptr<SessionClient> session_;
  std::unique_ptr<RankSupervisor> supervisor_;
};

}  // namespace meshrun
