// The worker <-> rank protocol, as pure functions: how a RankAssignment becomes a command line
// and an environment for `meshrun train`, and how the rank's output lines become session
// messages (stdout JSON step lines -> MetricsSample, the stderr line "checkpoint <dir>" ->
// CheckpointSaved, everything else -> LogLine). No I/O; see docs/control-plane.md.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshrun/v1/worker.pb.h"

namespace meshrun {

// Environment a rank started by a worker finds, besides MESHRUN_RANK and MESHRUN_WORLD_SIZE
// (client/launcher.h), read by ConnectRank in client/train_command.cc.
inline constexpr char kEnvStoreAddress[] = "MESHRUN_STORE_ADDRESS";  // coordinator HOST:PORT
inline constexpr char kEnvJobId[] = "MESHRUN_JOB_ID";
inline constexpr char kEnvAttempt[] = "MESHRUN_ATTEMPT";
inline constexpr char kEnvHost[] = "MESHRUN_HOST";  // address peers reach this rank at (Gloo)
inline constexpr char kEnvReportAllRanks[] = "MESHRUN_REPORT_ALL_RANKS";  // "1": every rank prints
inline constexpr char kEnvLocalRank[] = "MESHRUN_LOCAL_RANK";
inline constexpr char kEnvLocalWorldSize[] = "MESHRUN_LOCAL_WORLD_SIZE";
// Informational: the checkpoint the coordinator chose; `checkpoint.resume: auto` finds the same.
inline constexpr char kEnvResumeCheckpoint[] = "MESHRUN_RESUME_CHECKPOINT";

// What a worker knows about itself when it starts a rank.
struct RankLaunchConfig {
  std::string meshrun_binary;  // absolute path of `meshrun`
  std::string spec_path;       // where the attempt's spec.yaml was written
  std::string working_dir;     // <work-dir>/<job>/<attempt>
  std::string host;            // this worker's address (MESHRUN_HOST)
  int cores = 1;               // CPU cores of this host
};

// argv and the variables to set (on top of the allow-listed part of the worker's own
// environment, see MergeEnvironment) for one assigned rank:
//   meshrun train -f <spec> --nproc <world> -o json
//   MESHRUN_RANK, MESHRUN_WORLD_SIZE, MESHRUN_STORE_ADDRESS, MESHRUN_JOB_ID, MESHRUN_ATTEMPT,
//   MESHRUN_HOST, MESHRUN_REPORT_ALL_RANKS=1, MESHRUN_LOCAL_RANK, MESHRUN_LOCAL_WORLD_SIZE,
//   OMP_NUM_THREADS = max(1, cores / local_world_size), and MESHRUN_RESUME_CHECKPOINT if set
//   (the caller passes the checkpoint as it resolved and checked it).
struct RankCommand {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
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
// worker sets), followed by `vars`.
std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& vars,
    const std::vector<std::string>& pass = {});

// A job id that is safe as one path component (no '/', not "." or "..", not empty, at most
// 128 printable characters); the worker refuses to start ranks of any other.
bool IsSafeJobId(std::string_view job_id);

// One `{"event":"step",…}` line of `meshrun train -o json` as a MetricsSample of (job, attempt,
// rank); nullopt for any other line (eval, summary, text, malformed JSON).
std::optional<v1::MetricsSample> ParseStepLine(std::string_view line, const std::string& job_id,
                                               int attempt, int rank);

// The engine's stderr line "checkpoint <dir>/step-NNNNNNNN" as a CheckpointSaved; nullopt for
// any other line.
std::optional<v1::CheckpointSaved> ParseCheckpointLine(std::string_view line,
                                                       const std::string& job_id, int attempt);

// Splits a byte stream into lines without their '\n' (and a trailing '\r'). A line longer than
// max_line bytes is cut into pieces of max_line. Not thread-safe; one per pipe.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 1 << 16) : max_line_(max_line) {}

  void Feed(std::string_view data, const std::function<void(std::string)>& on_line);
  // Hands out what is left after the last newline (at end of stream).
  void Flush(const std::function<void(std::string)>& on_line);

 private:
  size_t max_line_;
  std::string partial_;
};

}  // namespace meshrun
