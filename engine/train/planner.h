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
};

// The documented profile of `name` (cpu, a100, h100, h200, l40s); NOT_FOUND names the known
// ones. For cpu, memory and flops are placeholders the caller replaces with this host's.
StatusOr<DeviceProfile> DeviceProfileNamed(const std::string& name);
std::vector<std::string> KnownDevices();

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
  std::map<std::string, double> comm_seconds;  // per axis: tp, cp, dp_shard, dp_replicate
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
};

// Every valid configuration of `spec` on `cluster` (the spec's own parallelism and activation
// checkpointing are ignored), fitting ones first, then by tokens/s (descending), then by peak
// memory (ascending). INVALID_ARGUMENT when the cluster is empty.
StatusOr<std::vector<PlanRow>> Plan(const JobSpec& spec, const ClusterShape& cluster);

// A few plain sentences about the first row (why it wins, what the runner-up trades).
std::string ExplainBest(const std::vector<PlanRow>& rows, const ClusterShape& cluster);

}  // namespace meshrun
