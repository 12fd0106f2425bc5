// Calibration: what this host achieves, measured in well under a second, for the planner's
// device profile (docs/planning.md "Calibration"): the float32 GEMM rate of all its cores and
// the bus bandwidth of a Gloo all-reduce between ranks on loopback. `meshrun plan --calibrate`
// runs it, and so does meshrun-worker once at registration (the coordinator keeps the figures
// per worker). Not thread-safe against other users of the kernels' thread count.
#pragma once

#include <cstddef>
#include <vector>

#include "common/status.h"

namespace meshrun {

struct HostCalibration {
  double gemm_flops = 0;              // float32 FLOP/s of one GEMM on all of `threads`
  int threads = 0;                    // the OpenMP threads it ran on
  double loopback_bus_bandwidth = 0;  // bytes/s, nccl-tests' bus bandwidth of an all-reduce
  double loopback_latency = 0;        // seconds of an all-reduce of one float
  int loopback_ranks = 0;             // the ranks (threads) of those all-reduces
};

struct CalibrationOptions {
  int threads = 0;                 // GEMM threads; 0: every core
  int ranks = 2;                   // all-reduce ranks, each a thread with its own Gloo context
  size_t bytes = size_t{4} << 20;  // the all-reduce's buffer
  int iterations = 5;              // timed calls (after one warm-up); the median counts
};

// The GEMM rate (cpu::MeasureMatmulFlops, the measurement behind MFU) with `threads` threads.
double MeasureGemmFlops(int threads);

struct LoopbackFigures {
  double bus_bandwidth = 0;  // S·2(n−1)/n ÷ the median time of an all-reduce of `bytes`
  double latency = 0;        // the median time of an all-reduce of one float
};
// Both figures of `ranks` threads on 127.0.0.1. UNAVAILABLE when Gloo cannot bind loopback.
StatusOr<LoopbackFigures> MeasureLoopbackAllReduce(int ranks, size_t bytes, int iterations);

// Both; the bandwidth is 0 (and the GEMM still measured) when ranks < 2.
StatusOr<HostCalibration> CalibrateHost(const CalibrationOptions& options = {});

// A figure measured several times: the median of the samples, and their spread, the median
// absolute deviation from it relative to it (0.04: ±4%). One outlier among five samples (a
// measurement that the scheduler preempted) moves neither much.
struct RobustFigure {
  double median = 0;
  double spread = 0;
};
RobustFigure Robust(std::vector<double> samples);

// CalibrateHost `rounds` times after one discarded warm-up round (the first touches the pages,
// starts the threads, binds the sockets): each figure is the median over the rounds; `samples`
// (when given) receives every round's figures, for the spread of what is predicted from them.
// `meshrun plan --calibrate` and `train` with parallelism.auto run it (docs/planning.md).
StatusOr<HostCalibration> CalibrateHostRepeated(const CalibrationOptions& options, int rounds,
                                                std::vector<HostCalibration>* samples = nullptr);

}  // namespace meshrun
