// The planner at scale: an analytic prediction of one configuration of a model on a cluster
// (PredictAtScale), for sizes and precisions the CPU engine does not run (Llama 3 8B/70B, bf16
// on GPUs). The model is the job spec's ModelSpec, read through the engine's config; the
// engine's own runs go through the exact memory model (memory_model.h) instead; this is for
// planning on paper (docs/planning.md "Toward scale"). Pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/job_spec.h"
#include "engine/train/planner.h"

namespace meshrun {

// Llama 3 8B (32 layers, d_model 4096, 32 heads, 8 kv heads, d_ff 14336, vocab 128256, untied
// head, rope_theta 500000) and 70B (80, 8192, 64, 8, 28672) as the job spec's `model:` section
// (arch llama) at `seq_len`: the presets the planning on paper starts from. The planner reads a
// model's shape from its ModelSpec through the engine's own config (GPT2ConfigOf) and layout,
// so there is one description of it.
ModelSpec Llama3_8B(int seq_len = 8192);
ModelSpec Llama3_70B(int seq_len = 8192);

// Parameters of the engine's layout of `model` (GPT2ParamLayout) without gpt2's position
// embedding, and of one transformer block.
int64_t ParameterCount(const ModelSpec& model);
int64_t BlockParameterCount(const ModelSpec& model);
// Model FLOPs per token, forward and backward: the engine's count (GPT2FlopsPerToken: 6·N +
// 12·n_layer·d_model·seq_len, where N leaves out an untied token table, a lookup).
double FlopsPerToken(const ModelSpec& model);

// One configuration at scale: the mesh, the per-dp-rank batch and the precision.
struct ScaleConfig {
  int dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1;
  int64_t local_batch = 1;         // sequences per dp rank per step (one micro-batch)
  std::string precision = "bf16";  // bf16: 2-byte parameters, activations, gradients and
                                   // traffic, with fp32 master weights and AdamW moments
  std::string activation_checkpointing = "selective";
  int world() const { return dp_replicate * dp_shard * cp * tp; }
};

struct ScalePrediction {
  // Bytes of one rank: its shards (parameters, gradients, master weights and moments), two
  // gathered units (FSDP), the kept activations of one micro-batch, and their sum.
  double state_bytes = 0, gathered_bytes = 0, activation_bytes = 0, peak_bytes = 0;
  double compute_seconds = 0;
  std::map<std::string, double> comm_seconds;  // tp, cp, dp_shard, dp_replicate
  double step_seconds = 0;                     // compute + communication (no overlap)
  double tokens_per_second_per_device = 0;
  double mfu = 0;  // model FLOPs over the device's peak (dense bf16 datasheet figure)
};

// The analytic prediction: FLOPs (plus what activation checkpointing recomputes) over
// world × the profile's rate × its step efficiency; each axis's bus bytes over the link its
// group crosses (as Plan); memory as ScalePrediction says. `peak_flops` is the datasheet
// figure MFU is measured against.
ScalePrediction PredictAtScale(const ModelSpec& model, const ScaleConfig& c,
                               const ClusterShape& cluster, double peak_flops);

// The GPU profiles for bf16: achievable dense bf16 GEMM rates, 60% of the datasheet's (H100
// SXM: 989 TFLOP/s peak), and the datasheet peak itself. NOT_FOUND for other names.
StatusOr<DeviceProfile> Bf16DeviceProfile(const std::string& name);
StatusOr<double> Bf16PeakFlops(const std::string& name);

}  // namespace meshrun
