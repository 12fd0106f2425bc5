// EstimateRankMemory and CheckRankMemory (see memory_estimate.h).
#include "common/memory_estimate.h"

#include <algorithm>
#include <cstdio>

namespace meshrun {
namespace {

std::string Bytes(double b) {
  char buf[64];
  if (b >= 1e15) {
    std::snprintf(buf, sizeof buf, "%.3g bytes", b);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
  }
  return buf;
}

}  // namespace

RankMemoryEstimate EstimateRankMemory(const JobSpec& spec, const ParallelDims& mesh) {
  const ModelSpec& m = spec.model;
  const double d = std::max(0, m.d_model), layers = std::max(0, m.n_layer);
  const double vocab = std::max(0, m.vocab_size), seq = std::max(0, m.seq_len);
  const double heads = std::max(1, m.n_head);
  RankMemoryEstimate e;
  // GPT-2: token and position embeddings, per block 12·d² + 13·d (attention, MLP of 4·d,
  // two LayerNorms), a final LayerNorm; the head is tied.
  e.parameters = vocab * d + seq * d + layers * (12 * d * d + 13 * d) + 2 * d;
  const double shards = double{1} * mesh.tp() * mesh.dp_shard() * mesh.cp();
  e.state_bytes = e.parameters / shards * 4 /*bytes*/ * 4 /*param, grad, m, v*/;
  const double micro = std::max(1, spec.train.micro_batch_size);
  const double local_seq = seq / mesh.cp();
  const double logits = micro * local_seq * vocab / mesh.tp() * 4 * 2;  // values and grads
  const double scores = micro * heads / mesh.tp() * local_seq * seq * 4;
  e.activation_bytes = logits + scores;
  return e;
}

Status CheckRankMemory(const JobSpec& spec, const ParallelDims& mesh, int ranks_on_host,
                       double available_bytes, const std::string& flag) {
  if (available_bytes <= 0) return OkStatus();
  const RankMemoryEstimate e = EstimateRankMemory(spec, mesh);
  const double need = e.total() * std::max(1, ranks_on_host);
  if (need <= available_bytes) return OkStatus();
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", e.parameters);
  return ResourceExhaustedError(
      "model: " + std::string(params) + " parameters (n_layer " +
      std::to_string(spec.model.n_layer) + ", d_model " + std::to_string(spec.model.d_model) +
      ", vocab_size " + std::to_string(spec.model.vocab_size) + ", seq_len " +
      std::to_string(spec.model.seq_len) + ") need at least " + Bytes(e.total()) + " per rank, " +
      Bytes(need) + " for the " + std::to_string(std::max(1, ranks_on_host)) +
      " ranks on this host, over the " + Bytes(available_bytes) + " of the worker's " + flag +
      " (hint: use a smaller model, or more tp_size/dp_shard_size to shard it)");
}

Status CheckJobFitsHost(const JobSpec& spec, const ParallelDims& mesh, int ranks_on_host,
                        double host_bytes, double rank_bytes) {
  if (host_bytes <= 0) return OkStatus();
  const RankMemoryEstimate e = EstimateRankMemory(spec, mesh);
  const int ranks = std::max(1, ranks_on_host);
  const double per_rank = rank_bytes > 0 ? rank_bytes : e.total();
  const double need = per_rank * ranks;
  if (need <= host_bytes) return OkStatus();
  // Name the field behind the largest term: the blocks (d_model² per layer), the embedding
  // (vocab·d_model) or one micro-batch's activations.
  const ModelSpec& m = spec.model;
  const double d = std::max(0, m.d_model);
  const double blocks = static_cast<double>(std::max(0, m.n_layer)) * 12 * d * d;
  const double embedding = static_cast<double>(std::max(0, m.vocab_size)) * d;
  std::string field = "model.d_model";
  std::string fix = "use a smaller model.d_model or model.n_layer";
  if (e.activation_bytes > e.state_bytes) {
    field = "train.micro_batch_size";
    fix =
        "use a smaller train.micro_batch_size or model.seq_len (gradient accumulation keeps "
        "the global batch)";
  } else if (embedding > blocks) {
    field = "model.vocab_size";
    fix = "use a smaller model.vocab_size or model.d_model";
  } else if (m.n_layer > m.d_model) {
    field = "model.n_layer";
  }
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", e.parameters);
  std::string message =
      field + ": n_layer " + std::to_string(m.n_layer) + ", d_model " + std::to_string(m.d_model) +
      ", vocab_size " + std::to_string(m.vocab_size) + ", seq_len " + std::to_string(m.seq_len) +
      " make " + params + " parameters; one rank needs " +
      (rank_bytes > 0
           ? Bytes(per_rank) + " (the engine's memory model over " + mesh.ToString() + ")"
           : "at least " + Bytes(e.total()) +
                 " (float32 parameters, gradients and AdamW "
                 "moments over " +
                 mesh.ToString() +
                 ", and one micro-batch's "
                 "activations)");
  if (ranks > 1) message += ", " + Bytes(need) + " for the " + std::to_string(ranks) + " ranks";
  message += ", more than this host's " + Bytes(host_bytes) + " of memory (hint: " + fix +
             ", or shard it with more tp_size/dp_shard_size over more hosts)";
  return InvalidArgumentError(message);
}

}  // namespace meshrun
