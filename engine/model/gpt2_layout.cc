// The parameters of a model config: their names, shapes and order (GPT2ParamLayout), the
// FSDP units they form, their global indices under tp, the FLOPs per token, and their
// deterministic initial values. The compute is in gpt2.cc.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "engine/model/gpt2.h"

namespace meshrun {
GPT2Config GPT2ConfigOf(const ModelSpec& model) {
  GPT2Config cfg;
  cfg.arch = ArchOf(model);
  cfg.vocab_size = model.vocab_size;
  cfg.n_layer = model.n_layer;
  cfg.n_head = model.n_head;
  cfg.n_kv_head = model.kv_heads();
  cfg.d_model = model.d_model;
  cfg.attn_head_dim = model.family().free_head_dim ? model.head_dim : 0;
  cfg.d_ff = model.ff();
  cfg.max_seq_len = model.seq_len;
  cfg.ln_eps = model.norm_eps;
  cfg.rope_theta = model.rope_theta;
  cfg.rope_scaling.llama3 = RopeScalingOf(model) == RopeScalingType::kLlama3;
  cfg.rope_scaling.factor = model.rope_scaling_factor;
  cfg.rope_scaling.low_freq_factor = model.rope_scaling_low_freq_factor;
  cfg.rope_scaling.high_freq_factor = model.rope_scaling_high_freq_factor;
  cfg.rope_scaling.original_max_position_embeddings =
      model.rope_scaling_original_max_position_embeddings;
  cfg.tie_embeddings = model.tie_embeddings;
  cfg.attention_bias = model.attention_bias;
  cfg.sliding_window = model.sliding_window;
  return cfg;
}

int64_t GPT2Config::vocab_first() const {
  const int64_t per = (int64_t{vocab_size} + tp_size - 1) / tp_size;
  return std::min<int64_t>(vocab_size, per * tp_rank);
}

int64_t GPT2Config::vocab_rows() const {
  const int64_t per = (int64_t{vocab_size} + tp_size - 1) / tp_size;
  return std::min<int64_t>(vocab_size, per * (tp_rank + 1)) - vocab_first();
}

TpSplit TpSplitOf(ParamRole role) {
  switch (role) {
    case ParamRole::kTokenEmbedding:
    case ParamRole::kHead: return TpSplit::kVocab;
    case ParamRole::kQkvWeight:
    case ParamRole::kQkvBias:
    case ParamRole::kUpWeight:
    case ParamRole::kUpBias: return TpSplit::kColumn;
    case ParamRole::kOutWeight:
    case ParamRole::kDownWeight: return TpSplit::kRow;
    default: return TpSplit::kReplicated;  // norms, positions, biases added after a row's sum
  }
}

std::vector<ParamInfo> GPT2ParamLayout(const GPT2Config& cfg) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size, L = cfg.n_layer;
  const int64_t tp = cfg.tp_size, t = cfg.tp_rank, pad = std::max(1, cfg.fsdp_size);
  const double w_std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * L);
  std::vector<ParamInfo> out;
  int64_t offset = 0;
  int unit = 0;
  int layer = -1;  // the local layer being laid out (-1: the embedding and final units)
  using R = ParamRole;
  const int64_t Vf = cfg.vocab_first(), Vl = cfg.vocab_rows();
  // The boxes of a `global`-shaped parameter of `role` this tp rank holds, by the plan
  // (TpSplitOf; Megatron's splits, docs/model.md): a column split takes the rank's 1/tp of the
  // rows of each fused part (`parts`: the parts' global rows, q|k|v by heads and kv heads,
  // gate|up by units; empty: one part), a row split its 1/tp of the columns, a vocabulary split
  // its rows of the vocabulary (the last rank's may be fewer).
  auto boxes_of = [&](R role, const std::vector<int64_t>& global, std::vector<int64_t> parts) {
    const Box whole{std::vector<int64_t>(global.size(), 0), global};
    std::vector<Box> boxes;
    switch (TpSplitOf(role)) {
      case TpSplit::kReplicated: boxes.push_back(whole); break;
      case TpSplit::kColumn: {
        if (parts.empty()) parts = {global[0]};
        int64_t start = 0;
        for (int64_t rows : parts) {
          Box b = whole;
          b.offset[0] = start + t * (rows / tp);
          b.shape[0] = rows / tp;
          boxes.push_back(b);
          start += rows;
        }
        break;
      }
      case TpSplit::kRow: {
        Box b = whole;
        b.offset[1] = t * (global[1] / tp);
        b.shape[1] = global[1] / tp;
        boxes.push_back(b);
        break;
      }
      case TpSplit::kVocab: {
        Box b = whole;
        b.offset[0] = Vf;
        b.shape[0] = Vl;
        boxes.push_back(b);
        break;
      }
    }
    return boxes;
  };
  // A parameter of `role` holding its boxes of a tensor of `global` shape, concatenated along
  // dim 0.
  auto add = [&](R role, std::string name, std::vector<int64_t> global, double std, double value,
                 std::vector<int64_t> parts = {}) {
    ParamInfo p;
    p.name = std::move(name);
    p.role = role;
    p.layer = layer;
    p.global_shape = global;
    std::vector<Box> boxes = boxes_of(role, global, std::move(parts));
    p.shape = boxes[0].shape;
    for (size_t b = 1; b < boxes.size(); ++b) p.shape[0] += boxes[b].shape[0];
    p.tp_sharded = p.shape != p.global_shape;
    p.boxes = std::move(boxes);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= d;
    p.offset = offset;
    p.decay = p.global_shape.size() >= 2;
    p.unit = unit;
    p.init_std = std;
    p.init_value = value;
    offset += p.numel;
    out.push_back(std::move(p));
  };
  auto end_unit = [&]() {
    offset = (offset + pad - 1) / pad * pad;
    ++unit;
  };
  const int64_t D = cfg.head_dim();
  const int64_t Cq = int64_t{cfg.n_head} * D, Ck = int64_t{cfg.kv_heads()} * D;
  const int64_t F = cfg.ff(), Wqkv = Cq + 2 * Ck;
  const std::vector<int64_t> qkv_parts = {Cq, Ck, Ck}, gate_up_parts = {F, F};
  // A pipeline stage holds its layers and, at the ends, the embedding unit and the final unit
  // (units stay numbered 0, 1 … layers, layers + 1; one a stage lacks is empty).
  std::vector<int64_t> stage_layers;  // the global index of each local layer, in order
  for (int l = 0; l < cfg.stage_layers(); ++l) stage_layers.push_back(cfg.GlobalLayer(l));
  const bool embedding = cfg.holds_embedding(), last = cfg.stage_last;
  if (!cfg.llama()) {
    if (embedding) {
      add(R::kTokenEmbedding, "wte", {V, C}, w_std, 0);
      // A tied last stage holds the position table too (unused there), so that its embedding
      // unit is laid out, sharded and updated exactly as the first stage's (decision 0054).
      add(R::kPositionEmbedding, "wpe", {cfg.max_seq_len, C}, w_std, 0);
    }
    end_unit();
    for (int64_t l : stage_layers) {
      ++layer;
      const std::string h = "h." + std::to_string(l) + ".";
      add(R::kNorm1Weight, h + "ln_1.weight", {C}, 0, 1);
      add(R::kNorm1Bias, h + "ln_1.bias", {C}, 0, 0);
      add(R::kQkvWeight, h + "attn.c_attn.weight", {Wqkv, C}, w_std, 0, qkv_parts);
      add(R::kQkvBias, h + "attn.c_attn.bias", {Wqkv}, 0, 0, qkv_parts);
      add(R::kOutWeight, h + "attn.c_proj.weight", {C, Cq}, proj_std, 0);
      add(R::kOutBias, h + "attn.c_proj.bias", {C}, 0, 0);
      add(R::kNorm2Weight, h + "ln_2.weight", {C}, 0, 1);
      add(R::kNorm2Bias, h + "ln_2.bias", {C}, 0, 0);
      add(R::kUpWeight, h + "mlp.c_fc.weight", {F, C}, w_std, 0);
      add(R::kUpBias, h + "mlp.c_fc.bias", {F}, 0, 0);
      add(R::kDownWeight, h + "mlp.c_proj.weight", {C, F}, proj_std, 0);
      add(R::kDownBias, h + "mlp.c_proj.bias", {C}, 0, 0);
      end_unit();
    }
    layer = -1;
    if (last) {
      add(R::kFinalNormWeight, "ln_f.weight", {C}, 0, 1);
      add(R::kFinalNormBias, "ln_f.bias", {C}, 0, 0);
    }
  } else {
    // A (1 + w) RMSNorm stores w: 0 is the identity scale.
    const double norm_init = cfg.family().norm == NormKind::kRMSNormOnePlus ? 0 : 1;
    if (embedding) add(R::kTokenEmbedding, "embed_tokens", {V, C}, w_std, 0);
    end_unit();
    for (int64_t l : stage_layers) {
      ++layer;
      const std::string h = "layers." + std::to_string(l) + ".";
      add(R::kNorm1Weight, h + "input_layernorm.weight", {C}, 0, norm_init);
      add(R::kQkvWeight, h + "self_attn.qkv.weight", {Wqkv, C}, w_std, 0, qkv_parts);
      if (cfg.attention_bias) add(R::kQkvBias, h + "self_attn.qkv.bias", {Wqkv}, 0, 0, qkv_parts);
      add(R::kOutWeight, h + "self_attn.o_proj.weight", {C, Cq}, proj_std, 0);
      add(R::kNorm2Weight, h + "post_attention_layernorm.weight", {C}, 0, norm_init);
      add(R::kUpWeight, h + "mlp.gate_up.weight", {2 * F, C}, w_std, 0, gate_up_parts);
      add(R::kDownWeight, h + "mlp.down_proj.weight", {C, F}, proj_std, 0);
      end_unit();
    }
    layer = -1;
    if (last) add(R::kFinalNormWeight, "norm.weight", {C}, 0, norm_init);
  }
  if (last && !cfg.tie_embeddings) add(R::kHead, "lm_head", {V, C}, w_std, 0);
  end_unit();
  return out;
}

std::vector<UnitInfo> GPT2Units(const GPT2Config& cfg, const std::vector<ParamInfo>& layout) {
  const int64_t pad = std::max(1, cfg.fsdp_size);
  // The embedding unit, one per layer of the stage, the final unit (some may be empty on a
  // pipeline stage: offset where the next would start, padded 0).
  std::vector<UnitInfo> units(static_cast<size_t>(cfg.stage_layers()) + 2);
  std::vector<int64_t> end(units.size(), 0);
  for (size_t u = 0; u < units.size(); ++u) units[u].offset = -1;
  for (const ParamInfo& p : layout) {
    UnitInfo& u = units[p.unit];
    if (u.offset < 0) u.offset = p.offset;
    end[p.unit] = p.offset + p.numel;
  }
  int64_t next = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].offset < 0) {
      units[u].offset = next;
      end[u] = next;
    }
    units[u].padded = (end[u] - units[u].offset + pad - 1) / pad * pad;
    next = units[u].offset + units[u].padded;
  }
  return units;
}

// Global row-major index of local element i of p (its boxes concatenated along dim 0).
int64_t GlobalIndex(const ParamInfo& p, int64_t i) {
  int64_t local_row_size = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) local_row_size *= p.shape[d];
  int64_t row = p.shape.empty() ? 0 : i / local_row_size;
  const int64_t within = p.shape.empty() ? 0 : i % local_row_size;
  for (const Box& b : p.boxes) {
    if (!p.shape.empty() && row >= b.shape[0]) {
      row -= b.shape[0];
      continue;
    }
    // Coordinates inside the box, then in the global tensor.
    std::vector<int64_t> coord(p.shape.size());
    int64_t rem = within;
    for (size_t d = p.shape.size(); d-- > 1;) {
      coord[d] = rem % b.shape[d];
      rem /= b.shape[d];
    }
    if (!coord.empty()) coord[0] = row;
    int64_t g = 0;
    for (size_t d = 0; d < coord.size(); ++d) g = g * p.global_shape[d] + b.offset[d] + coord[d];
    return g;
  }
  return -1;
}

double GPT2FlopsPerToken(const GPT2Config& cfg, int seq_len) {
  double n = 0;
  GPT2Config global = cfg.WholeModel();
  global.tp_size = 1;
  global.tp_rank = 0;
  global.n_layer = 1;  // every block the same: one block's parameters, n_layer times
  // Every parameter but the position table and, with an untied head, the token table (a
  // lookup, no multiply-adds); a tied table counts once, as the head.
  for (const ParamInfo& p : GPT2ParamLayout(global)) {
    if (p.role == ParamRole::kPositionEmbedding) continue;
    if (p.role == ParamRole::kTokenEmbedding && !cfg.tie_embeddings) continue;
    n += static_cast<double>(p.numel) * (p.layer == 0 ? cfg.n_layer : 1);
  }
  return 6.0 * n + 12.0 * cfg.n_layer * (static_cast<double>(cfg.n_head) * cfg.head_dim()) *
                       static_cast<double>(seq_len);
}

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

double InitNormal(uint64_t seed, const std::string& name, int64_t index) {
  // Counter-based: two uniforms from a hash of (seed, name, index), then Box–Muller.
  const uint64_t base = SplitMix64(seed ^ SplitMix64(Fnv1a(name)));
  const uint64_t a = SplitMix64(base + 2 * static_cast<uint64_t>(index));
  const uint64_t b = SplitMix64(base + 2 * static_cast<uint64_t>(index) + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

int64_t HeadChunkRows(int64_t tokens, int64_t vocab) {
  // 2^23 floats (32 MiB) of logits at a time, or all rows when they fit.
  return std::max<int64_t>(
      1, std::min<int64_t>(tokens, (int64_t{1} << 23) / std::max<int64_t>(1, vocab)));
}

}  // namespace meshrun
