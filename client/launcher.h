// The standalone launcher behind `meshrun train --nproc N` (like `torchrun --standalone`): starts
// N rank processes on this host, relays their output line by line, and stops them all when one
// fails or when the launcher is interrupted.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace meshrun::client {

struct LaunchOptions {
  // The command every rank runs; argv[0] is the executable (a path, or a name looked up in PATH).
  std::vector<std::string> argv;
  int nproc = 1;
  // Optional, one per rank, e.g. "rank 3 (dp_shard=1 tp=1)"; names the rank in error lines.
  std::vector<std::string> rank_labels;
  // How long a rank may take to exit after SIGTERM before it gets SIGKILL.
  std::chrono::milliseconds grace{5000};
  // After SIGINT/SIGTERM to the launcher: how long the ranks get to finish their step, write a
  // checkpoint and exit before they get SIGKILL.
  std::chrono::milliseconds interrupt_grace{120000};
  // Empty: create /tmp/meshrun-run-XXXXXX and remove it at the end. Otherwise the folder is
  // kept, but its `store` subfolder is emptied first (each launch needs a fresh store).
  std::string run_dir;
  // Required: what rank r reads on its stdin, given the run's store folder: the framed
  // RankStart of `meshrun __rank`, the rank's only source for its place in the run.
  std::function<std::string(int rank, const std::string& store_dir)> rank_input;
  // Set: every rank gets a report channel on fd 3, and each frame it writes arrives here (on
  // the supervisor's thread, in order with the rank's output lines).
  std::function<void(int rank, std::string frame)> on_report;
  // Set: called on the supervisor's thread before each line of the ranks' output is written
  // (e.g. to clear a progress bar drawn from the reports).
  std::function<void()> before_line;
};

// Starts options.nproc processes running options.argv, each with the environment of this
// process and options.rank_input(r, <run_dir>/store) on its stdin (the store folder is empty, for
// engine/comm's FileStore): a rank learns its place from that input alone, as a worker's rank
// does from the RankStart the worker writes.
// The ranks are processes of a RankSupervisor (supervisor/rank_supervisor.h, the same as a
// worker's ranks): each in its own process group with stdin from /dev/null, killed with SIGKILL
// if the launcher dies (PR_SET_PDEATHSIG); signals ignored when Launch began stay ignored.
//
// Output: rank 0's stdout lines pass through to our stdout unchanged (so `-o json` stays
// clean); every other line (rank 0's stderr, other ranks' stdout and stderr) goes to our
// stderr prefixed with "[rank R] ". Lines are written whole, never interleaved.
//
// Returns the exit code for the process: 0 when every rank exits 0. When a rank exits non-zero
// or is killed, the others get SIGTERM (their whole process group), SIGKILL after `grace`, and
// one line `error: rank R failed: exit code N: <its last stderr line> (hint: ...)` is printed
// (`rank R failed: cannot execute …` when its process could not be started);
// the result is 2 when that rank exited 2 (invalid input), 1 otherwise. SIGINT or SIGTERM to
// the launcher is passed on as SIGTERM to every rank, which stop at the end of their step (with
// a checkpoint) and exit 130; they get `interrupt_grace` before SIGKILL, and a second signal
// kills them at once. The result is then 130, after `error: interrupted (signal N); …` only when
// some rank did not stop cleanly.
// Invalid options print one error line and return 2.
//
// Not thread-safe: one Launch at a time per process (it owns the SIGINT, SIGTERM and SIGCHLD
// handlers while it runs and restores the previous ones after).
int Launch(const LaunchOptions& options);

// The absolute path of this process's executable (readlink /proc/self/exe); empty on failure.
std::string SelfExecutable();

}  // namespace meshrun::client
