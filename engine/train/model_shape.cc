// The analytic model of model_shape.h. Memory per rank, bf16 with fp32 master weights:
// parameters 2 + gradients 2 + master 4 + AdamW moments 8 bytes per parameter, sharded over
// dp_shard·cp (and split over tp); FSDP holds two gathered blocks at once (the one computing and
// the one prefetched) in bf16. Activations kept per token and layer (bf16 values): the block
// input, both norms' outputs, q, k, v, the attention output, the MLP's hidden values (two for
// gelu, four for SwiGLU) and the residual, each split over tp where Megatron splits it;
// `selective` keeps them and recomputes the attention core, `full` keeps the block input only
// (plus one block's worth during its recompute).
#include "engine/train/model_shape.h"

#include <algorithm>

#include "common/mfu.h"
#include "engine/model/gpt2.h"

namespace meshrun {

ModelSpec Llama3_8B(int seq_len) {
  ModelSpec m;
  m.arch = "llama";
  m.n_layer = 32;
  m.d_model = 4096;
  m.n_head = 32;
  m.n_kv_head = 8;
  m.d_ff = 14336;
  m.vocab_size = 128256;
  m.seq_len = seq_len;
  m.tie_embeddings = false;
  m.norm_eps = 1e-5;
  m.rope_theta = 500000;
  return m;
}

ModelSpec Llama3_70B(int seq_len) {
  ModelSpec m = Llama3_8B(seq_len);
  m.n_layer = 80;
  m.d_model = 8192;
  m.n_head = 64;
  m.d_ff = 28672;
  return m;
}

namespace {

// The layout of `model` with one layer: the embedding unit, one block (every block is the same
// size) and the final unit; the planner asks for counts per mesh, and an 80-layer layout is
// 80 times the work.
std::vector<ParamInfo> OneLayerLayout(const ModelSpec& model) {
  GPT2Config cfg = GPT2ConfigOf(model);
  cfg.n_layer = 1;
  return GPT2ParamLayout(cfg);
}

}  // namespace

int64_t ParameterCount(const ModelSpec& model) {
  int64_t n = 0;
  for (const ParamInfo& p : OneLayerLayout(model)) {
    if (p.role == ParamRole::kPositionEmbedding) continue;
    n += p.layer == 0 ? p.numel * model.n_layer : p.numel;
  }
  return n;
}

int64_t BlockParameterCount(const ModelSpec& model) {
  int64_t n = 0;
  for (const ParamInfo& p : OneLayerLayout(model)) {
    if (p.layer == 0) n += p.numel;
  }
  return n;
}

double FlopsPerToken(const ModelSpec& model) {
  return GPT2FlopsPerToken(GPT2ConfigOf(model), model.seq_len);
}

StatusOr<double> Bf16PeakFlops(const std::string& name) {
  // Dense bf16 datasheet figures (no sparsity).
  if (name == "h100" || name == "h200") return 989e12;
  if (name == "a100") return 312e12;
  if (name == "l40s") return 362e12;
  return NotFoundError("device: no bf16 figure for '" + name +
                       "' (hint: one of a100, h100, h200, l40s)");
}

StatusOr<DeviceProfile> Bf16DeviceProfile(const std::string& name) {
  MESHRUN_ASSIGN_OR_RETURN(DeviceProfile d, DeviceProfileNamed(name));
  MESHRUN_ASSIGN_OR_RETURN(double peak, Bf16PeakFlops(name));
  d.flops = 0.6 * peak;
  return d;
}

ScalePrediction PredictAtScale(const ModelSpec& model, const ScaleConfig& c,
                               const ClusterShape& cluster, double peak_flops) {
  ScalePrediction out;
  const GPT2Config m = GPT2ConfigOf(model);
  const double seq_len = model.seq_len;
  const DeviceProfile& dev = cluster.device;
  const bool bf16 = ParseTrainPrecision(c.precision) == TrainPrecision::kBf16;
  const std::optional<Checkpointing> ac = ParseCheckpointing(c.activation_checkpointing);
  const double value = bf16 ? 2 : 4;                         // bytes of a parameter/activation
  const double state_per_param = bf16 ? 2 + 2 + 4 + 8 : 16;  // fp32: p, g, m, v
  const double n = static_cast<double>(ParameterCount(model));
  const double block = static_cast<double>(BlockParameterCount(model));
  const int shard = c.dp_shard * c.cp, tp = c.tp;
  out.state_bytes = n / tp / shard * state_per_param;
  // Two blocks gathered (computing, prefetched) in the compute precision, and their gradients.
  out.gathered_bytes = shard > 1 ? 2 * 2 * block / tp * value : 0;

  const double d = m.d_model, kv = static_cast<double>(m.kv_heads()) * m.head_dim(), ff = m.ff();
  const double tokens = static_cast<double>(c.local_batch) * seq_len / c.cp;  // per rank
  const double mlp_values = m.llama() ? 4 * ff : 2 * ff;
  // Replicated over tp: block input, two norm outputs, residual; split: q, k, v, attention
  // output, the MLP's hidden values.
  const double per_layer = (4 * d + (d + 2 * kv + d + mlp_values) / tp) * value;
  const double kept_layer = ac == Checkpointing::kFull ? d * value : per_layer;
  // The head's logits of the micro-batch in fp32 (the loss), split over tp.
  const double logits = m.vocab_size / static_cast<double>(tp) * 4;
  out.activation_bytes = tokens * (m.n_layer * kept_layer + per_layer + logits);
  out.peak_bytes = out.state_bytes + out.gathered_bytes + out.activation_bytes;

  // Compute: the step's model FLOPs plus recomputation, over the world's rate.
  const int world = c.world();
  const double step_tokens = tokens * c.cp * c.dp_replicate * c.dp_shard;  // global
  const double attention_forward = 4.0 * m.n_layer * d * seq_len;
  const double forward_blocks = 2.0 * m.n_layer * block;
  const double recompute = ac == Checkpointing::kFull        ? forward_blocks + attention_forward
                           : ac == Checkpointing::kSelective ? attention_forward
                                                             : 0;
  const double model_flops = FlopsPerToken(model);
  out.compute_seconds =
      step_tokens * (model_flops + recompute) / (world * dev.flops * dev.step_efficiency);

  // Traffic per rank per step (bus bytes), each over the link its group crosses.
  std::map<std::string, double> bytes = {
      {"tp", 0}, {"cp", 0}, {"dp_shard", 0}, {"dp_replicate", 0}};
  if (tp > 1) {
    const double again = ac == Checkpointing::kFull ? 2 : 0;
    bytes["tp"] = m.n_layer * (4 + again) * tokens * d * value * 2.0 * (tp - 1) / tp;
  }
  if (c.cp > 1) {
    bytes["cp"] = m.n_layer * 4 * tokens * kv / tp * value * (c.cp - 1);
  }
  if (shard > 1) {
    // Gathered for forward and again for backward, gradients reduce-scattered.
    bytes["dp_shard"] = 3 * n / tp * value * (shard - 1) / shard;
  }
  if (c.dp_replicate > 1) {
    bytes["dp_replicate"] = n / tp / shard * value * 2.0 * (c.dp_replicate - 1) / c.dp_replicate;
  }
  const std::map<std::string, int> span = {
      {"tp", tp}, {"cp", tp * c.cp}, {"dp_shard", tp * c.cp * c.dp_shard}, {"dp_replicate", world}};
  out.step_seconds = out.compute_seconds;
  for (const auto& [axis, b] : bytes) {
    const double link = span.at(axis) <= cluster.per_node ? dev.intra_node_bw : dev.inter_node_bw;
    out.comm_seconds[axis] = link > 0 ? b / link : 0;
    out.step_seconds += out.comm_seconds[axis];
  }
  out.tokens_per_second_per_device = step_tokens / out.step_seconds / world;
  out.mfu = ModelFlopsUtilization(out.tokens_per_second_per_device, model_flops, peak_flops, 1);
  return out;
}

}  // namespace meshrun
