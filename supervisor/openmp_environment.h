// How a rank's OpenMP threads wait, the one default for every rank process (decision 0025).
// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it loads, so the choice is made in
// the environment of the process that starts a rank: meshrun-worker for its ranks, and
// `meshrun train` for itself (it re-executes once) and the ranks of `--nproc N`, which inherit it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshrun {

// The OpenMP wait variables a rank gets: the caller's own OMP_WAIT_POLICY and GOMP_SPINCOUNT
// when either is set (the user chose), otherwise OMP_WAIT_POLICY=passive. Spinning threads
// that share cores with anything else (the daemons, other ranks, a build) wait a whole time slice
// for a preempted team member at every barrier: `tiny` ran 25x slower spinning than passive on a
// loaded host, while on an idle one spinning is at most 2x faster at that size and even at
// `mini`'s (docs/performance.md).
std::vector<std::pair<std::string, std::string>> RankOpenMpEnvironment();

// True when neither variable is set in this process's environment.
bool OpenMpWaitUnset();

// The `meshrun` commands that run the model in their own process, or measure for the ranks,
// and so wait as every rank does (main() sets RankOpenMpEnvironment and re-executes itself once
// for them): `train` (its in-process rank, and the ranks of --nproc N inherit it), `eval`,
// `generate`, and `plan` (its GEMM rate and --calibrate predict ranks that wait passively). An
// `eval` that spun took 20.7 s against 0.56 s passive on a busy host; three `plan --calibrate`
// on a host at load 8.5 predicted 0.029, 0.0039 and 0.116 s/step spinning, 0.0074, 0.0072 and
// 0.0066 passive.
bool CommandWaitsAsRanks(std::string_view command);

}  // namespace meshrun
