// The one definition of MFU (model FLOPs utilization), docs/metrics.md "MFU": the job's model
// FLOP/s over the summed peak of the devices it runs on,
//
//   MFU = tokens_per_second × model_flops_per_token / (peak_flops_per_rank × ranks)
//
// with tokens_per_second the job's (global batch tokens / step time), model_flops_per_token
// GPT2FlopsPerToken (forward and backward, no recomputation), and peak_flops_per_rank the
// device's: on cuda the GPU's dense bf16 datasheet figure (common/gpu_peak.h), on cpu the
// measured float32 GEMM rate of one core times the rank's threads (MeasureCpuGemmPeakFlops).
// The trainer (every step and the summary, whichever command started the rank: `meshrun train`,
// `--nproc`, a worker), the planner's estimates and the benches call this; the coordinator's
// job sample is this function of its own tokens/s (the slowest rank's time over the ranks'
// summed peak) and the client weights steps by their time, which leave it as is.
#pragma once

namespace meshrun {

inline double ModelFlopsUtilization(double tokens_per_second, double model_flops_per_token,
                                    double peak_flops_per_rank, int ranks) {
  const double peak = peak_flops_per_rank * static_cast<double>(ranks);
  return peak > 0 ? tokens_per_second * model_flops_per_token / peak : 0;
}

}  // namespace meshrun
