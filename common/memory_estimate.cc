// EstimateRankMemory and CheckRankMemory (see memory_estimate.h).
#include "common/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/train/optimizer_states.h"  // header-only: the optimizers' state table

namespace meshrun {
namespace {

std::string Bytes(double b) {
  char buf[64];
  if (b >= 1e15) {
    std::snprintf(buf, sizeof buf, "%.3g bytes", b);
  } else if (b >= 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
  } else if (b >= 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f bytes", b);
  }
  return buf;
}

// "n_layer 2, d_model 64, vocab_size 256, seq_len 64", and the Llama family's MLP width and
// key/value heads.
std::string Sizes(const ModelSpec& m) {
  std::string out = "n_layer " + std::to_string(m.n_layer) + ", d_model " +
                    std::to_string(m.d_model) + ", vocab_size " + std::to_string(m.vocab_size) +
                    ", seq_len " + std::to_string(m.seq_len);
  if (m.family().grouped_query) {
    out += ", d_ff " + (m.d_ff > 0 ? std::to_string(m.d_ff) : "4·d_model") + ", n_kv_head " +
           std::to_string(m.n_kv_head > 0 ? m.n_kv_head : m.n_head);
  }
  return out;
}

}  // namespace

RankMemoryEstimate EstimateRankMemory(const JobSpec& spec, const ParallelDims& mesh) {
  // Every size in double: a field of 2^31−1 gives a huge figure, never a wrapped one.
  const ModelSpec& m = spec.model;
  // The Llama layout (RMSNorm, gated MLP, no linear biases): Llama and Gemma.
  const bool llama = m.family().grouped_query;
  const double C = std::max(0, m.d_model);
  double L = std::max(0, m.n_layer);
  const double V = std::max(0, m.vocab_size), S = std::max(0, m.seq_len);
  const double H = std::max(1, m.n_head), K = m.n_kv_head > 0 ? m.n_kv_head : H;
  const double F =
      llama && m.d_ff > 0 ? static_cast<double>(m.d_ff) : 4 * C;  // ModelSpec::ff(), unwrapped
  const double D =
      m.head_dim > 0 && m.family().free_head_dim ? m.head_dim : std::floor(C / H);  // head_dim
  const double Cq = H * D, Ck = K * D, Wqkv = Cq + 2 * Ck;
  RankMemoryEstimate e;
  // The parameters of engine/model/gpt2_layout.cc's GPT2ParamLayout.
  if (llama) {
    // Embedding; per block two RMSNorms, fused q|k|v (and its bias), o_proj, gate|up, down;
    // the final norm.
    const double block = 2 * C + Wqkv * C + (m.attention_bias ? Wqkv : 0) + C * Cq + 3 * F * C;
    e.parameters = V * C + L * block + C;
  } else {
    // Token and position embeddings; per block two LayerNorms, c_attn, c_proj, c_fc, c_proj
    // with their biases (12·C² + 13·C at F = 4·C); the final LayerNorm.
    const double block = 4 * C + Wqkv * C + Wqkv + C * Cq + C + 2 * F * C + F + C;
    e.parameters = V * C + S * C + L * block + 2 * C;
  }
  if (!m.tie_embeddings) e.parameters += V * C;  // the head's own matrix
  const double tp = mesh.tp(), cp = mesh.cp();
  // Under pipeline parallelism a rank holds one stage: an average stage's share of the
  // parameters and layers (the largest stage holds at least that much, so the figure stays a
  // lower bound).
  const double pp = mesh.pp();
  const double shards = tp * mesh.dp_shard() * cp * pp;
  // Parameters, gradients and the optimizer's own state (engine/train/optimizer_states.h).
  e.state_bytes = e.parameters / shards * 4 /*bytes*/ *
                  (2 + static_cast<double>(OptimizerStateNames(OptimizerOf(spec.train)).size()));
  // One micro-batch's activations, buffer by buffer as the engine's memory model counts them
  // (engine/train/memory_model.cc; tests/engine/train/memory_estimate_model_test.cc holds the
  // two together): N tokens on this rank, the head's logits in chunks of 2^23 floats.
  const double N = std::max(1, spec.train.micro_batch_size) * std::floor(S / cp);
  // Cl: the attention width on this rank, heads · head_dim (d_model/tp unless head_dim is free).
  const double Vl = std::ceil(V / tp), Hl = std::floor(H / tp), Cl = Hl * D;
  const double Fl = std::floor(F / tp), Kl = std::floor(K / tp);
  const double Wl = (Hl + 2 * Kl) * D, Gl = llama ? 2 * Fl : Fl, means = llama ? 0 : 1;
  const double head_rows = std::max(1.0, std::min(N, std::floor(8388608.0 / std::max(1.0, Vl))));
  const double root = N * C * 2 + N * (1 + means) + head_rows * Vl + N;
  const double layer = N * C * 4 + N * 2 * (1 + means) + N * Cl * 5 + N * Hl + N * (Gl + Fl);
  const double scratch = N * Wl * 2 + N * C * 2 + N * Cl * 5 + N * (Gl + Fl);
  const std::string& ac = spec.train.activation_checkpointing;
  L /= pp;  // the layers of an average stage
  double acts = root + scratch;
  if (ac == "full") {
    acts += layer + L * N * C;
  } else if (ac == "selective") {
    acts += layer + L * (N * C * 2 + N * Cl * 3 + N * Gl);
  } else {
    acts += L * layer;
  }
  e.activation_bytes = acts * 4;
  return e;
}

Status CheckRankMemory(const JobSpec& spec, const ParallelDims& mesh, int ranks_on_host,
                       double available_bytes, const std::string& flag, double rank_bytes) {
  if (available_bytes <= 0) return OkStatus();
  const RankMemoryEstimate e = EstimateRankMemory(spec, mesh);
  const double per_rank = rank_bytes > 0 ? rank_bytes : e.total();
  const double need = per_rank * std::max(1, ranks_on_host);
  if (need <= available_bytes) return OkStatus();
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", e.parameters);
  return ResourceExhaustedError(
      "model: " + std::string(params) + " parameters (" + Sizes(spec.model) + ") need " +
      (rank_bytes > 0 ? Bytes(per_rank) + " per rank (the engine's own step, counted)"
                      : "at least " + Bytes(e.total()) + " per rank") +
      (ranks_on_host > 1 ? ", " + Bytes(need) + " for the " + std::to_string(ranks_on_host) +
                               " ranks on this host"
                         : std::string()) +
      ", over the " + Bytes(available_bytes) + " of the worker's " + flag +
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
  // Name the field behind the largest term: the blocks (d_model² per layer), a Llama MLP
  // (d_ff·d_model per layer), the embedding (vocab·d_model) or one micro-batch's activations.
  const ModelSpec& m = spec.model;
  const double d = std::max(0, m.d_model), layers = std::max(0, m.n_layer);
  const double blocks = layers * 4 * d * d;
  const bool llama = m.family().grouped_query;
  const double mlp = layers * (llama ? 3 : 2) * d * (llama && m.d_ff > 0 ? m.d_ff : 4 * d);
  const double embedding = static_cast<double>(std::max(0, m.vocab_size)) * d;
  std::string field = "model.d_model";
  std::string fix = "use a smaller model.d_model or model.n_layer";
  if (e.activation_bytes > e.state_bytes) {
    field = "train.micro_batch_size";
    fix =
        "use a smaller train.micro_batch_size or model.seq_len (gradient accumulation keeps "
        "the global batch)";
  } else if (embedding > blocks + mlp) {
    field = "model.vocab_size";
    fix = "use a smaller model.vocab_size or model.d_model";
  } else if (llama && m.d_ff > 0 && mlp > 2 * blocks) {
    field = "model.d_ff";
    fix = "use a smaller model.d_ff";
  } else if (m.n_layer > m.d_model) {
    field = "model.n_layer";
  }
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", e.parameters);
  std::string message =
      field + ": " + Sizes(m) + " make " + params + " parameters; one rank needs " +
      (rank_bytes > 0
           ? Bytes(per_rank) + " (the engine's own step, counted, over " + mesh.ToString() + ")"
           : "at least " + Bytes(e.total()) +
                 " (float32 parameters, gradients and the optimizer's state over " +
                 mesh.ToString() +
                 ", and one micro-batch's "
                 "activations)");
  if (ranks > 1) message += ", " + Bytes(need) + " for the " + std::to_string(ranks) + " ranks";
  message += ", more than this host's " + Bytes(host_bytes) + " of memory (hint: " + fix +
             ", or shard it with more tp_size/dp_shard_size over more hosts)";
  return InvalidArgumentError(message);
}

}  // namespace meshrun
