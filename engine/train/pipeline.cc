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
  whole.n_layer = 1;  // every block costs the same: the first one's parameters are the cost
  PipelineCosts c;
  for (const ParamInfo& p : GPT2ParamLayout(whole)) {
    const double n = static_cast<double>(p.numel);
    if (p.unit == 0) {
      c.embedding += 6 * n;
      // The tied head multiplies by the token table.
      if (whole.tie_embeddings && p.role == ParamRole::kTokenEmbedding) c.head += 6 * n;
    } else if (p.layer == 0) {
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

std::vector<PipeOp> ZeroBubbleSchedule(int stages, int stage, int micro_batches) {
  std::vector<PipeOp> ops;
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int forward = 0, backward = 0, weight = 0;
  // Each B is followed by the W of the micro-batch `stage` backwards before it.
  auto input_grad = [&] {
    ops.push_back({PipeOpKind::kBackward, backward++});
    if (backward - weight > stage) ops.push_back({PipeOpKind::kWeight, weight++});
  };
  for (; forward < warmup; ++forward) ops.push_back({PipeOpKind::kForward, forward});
  while (forward < micro_batches) {
    ops.push_back({PipeOpKind::kForward, forward++});
    input_grad();
  }
  while (backward < micro_batches) input_grad();
  while (weight < micro_batches) ops.push_back({PipeOpKind::kWeight, weight++});
  return ops;
}

int MaxPendingWeightGrads(const std::vector<PipeOp>& ops) {
  int pending = 0, most = 0;
  bool split = false;
  for (const PipeOp& op : ops) split = split || op.kind == PipeOpKind::kWeight;
  if (!split) return 0;
  for (const PipeOp& op : ops) {
    if (op.kind == PipeOpKind::kBackward) most = std::max(most, ++pending);
    if (op.kind == PipeOpKind::kWeight) --pending;
  }
  return most;
}

bool PipelineKeepsActivations(const JobSpec& spec) {
  return spec.parallelism.pp_size > 1 && CheckpointingOf(spec.train) == Checkpointing::kNone;
}

std::vector<int> MaxKeptForwards(const std::vector<PipeOp>& ops, int virtual_stages) {
  std::vector<int> kept(static_cast<size_t>(virtual_stages), 0), most(kept.size(), 0);
  for (const PipeOp& op : ops) {
    const size_t k = static_cast<size_t>(op.chunk);
    if (op.kind == PipeOpKind::kForward) most[k] = std::max(most[k], ++kept[k]);
    // A backward without a forward before it (the last chunk's) kept nothing.
    if (op.kind == PipeOpKind::kBackward && kept[k] > 0) --kept[k];
  }
  return most;
}

int MaxKeptForwardsAtOnce(const std::vector<PipeOp>& ops) {
  int chunks = 1;
  for (const PipeOp& op : ops) chunks = std::max(chunks, op.chunk + 1);
  std::vector<int> kept(static_cast<size_t>(chunks), 0);
  int total = 0, most = 0;
  for (const PipeOp& op : ops) {
    const size_t k = static_cast<size_t>(op.chunk);
    if (op.kind == PipeOpKind::kForward) {
      ++kept[k];
      most = std::max(most, ++total);
    }
    if (op.kind == PipeOpKind::kBackward && kept[k] > 0) {
      --kept[k];
      --total;
    }
  }
  return most;
}

std::vector<PipeOp> InterleavedSchedule(int stages, int stage, int micro_batches,
                                        int virtual_stages) {
  const int P = stages, v = virtual_stages, total = micro_batches * v;
  // Megatron's order: the k-th forward (backward) of a rank runs chunk (k mod P·v) / P (reversed
  // for backwards) on micro-batch (k / (P·v))·P + k mod P.
  auto op = [&](PipeOpKind kind, int k) {
    int chunk = (k % (P * v)) / P;
    if (kind == PipeOpKind::kBackward) chunk = v - 1 - chunk;
    return PipeOp{kind, (k / (P * v)) * P + k % P, chunk};
  };
  const int warmup = std::min((P - stage - 1) * 2 + (v - 1) * P, total);
  std::vector<PipeOp> ops;
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back(op(PipeOpKind::kForward, forward));
  while (forward < total) {
    ops.push_back(op(PipeOpKind::kForward, forward++));
    ops.push_back(op(PipeOpKind::kBackward, backward++));
  }
  while (backward < total) ops.push_back(op(PipeOpKind::kBackward, backward++));
  return ops;
}

std::vector<PipeOp> PipelineOps(PpSchedule schedule, int stages, int stage, int micro_batches,
                                int virtual_stages) {
  const int v = schedule == PpSchedule::kInterleaved1F1B ? virtual_stages : 1;
  std::vector<PipeOp> ops = v > 1 ? InterleavedSchedule(stages, stage, micro_batches, v)
                            : schedule == PpSchedule::kZeroBubble
                                ? ZeroBubbleSchedule(stages, stage, micro_batches)
                                : OneFOneBSchedule(stages, stage, micro_batches);
  if (stage != stages - 1) return ops;
  std::vector<PipeOp> kept;
  for (const PipeOp& op : ops) {
    if (!(op.kind == PipeOpKind::kForward && op.chunk == v - 1)) kept.push_back(op);
  }
  return kept;
}

StatusOr<PipeTimetable> BuildTimetable(const std::vector<std::vector<PipeOp>>& ops, int stages,
                                       int virtual_stages, int micro_batches) {
  const int P = stages, G = stages * virtual_stages, M = micro_batches;
  // The slot after which each (pipeline chunk, micro-batch)'s forward / backward was done; −1:
  // not yet.
  std::vector<int> fwd(static_cast<size_t>(G) * M, -1), bwd(fwd.size(), -1);
  auto at = [&](int g, int m) { return static_cast<size_t>(g) * M + m; };
  std::vector<size_t> next(P, 0);
  PipeTimetable table;
  size_t left = 0;
  for (const auto& list : ops) left += list.size();
  for (int t = 0; left > 0; ++t) {
    std::vector<int> slot(P, -1);
    for (int p = 0; p < P; ++p) {
      if (next[p] >= ops[p].size()) continue;
      const PipeOp& op = ops[p][next[p]];
      const int g = op.chunk * P + p;
      auto done = [&](const std::vector<int>& when, int chunk) {
        return when[at(chunk, op.micro)] >= 0 && when[at(chunk, op.micro)] < t;
      };
      bool ready;
      if (op.kind == PipeOpKind::kWeight) {
        ready = done(bwd, g);
      } else if (op.kind == PipeOpKind::kForward) {
        ready = g == 0 || done(fwd, g - 1);
      } else if (g == G - 1) {
        ready = G == 1 || done(fwd, g - 1);
      } else {
        ready = done(bwd, g + 1);
      }
      if (!ready) continue;
      slot[p] = static_cast<int>(next[p]);
    }
    bool progress = false;
    for (int p = 0; p < P; ++p) {
      if (slot[p] < 0) continue;
      const PipeOp& op = ops[p][static_cast<size_t>(slot[p])];
      if (op.kind != PipeOpKind::kWeight) {
        (op.kind == PipeOpKind::kForward ? fwd : bwd)[at(op.chunk * P + p, op.micro)] = t;
      }
      ++next[p];
      --left;
      progress = true;
    }
    if (!progress) {
      return InternalError("pipeline schedule: no rank can run its next operation at slot " +
                           std::to_string(t) + " (a schedule whose operations wait on each other)");
    }
    table.slots.push_back(std::move(slot));
  }
  return table;
}

namespace {

// The receive buffers a backward of rank `stage` gives back: its input (every pipeline chunk but
// the first) and its output's gradient (every chunk but the last).
int BuffersFreedBy(const PipeOp& op, int stages, int virtual_stages, int stage) {
  if (op.kind != PipeOpKind::kBackward) return 0;
  const int g = op.chunk * stages + stage, G = stages * virtual_stages;
  return (g > 0 ? 1 : 0) + (g < G - 1 ? 1 : 0);
}

// held[j]: the buffers `recvs` hold while operation j runs (after the receives posted before it).
std::vector<int> HeldBeforeEachOp(const std::vector<PipeOp>& stage_ops,
                                  const std::vector<PipeRecv>& recvs, int stages,
                                  int virtual_stages, int stage) {
  std::vector<int> held(stage_ops.size(), 0);
  int now = 0;
  size_t next = 0;
  for (size_t j = 0; j < stage_ops.size(); ++j) {
    for (; next < recvs.size() && recvs[next].before_op <= static_cast<int>(j); ++next) ++now;
    held[j] = now;
    now -= BuffersFreedBy(stage_ops[j], stages, virtual_stages, stage);
  }
  return held;
}

}  // namespace

std::vector<PipeRecv> PipelineReceives(const std::vector<std::vector<PipeOp>>& ops,
                                       const PipeTimetable& table, int stages, int virtual_stages,
                                       int stage) {
  const int P = stages;
  const int next = (stage + 1) % P, prev = (stage + P - 1) % P;
  const std::vector<PipeOp>& mine = ops[static_cast<size_t>(stage)];
  auto op_at = [&](size_t t, int p) -> const PipeOp* {
    const int i = table.slots[t][static_cast<size_t>(p)];
    return i < 0 ? nullptr : &ops[static_cast<size_t>(p)][static_cast<size_t>(i)];
  };
  // The lockstep executor's posts: after the slot whose operation produced each, i.e. before the
  // rank's first operation in a later slot (Trainer's timetable loop, CountPipelineBuffers).
  std::vector<PipeRecv> recvs;
  int own = 0;  // the rank's operations in slots up to t
  for (size_t t = 0; t < table.slots.size(); ++t) {
    if (table.slots[t][static_cast<size_t>(stage)] >= 0) ++own;
    if (const PipeOp* from = op_at(t, prev);
        from != nullptr && from->kind == PipeOpKind::kForward) {
      recvs.push_back({false, stage == 0 ? from->chunk + 1 : from->chunk, from->micro, own});
    }
    if (const PipeOp* from = op_at(t, next);
        from != nullptr && from->kind == PipeOpKind::kBackward && from->chunk * P + next > 0) {
      recvs.push_back({true, stage == P - 1 ? from->chunk - 1 : from->chunk, from->micro, own});
    }
  }
  const std::vector<int> lockstep = HeldBeforeEachOp(mine, recvs, stages, virtual_stages, stage);
  const int budget = lockstep.empty() ? 0 : *std::max_element(lockstep.begin(), lockstep.end());
  // Each receive, in order, moves as early as the budget allows (not before the one before it,
  // so the order holds); moving receive i from a to b holds one more buffer during b … a − 1,
  // where the later receives are still at their lockstep posts (all ≥ a).
  std::vector<int> held = lockstep;
  int earliest = 0;
  for (PipeRecv& r : recvs) {
    const int latest = std::min(r.before_op, static_cast<int>(mine.size()));
    int b = latest;
    while (b > earliest && held[static_cast<size_t>(b - 1)] + 1 <= budget) --b;
    for (int j = b; j < latest; ++j) ++held[static_cast<size_t>(j)];
    r.before_op = b;
    earliest = b;
  }
  return recvs;
}

int PipelineReceiveBuffersHeld(const std::vector<PipeOp>& stage_ops,
                               const std::vector<PipeRecv>& recvs, int stages, int virtual_stages,
                               int stage) {
  const std::vector<int> held = HeldBeforeEachOp(stage_ops, recvs, stages, virtual_stages, stage);
  return held.empty() ? 0 : *std::max_element(held.begin(), held.end());
}

int PipelineSendBuffers(const std::vector<PipeOp>& stage_ops, int stages, int virtual_stages,
                        int stage) {
  const int G = stages * virtual_stages;
  int sends = 0;
  for (const PipeOp& op : stage_ops) {
    const int g = op.chunk * stages + stage;
    if ((op.kind == PipeOpKind::kForward && g < G - 1) ||
        (op.kind == PipeOpKind::kBackward && g > 0)) {
      ++sends;
    }
  }
  return std::min(kPipeSendBuffers, sends);
}

double PipelineBubbleTheory(PpSchedule schedule, int stages, int micro_batches,
                            int virtual_stages) {
  return PipelineBubbleTheory(schedule, stages, micro_batches, virtual_stages, 0, 0);
}

double PipelineBubbleTheory(PpSchedule schedule, int stages, int micro_batches, int virtual_stages,
                            double forward_backward, double weight) {
  const double P = stages, M = micro_batches;
  if (schedule == PpSchedule::kZeroBubble) {
    // Equal times unless both are measured: F + B = 2t, W = t.
    if (forward_backward <= 0 || weight <= 0) forward_backward = 2, weight = 1;
    const double bubble = (P - 1) * std::max(0.0, forward_backward - weight);
    return bubble / (M * (forward_backward + weight) + bubble);
  }
  const double v = schedule == PpSchedule::kInterleaved1F1B ? virtual_stages : 1;
  return (P - 1) / (v * M + P - 1);
}

std::string ScheduleText(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const PipeOp& op : ops) {
    if (!out.empty()) out += ' ';
    out += (op.kind == PipeOpKind::kForward    ? "F"
            : op.kind == PipeOpKind::kBackward ? "B"
                                               : "W") +
           std::to_string(op.micro);
    if (op.chunk > 0) out += "." + std::to_string(op.chunk);
  }
  return out;
}

}  // namespace meshrun
