// Per-step communication volume of each parallelism; see docs/parallelism.md for the derivation.
#include "engine/train/comm_volume.h"

#include "engine/model/gpt2.h"

namespace meshrun {

std::map<std::string, double> ExpectedCommBytesPerStep(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  const double f = sizeof(float);
  const int R = p.dp_replicate_size, S = p.dp_shard_size, C = p.cp_size, Tp = p.tp_size;
  const int N = S * C, L = spec.model.n_layer;
  const double d = spec.model.d_model, Tl = spec.model.seq_len / C,
               mb = spec.train.micro_batch_size;
  const double micro_batches = spec.train.global_batch_size / (R * S * mb);
  std::map<std::string, double> bytes = {
      {"tp", 0}, {"cp", 0}, {"dp_shard", 0}, {"dp_replicate", 0}};
  // Activation checkpointing runs forward work again in backward: `full` a block's whole
  // forward (its two tp all-reduces and its cp exchange), `selective` the attention core (its
  // cp exchange).
  const Checkpointing ac = CheckpointingOf(spec.train);
  const double tp_forward_again = ac == Checkpointing::kFull ? 1 : 0;
  const double cp_forward_again = ac == Checkpointing::kNone ? 0 : 1;

  // tp: four all-reduces of the activations (mb·Tl·d) per layer and micro-batch (two forward
  // after the row-parallel layers, two backward after the column-parallel ones); the
  // vocab-parallel embedding's all-reduce and the head's (its input gradient), each of the
  // activations too; the head's all-gather of 2 floats per token (log-sum-exp and target logit
  // of each rank's vocabulary shard); and the 8-byte all-gather of the squared grad norm.
  if (Tp > 1) {
    const double ar = mb * Tl * d * f * 2.0 * (Tp - 1) / Tp;
    const double head_stats = 2.0 * mb * Tl * f * (Tp - 1);
    bytes["tp"] =
        micro_batches * ((L * (4 + 2 * tp_forward_again) + 2) * ar + head_stats) + 8.0 * (Tp - 1);
  }
  // cp: one K or V block is mb·(H/Tp)·Tl·(d/H) floats.
  if (C > 1) {
    const double blk = mb * Tl * d / Tp * f;
    // Forward: the ring passes K and V C−1 times; allgather gathers K and V once. Backward:
    // the ring passes K, V, dK, dV C−1 times and the accumulators one more hop; allgather
    // reduce-scatters dK and dV.
    const bool ring = CpCommOf(p) == CpComm::kRing;
    const double forward = ring ? (C - 1) * 2 * blk : 2 * blk * (C - 1);
    const double backward = ring ? (C - 1) * 4 * blk + 2 * blk : 2 * blk * (C - 1);
    bytes["cp"] = micro_batches * L * (forward * (1 + cp_forward_again) + backward);
  }
  // FSDP over dp_shard_cp (N ranks): per micro-batch every unit is gathered before forward,
  // the L layer units again before backward (unless fsdp_reshard_after_forward is false), and
  // every unit's gradient is reduce-scattered;
  // then the 8-byte all-gather of the squared grad norm.
  // The tp ranks' units differ when tp splits the vocabulary unevenly: the figures are the
  // average over ranks, as comm_bytes is.
  double fsdp = 0, replicate = 0;
  const double gather_factor = PrecisionOf(spec.train) == TrainPrecision::kBf16 &&
                                       DeviceOf(spec.resources) == ComputeDevice::kCuda
                                   ? 0.5
                                   : 1.0;
  for (int t = 0; t < Tp; ++t) {
    GPT2Config cfg = GPT2ConfigOf(spec.model);
    cfg.tp_size = Tp;
    cfg.tp_rank = t;
    cfg.fsdp_size = N;
    const std::vector<UnitInfo> units = GPT2Units(cfg, GPT2ParamLayout(cfg));
    double shard_elems = 0;
    for (const UnitInfo& u : units) shard_elems += static_cast<double>(u.padded) / N;
    if (N > 1) {
      double per_micro = 0;
      for (size_t u = 0; u < units.size(); ++u) {
        const bool layer = u > 0 && u + 1 < units.size();
        const double unit_bytes = static_cast<double>(units[u].padded) * f * (N - 1) / N;
        const bool again = layer && p.fsdp_reshard_after_forward;
        // all-gathers; bf16 on cuda gathers half the bytes (decision 0027)
        per_micro += unit_bytes * (again ? 2 : 1) * gather_factor;
        per_micro += unit_bytes;  // reduce-scatter
      }
      fsdp += (micro_batches * per_micro + 8.0 * (N - 1)) / Tp;
    }
    // Replicas all-reduce their gradient shards once per step.
    if (R > 1) replicate += shard_elems * f * 2.0 * (R - 1) / R / Tp;
  }
  bytes["dp_shard"] = fsdp;
  bytes["dp_replicate"] = replicate;
  return bytes;
}

}  // namespace meshrun
