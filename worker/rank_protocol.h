// The worker <-> rank protocol, as pure functions: how a RankAssignment becomes the process and
// the RankStart of `meshrun __rank` (proto/meshrun/v1/rank.proto), and how the rank's typed
// reports become session messages (RankStep -> MetricsSample). No I/O; see
// docs/control-plane.md.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/tls.h"
#include "meshrun/v1/rank.pb.h"
#include "meshrun/v1/worker.pb.h"
#include "supervisor/line_splitter.h"

namespace meshrun {

// What a worker knows about itself when it starts a rank.
struct RankLaunchConfig {
  std::string meshrun_binary;  // absolute path of `meshrun`
  std::string working_dir;     // <work-dir>/<job>/<attempt>
  std::string host;            // this worker's address (where peers reach its ranks)
  int cores = 1;               // CPU cores of this host
  int threads = 0;             // the rank's CPU threads (RankStart.threads); 0: not set
  int64_t memory_bytes = 0;    // the worker's --memory-bytes (RankStart.memory_bytes)
  TlsFiles tls;                // the files ranks reach the coordinator's store with
  // --data-root / --checkpoint-root, resolved; both empty: unconfined.
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
};

// One assigned rank as a process: `meshrun __rank`, its RankStart (the assignment unchanged, with
// the host, threads, TLS files and file roots beside it) framed on its stdin, and
// the only variable it needs set: OMP_NUM_THREADS = max(1, cores / local_world_size), read by
// OpenMP itself (on top of the allow-listed part of the worker's environment, see
// MergeEnvironment).
struct RankCommand {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string input;
};
RankCommand BuildRankCommand(const v1::RankAssignment& assignment, const RankLaunchConfig& config);

// Whether a rank inherits the worker's variable `name` without being asked to: what a process
// needs to run (PATH, HOME, USER, LANG, LC_*, TZ, TMPDIR, TERM, LD_LIBRARY_PATH), to find its
// devices and network (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NCCL_*, GLOO_*), to tune its
// BLAS (OPENBLAS_*), and the sanitizer options of a test build (ASAN_/UBSAN_/LSAN_/
// TSAN_OPTIONS). Anything else (a cloud secret, a proxy password) stays with the worker unless
// its operator passes it by name (--rank-env NAME).
bool IsInheritedByRanks(std::string_view name);

// The rank's environment: the entries of `base` ("NAME=value", e.g. from environ) that
// IsInheritedByRanks allows or `pass` names (never MESHRUN_* or OMP_NUM_THREADS, which the
// worker sets, nor a name that `vars` sets: a cuda rank's CUDA_VISIBLE_DEVICES replaces the
// worker's), followed by `vars`.
std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& vars,
    const std::vector<std::string>& pass = {});

// A job id that is safe as one path component (no '/', not "." or "..", not empty, at most
// 128 printable characters); the worker refuses to start ranks of any other.
bool IsSafeJobId(std::string_view job_id);

// A rank's step report as the MetricsSample of (job, attempt, rank) the coordinator ingests.
// Only the comm counters charged to one of the mesh's four axes are kept: the trainer's
// metrics and control traffic, and calls charged to a flattened group, have no series.
v1::MetricsSample SampleOfStep(const v1::RankStep& step, const std::string& job_id, int attempt,
                               int rank);

}  // namespace meshrun
