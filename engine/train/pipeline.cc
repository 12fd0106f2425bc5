// Stage split and schedules of pipeline parallelism (pipeline.h).
#include "engine/train/pipeline.h"

#include <algorithm>
#include <limits>

namespace meshrun {

PipelineCosts PipelineCostsOf(const GPT2Config& whole_cfg, int seq_len) {
  GPT2Config whole = whole_cfg.WholeModel();
  whole.tp_size = 1;
  whole.tp_rank = 0;
  whole.fsdp_size = 1;
  PipelineCosts c;
  const std::string first_layer = whole.llama() ? "layers.0." : "h.0.";
  for (const ParamInfo& p : GPT2ParamLayout(whole)) {
    const double n = static_cast<double>(p.numel);
    if (p.unit == 0) {
      c.embedding += 6 * n;
      if (p.name == HeadWeightName(whole)) c.head += 6 * n;  // the tied head multiplies by it
    } else if (p.name.rfind(first_layer, 0) == 0) {
      c.layer += 6 * n;
    } else if (p.unit == whole.n_layer + 1) {
      c.head += 6 * n;
    }
  }
  c.layer += 12.0 * whole.d_model * seq_len;
  return c;
}

std::vector<int> SplitLayersByCost(const GPT2Config& whole, int seq_len, int chunks) {
  const int L = whole.n_layer;
  const PipelineCosts c = PipelineCostsOf(whole, seq_len);
  // The cost of a chunk of layers [i, j) that is chunk k of `chunks`.
  auto cost = [&](int i, int j, int k) {
    double x = (j - i) * c.layer;
    if (k == 0) x += c.embedding;
    if (k == chunks - 1) x += c.head;
    return x;
  };
  // best[k][i]: the least largest cost of the first i layers in chunks 0..k-1.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(chunks + 1, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int>> cut(chunks + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int k = 1; k <= chunks; ++k) {
    for (int i = k; i <= L - (chunks - k); ++i) {
      // The last of these k chunks holds layers [j, i); prefer the latest j among equals, which
      // leaves the earlier chunks more layers.
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        const double v = std::max(best[k - 1][j], cost(j, i, k - 1));
        if (v < best[k][i] * (1 - 1e-12) || (v <= best[k][i] * (1 + 1e-12) && j > cut[k][i])) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> layers(chunks);
  int i = L;
  for (int k = chunks; k >= 1; --k) {
    const int j = cut[k][i];
    layers[k - 1] = i - j;
    i = j;
  }
  return layers;
}

std::vector<int> PipelineLayers(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  if (!p.pp_layers.empty()) return p.pp_layers;
  const int chunks = std::max(1, p.pp_size) * std::max(1, p.pp_virtual_stages);
  return SplitLayersByCost(GPT2ConfigOf(spec.model), spec.model.seq_len, chunks);
}

std::vector<PipeOp> OneFOneBSchedule(int stages, int stage, int micro_batches) {
  std::vector<PipeOp> ops;
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back({PipeOpKind::kForward, forward});
  while (forward < micro_batches) {
    ops.push_back({PipeOpKind::kForward, forward++});
    ops.push_back({PipeOpKind::kBackward, backward++});
  }
  while (backward < micro_batches) ops.push_back({PipeOpKind::kBackward, backward++});
  return ops;
}

std::string ScheduleText(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const PipeOp& op : ops) {
    if (!out.empty()) out += ' ';
    out += (op.kind == PipeOpKind::kForward ? "F" : "B") + std::to_string(op.micro);
  }
  return out;
}

}  // namespace meshrun
