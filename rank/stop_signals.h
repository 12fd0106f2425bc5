// A rank's SIGINT and SIGTERM (Ctrl-C, the launcher's and the worker's graceful stop), taken by
// one watcher thread and never by a thread that computes (decision 0069).
//
// Why: oneDNN's JIT GEMM kernels (libdnnl 2.x, Debian 12's; fixed upstream in 3.11) move rsp
// into a heap workspace while they run. A signal handler delivered to a thread inside one writes
// its signal frame there, and the heap is corrupt (`corrupted size vs. prev_size`, a crash a
// step later). So every thread that computes blocks the stop signals: BlockStopSignals in the
// main thread before it starts any (the OpenMP, Gloo and gRPC threads inherit the mask), and the
// watcher waits for them with sigwaitinfo. Threads a library started before main (OpenBLAS's)
// did not inherit the mask and never run oneDNN; for them ArmStopSignals also installs a handler
// that does what the watcher does.
//
// The first stop signal after ArmStopSignals sets the flag (the trainer stops at the end of the
// step, every rank at the same one, and checkpoints); a second one, or one before arming, ends
// the process as the signal's default action does.
#pragma once

#include <csignal>

namespace meshrun::rank {

// Blocks SIGINT and SIGTERM in the calling thread and starts the watcher (once per process).
// Call it first thing in a process that will train, before any thread starts.
void BlockStopSignals();

// From now on the first stop signal sets *flag (and, with announce, says on stderr what happens
// next); calls BlockStopSignals when nobody has.
void ArmStopSignals(volatile std::sig_atomic_t* flag, bool announce);

// Stop signals taken since ArmStopSignals (tests).
int StopSignalsTaken();

}  // namespace meshrun::rank
