// The planner: for a job spec and a cluster shape, every valid configuration (mesh × cp
// strategy × activation checkpointing × FSDP residency) with its predicted per-rank memory (the
// memory model, exact for the engine's buffers), step time, tokens/s and MFU, and whether it
// fits; best first. Pure functions: a spec and a cluster in, rows out (docs/planning.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/train/memory_model.h"

namespace meshrun {

// What the planner assumes of one device and its links (docs/planning.md has the table).
struct DeviceProfile {
  std::string name;
  double memory_bytes = 0;   // per rank
  double flops = 0;          // achievable dense float32 FLOP/s per rank (not the datasheet peak)
  double intra_node_bw = 0;  // bytes/s per rank for collectives inside a node
  double inter_node_bw = 0;  // bytes/s per rank for collectives across nodes
  // The fraction of `flops` a whole training step attains (GEMMs near it, attention and the
  // elementwise kernels far below): measured 0.42 for the CPU engine (docs/performance.md).
  double step_efficiency = 0.5;
  // Seconds a collective costs beyond its bytes (launch, synchronisation, the transport's
  // handshake), per call, inside a node and across nodes. On CPU it is what a small Gloo
  // all-reduce on loopback takes (calibration); for tiny models it, not bandwidth, dominates.
  double intra_node_latency = 0;
  double inter_node_latency = 0;
  // The ranks of the all-reduce the latencies were measured with (calibration), ≥ 2; then a
  // collective's latency is that of its ring hops: an all-reduce over n ranks makes 2(n−1)
  // sequential hops, an all-gather or reduce-scatter n−1, a send one, each costing
  // latency / (2·(latency_ranks − 1)). 0 (the table's figures): every call costs the latency.
  int latency_ranks = 0;
};

// The documented profile of `name` (cpu, a100, h100, h200, l40s); NOT_FOUND names the known
// ones. For cpu, memory and flops are placeholders the caller replaces with this host's.
StatusOr<DeviceProfile> DeviceProfileNamed(const std::string& name);
std::vector<std::string> KnownDevices();

// The cpu profile of a host whose `ranks_per_node` ranks share its cores: each rank gets
// 1/ranks_per_node of the host's GEMM rate (all cores) and of its memory; collectives inside
// the node run at the measured loopback bandwidth and latency (engine/calibration). Figures
// ≤ 0 keep the table's.
// `latency_ranks`: the ranks of the all-reduce that measured the latency (0: unknown, per call).
DeviceProfile CalibratedCpuProfile(double host_gemm_flops, double host_memory_bytes,
                                   int ranks_per_node, double loopback_bus_bandwidth,
                                   double loopback_latency_seconds, int latency_ranks = 0);

struct ClusterShape {
  int nodes = 1;
  int per_node = 1;  // ranks per node
  DeviceProfile device;
  int world() const { return nodes * per_node; }
};

struct PlanRow {
  JobSpec spec;  // the job with this row's parallelism and activation checkpointing
  MemoryPrediction memory;
  bool fits = false;
  std::string reason;  // why it does not fit (empty when it does)
  double compute_seconds = 0;
  // per axis: tp, cp, dp_shard, dp_replicate (and pp: the stages' sends, when pp_size > 1)
  std::map<std::string, double> comm_seconds;
  // Pipeline parallelism (pp_size > 1): the stages' idle time in a step (the schedule's
  // bubble, PipelineBubbleSeconds) and its fraction of the step's compute and bubble; the stage
  // the memory figures are of (the one with the largest peak).
  double bubble_seconds = 0;
  double pipeline_bubble_ratio = 0;
  int peak_stage = 0;
  // Whether this build's engine runs the configuration (ValidateJobSpec accepts it); false for
  // a pipeline planned on paper before the engine runs pipelines. `auto` chooses only these.
  bool engine_runs = true;
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
};

// Every valid configuration of `spec` on `cluster` (the spec's own parallelism and activation
// checkpointing are ignored), fitting ones first, then by tokens/s (descending), then by peak
// memory (ascending). INVALID_ARGUMENT when the cluster is empty.
StatusOr<std::vector<PlanRow>> Plan(const JobSpec& spec, const ClusterShape& cluster);

// The predictions of the one configuration `spec` (its own mesh, cp strategy, activation
// checkpointing and residency) on `cluster`; the spec must be valid for cluster.world() ranks.
// The coordinator exports it beside the measurement.
PlanRow PredictConfiguration(const JobSpec& spec, const ClusterShape& cluster);

// The collectives each axis issues per rank per step (the latency term of the step time with
// the table's per-call latencies).
std::map<std::string, double> ExpectedCommCallsPerStep(const JobSpec& spec);
// The same calls as sequential ring hops (the latency term with calibrated latencies): tp's
// all-reduces 2(T−1) each, cp's all-gathers and reduce-scatters C−1 (ring: one per exchange),
// FSDP's gathers and reduce-scatters over S·C ranks S·C−1, the grad norm's all-reduces and
// dp_replicate's 2(n−1).
std::map<std::string, double> ExpectedCommHopsPerStep(const JobSpec& spec);

// `parallelism.auto: true`: the fastest fitting mesh of cluster.world() ranks for the spec's
// own cp strategy, activation checkpointing and residency (auto chooses the four sizes only),
// and the runner-up. INVALID_ARGUMENT (parallelism.auto) when no mesh is valid or none fits.
struct MeshChoice {
  JobSpec spec;  // the job as it runs: the chosen sizes, auto false
  PlanRow best;
  bool has_runner_up = false;
  PlanRow runner_up;
  std::string text;  // "auto: chose dp_shard 2 × tp 2 (runner-up …)"
};
StatusOr<MeshChoice> ChooseMesh(const JobSpec& spec, const ClusterShape& cluster);

// "pp 2 × dp_shard 2 × tp 2": the axes of size > 1, outermost first; "1 rank" when there are
// none.
std::string MeshName(const ParallelismSpec& p);

// A few plain sentences about the first row (why it wins, what the runner-up trades).
std::string ExplainBest(const std::vector<PlanRow>& rows, const ClusterShape& cluster);

}  // namespace meshrun
