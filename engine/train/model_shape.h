// The planner's view of a model at scale: the few numbers its FLOP, memory and traffic model
// needs (ModelShape), for architectures and precisions the CPU engine does not build (Llama,
// bf16 on GPUs), and an analytic prediction of one configuration on a cluster (PredictAtScale).
// The engine's own models go through the exact memory model (memory_model.h) instead; this is
// for planning on paper (docs/planning.md "Toward scale"). Pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/job_spec.h"
#include "engine/train/planner.h"

namespace meshrun {

// The shapes of a decoder-only transformer. Until the job spec carries model.n_kv_head,
// model.d_ff and model.tie_embeddings (arch llama), they are given here directly.
struct ModelShape {
  std::string arch = "gpt2";  // gpt2 | llama
  int64_t n_layer = 0, d_model = 0, n_head = 0;
  int64_t n_kv_head = 0;  // k/v heads (grouped-query attention); n_head for gpt2
  int64_t d_ff = 0;       // MLP width: 4·d_model for gpt2
  int64_t vocab_size = 0, seq_len = 0;
  bool tie_embeddings = true;  // gpt2: the head is the token embedding
};

// gpt2's shape from the spec (n_kv_head = n_head, d_ff = 4·d_model, tied, learned positions).
ModelShape ModelShapeOf(const ModelSpec& model);
// Llama 3 8B (32 layers, d_model 4096, 32 heads, 8 kv heads, d_ff 14336, vocab 128256) and
// 70B (80, 8192, 64, 8, 28672), at `seq_len`.
ModelShape Llama3_8B(int64_t seq_len = 8192);
ModelShape Llama3_70B(int64_t seq_len = 8192);

// Parameters without gpt2's position embedding (§7's N), and of one transformer block.
int64_t ParameterCount(const ModelShape& m);
int64_t BlockParameterCount(const ModelShape& m);
// Model FLOPs per token, forward and backward: 6·N + 12·n_layer·d_model·seq_len (§7).
double FlopsPerToken(const ModelShape& m);

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
ScalePrediction PredictAtScale(const ModelShape& m, const ScaleConfig& c,
                               const ClusterShape& cluster, double peak_flops);

// The GPU profiles for bf16: achievable dense bf16 GEMM rates, 60% of the datasheet's (H100
// SXM: 989 TFLOP/s peak), and the datasheet peak itself. NOT_FOUND for other names.
StatusOr<DeviceProfile> Bf16DeviceProfile(const std::string& name);
StatusOr<double> Bf16PeakFlops(const std::string& name);

}  // namespace meshrun
