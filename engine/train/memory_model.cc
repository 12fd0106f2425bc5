// The memory model, buffer by buffer, in the order of engine/model/gpt2.cc (EnsureActivations,
// the attention's exchange buffers, the FSDP hooks a stage's forward and backward call),
// engine/train/sharding.cc (shards, the gathered-unit pool) and engine/train/trainer.cc (the
// pipeline's receive buffers, the tied embedding's exchange). A change to what any of them
// allocates belongs here too; bench/memory and tests/engine/train/pipeline_memory_test.cc show
// the difference.
#include "engine/train/memory_model.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/model/gpt2.h"
#include "engine/train/optimizer_states.h"
#include "engine/train/pipeline.h"

namespace meshrun {

namespace {

// ShardedState's free list: the smallest free buffer that fits, else a new one. Buffers are
// never returned to the allocator, so the pool's peak is everything it ever allocated.
class PoolSimulation {
 public:
  // Returns the size of the buffer handed out.
  int64_t Acquire(int64_t numel) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (*it >= numel && (best == free_.end() || *it < *best)) best = it;
    }
    if (best == free_.end()) {
      total_ += numel;
      return numel;
    }
    const int64_t size = *best;
    free_.erase(best);
    return size;
  }
  void Release(int64_t& buffer) {
    if (buffer == 0) return;
    free_.push_back(buffer);
    buffer = 0;
  }
  int64_t total() const { return total_; }
  // The free buffers' sizes, sorted: with total(), all that decides what Acquire does next.
  std::vector<int64_t> Sizes() const {
    std::vector<int64_t> sizes = free_;
    std::sort(sizes.begin(), sizes.end());
    return sizes;
  }

 private:
  std::vector<int64_t> free_;
  int64_t total_ = 0;
};

// ShardedState's hooks (engine/train/sharding.cc) on buffer sizes only: the gathered units'
// parameters, their full gradients and the bf16 staging of a gather, from the same free lists.
// prefetch: the backend overlaps (NCCL, i.e. cuda; decision 0052), so the next unit's gather
// starts early and a reduce-scatter stays in flight until the next unit's AfterBackward.
class FsdpSimulation {
 public:
  FsdpSimulation(const std::vector<UnitInfo>& units, bool prefetch, bool bf16, bool reshard)
      : units_(units),
        prefetch_(prefetch),
        bf16_(bf16),
        reshard_(reshard),
        p_buf_(units.size(), 0),
        g_buf_(units.size(), 0),
        staging_(units.size(), 0) {
    for (size_t u = 1; u + 1 < units.size(); ++u) block_ = std::max(block_, units[u].padded);
    for (size_t u = 0; u < units.size(); ++u) largest_ = std::max(largest_, Numel(u));
  }

  void BeforeForward(int u) {
    Gather(u);
    if (prefetch_ && u + 1 < Units()) StartGather(u + 1);
  }
  void AfterForward(int u) {
    if (reshard_) params_.Release(p_buf_[u]);
  }
  void BeforeBackward(int u) {
    if (rs_unit_ == u) DrainReduceScatter();
    Gather(u);
    if (g_buf_[u] == 0) g_buf_[u] = grads_.Acquire(Numel(u));
    const int head = Units() - 1;
    const int next = u == head ? head - 1 : u - 1;
    if (prefetch_ && u != 0 && next >= 1 && next != u) StartGather(next);
  }
  void AfterBackward(int u) {
    DrainReduceScatter();
    params_.Release(p_buf_[u]);
    StartReduceScatter(u);
  }
  // Zero-bubble's split backward of a block (ShardedState::BeforeInputGrad …): B gathers the
  // unit (prefetching as BeforeBackward) and frees it after, taking no gradient buffer; W takes
  // the gradient buffer and reduce-scatters it as AfterBackward does, keeping any parameters.
  void BeforeInputGrad(int u) {
    Gather(u);
    const int head = Units() - 1;
    const int next = u == head ? head - 1 : u - 1;
    if (prefetch_ && u != 0 && next >= 1 && next != u) StartGather(next);
  }
  void AfterInputGrad(int u) { params_.Release(p_buf_[u]); }
  void BeforeWeightGrad(int u) {
    if (rs_unit_ == u) DrainReduceScatter();
    if (g_buf_[u] == 0) g_buf_[u] = grads_.Acquire(Numel(u));
  }
  void AfterWeightGrad(int u) {
    DrainReduceScatter();
    StartReduceScatter(u);
  }
  void DrainReduceScatter() {
    if (rs_unit_ < 0) return;
    rs_unit_ = -1;
    grads_.Release(rs_buf_);
  }
  // Drain, then every gathered unit freed (ReleaseAll: after the update, after an evaluation).
  void ReleaseAll() {
    DrainReduceScatter();
    for (int u = 0; u < Units(); ++u) {
      WaitGather(u);
      params_.Release(p_buf_[u]);
      grads_.Release(g_buf_[u]);
    }
  }

  int64_t params_total() const { return params_.total(); }
  int64_t grads_total() const { return grads_.total(); }
  int64_t staging_total() const { return staging_pool_.total(); }
  // Everything that decides what the next calls allocate.
  auto State() const {
    return std::make_tuple(params_.Sizes(), params_.total(), grads_.Sizes(), grads_.total(),
                           staging_pool_.Sizes(), staging_pool_.total(), p_buf_, g_buf_, staging_,
                           rs_buf_, rs_unit_);
  }

 private:
  int Units() const { return static_cast<int>(units_.size()); }
  // ShardedState::BufferNumel: at least the largest block but for unit 0.
  int64_t Numel(size_t u) const {
    return u == 0 ? units_[u].padded : std::max(units_[u].padded, block_);
  }
  void StartGather(int u) {
    if (p_buf_[u] != 0) return;
    p_buf_[u] = params_.Acquire(Numel(u));
    // bf16 in float elements, always of the largest unit; widened (and freed) when waited for.
    if (bf16_) staging_[u] = staging_pool_.Acquire((largest_ + 1) / 2);
  }
  void WaitGather(int u) { staging_pool_.Release(staging_[u]); }
  void StartReduceScatter(int u) {
    rs_buf_ = g_buf_[u];
    g_buf_[u] = 0;
    rs_unit_ = u;
    if (!prefetch_) DrainReduceScatter();  // done inside Start: freed at once
  }
  void Gather(int u) {
    StartGather(u);
    WaitGather(u);
  }

  const std::vector<UnitInfo>& units_;
  const bool prefetch_, bf16_, reshard_;
  int64_t block_ = 0, largest_ = 0;
  PoolSimulation params_, grads_, staging_pool_;
  std::vector<int64_t> p_buf_, g_buf_, staging_;
  int64_t rs_buf_ = 0;
  int rs_unit_ = -1;
};

// The model of one stage as the trainer builds it (Trainer::Init); layers: PipelineLayers(spec)
// (unused without pp).
GPT2Config StageConfig(const JobSpec& spec, int stage, const std::vector<int>& layers) {
  const ParallelismSpec& par = spec.parallelism;
  GPT2Config cfg = GPT2ConfigOf(spec.model);
  cfg.tp_size = par.tp_size;
  cfg.fsdp_size = par.dp_shard_size * par.cp_size;
  if (par.pp_size > 1) {
    const int P = par.pp_size, v = static_cast<int>(layers.size()) / P;
    for (int k = 0; k < v; ++k) {
      int begin = 0;
      for (int g = 0; g < k * P + stage; ++g) begin += layers[g];
      cfg.chunks.emplace_back(begin, begin + layers[k * P + stage]);
    }
    cfg.stage_first = stage == 0;
    cfg.stage_last = stage == P - 1;
  }
  return cfg;
}

// The rank's schedule: its operations in the order it runs them (one backward of the whole
// model per micro-batch without pp).
std::vector<PipeOp> StageOps(const JobSpec& spec, int stage, int micro_batches) {
  const ParallelismSpec& par = spec.parallelism;
  if (par.pp_size <= 1) {
    std::vector<PipeOp> ops;
    for (int m = 0; m < micro_batches; ++m) ops.push_back({PipeOpKind::kBackward, m, 0});
    return ops;
  }
  return PipelineOps(PpScheduleOf(par), par.pp_size, stage, micro_batches,
                     std::max(1, par.pp_virtual_stages));
}

// The FSDP hooks the model calls (engine/model/gpt2.cc) for one operation of the rank's
// schedule, or (eval) for the loss-only forward of chunk `op.chunk`. Zero-bubble's B
// (StageBackwardInput) calls the blocks' input-gradient hooks where a backward calls the
// backward's, and its W (StageBackwardWeight) the weight-gradient hooks of the chunk's blocks.
// keep: the chunks keep their forwards' activations (PipelineKeepsActivations), so a backward
// runs no forward but the last chunk's.
void SimulateOp(const GPT2Config& cfg, const std::vector<UnitInfo>& units, const PipeOp& op,
                bool eval, bool split, bool keep, FsdpSimulation& fsdp) {
  const int v = cfg.num_chunks(), L = cfg.stage_layers();
  const auto [lb, le] = cfg.ChunkLocalLayers(op.chunk);
  if (op.kind == PipeOpKind::kWeight) {
    for (int l = le - 1; l >= lb; --l) {
      fsdp.BeforeWeightGrad(1 + l);
      fsdp.AfterWeightGrad(1 + l);
    }
    return;
  }
  const bool first = cfg.stage_first && op.chunk == 0;
  const bool last = cfg.stage_last && op.chunk == v - 1;
  const bool uses_embedding = units[0].padded > 0 && (first || (last && cfg.tie_embeddings));
  // ForwardTrunk (not in the backward of a kept forward).
  if (eval || op.kind == PipeOpKind::kForward || !keep || last) {
    if (uses_embedding) fsdp.BeforeForward(0);
    for (int l = lb; l < le; ++l) {
      fsdp.BeforeForward(1 + l);
      fsdp.AfterForward(1 + l);
    }
    if (last) fsdp.BeforeForward(L + 1);
  }
  if (eval || op.kind == PipeOpKind::kForward) return;
  // StageForwardBackward, then Backward.
  if (uses_embedding) fsdp.BeforeBackward(0);
  if (last) {
    fsdp.BeforeBackward(L + 1);
    fsdp.AfterBackward(L + 1);
  }
  for (int l = le - 1; l >= lb; --l) {
    if (split) {
      fsdp.BeforeInputGrad(1 + l);
      fsdp.AfterInputGrad(1 + l);
    } else {
      fsdp.BeforeBackward(1 + l);
      fsdp.AfterBackward(1 + l);
    }
  }
  if (uses_embedding) fsdp.AfterBackward(0);
}

// ops[first, first + length) run `repeats` times back to back.
struct OpRun {
  size_t first = 0, length = 1;
  int64_t repeats = 1;
};

// The schedule as runs of a repeated block of operations (of one of `periods` lengths), where
// operations are equal when their kind and chunk are (what decides the hooks they call): a
// pipeline's steady phase alternates one forward and one backward of a chunk (length 2), going
// round the chunks every 2·P·v operations when interleaved; without pp every micro-batch is the
// same backward (length 1).
std::vector<OpRun> RepeatedRuns(const std::vector<PipeOp>& ops,
                                const std::vector<size_t>& periods) {
  auto same = [&](size_t a, size_t b) {
    return ops[a].kind == ops[b].kind && ops[a].chunk == ops[b].chunk;
  };
  std::vector<OpRun> runs;
  const size_t n = ops.size();
  for (size_t i = 0; i < n;) {
    OpRun best{i, 1, 1};
    for (size_t L : periods) {
      if (L == 0 || i + 2 * L > n) continue;
      int64_t r = 1;
      for (;; ++r) {
        const size_t at = i + static_cast<size_t>(r) * L;
        if (at + L > n) break;
        bool equal = true;
        for (size_t k = 0; k < L && equal; ++k) equal = same(i + k, at + k);
        if (!equal) break;
      }
      if (r >= 2 && static_cast<size_t>(r) * L > best.length * static_cast<size_t>(best.repeats)) {
        best = {i, L, r};
      }
    }
    runs.push_back(best);
    i += best.length * static_cast<size_t>(best.repeats);
  }
  return runs;
}

int MicroBatchesOf(const JobSpec& spec) {
  const ParallelismSpec& par = spec.parallelism;
  return spec.train.global_batch_size /
         (par.dp_replicate_size * par.dp_shard_size * spec.train.micro_batch_size);
}

// The receive buffers every stage holds at its peak (PipelineBuffersAtPeak), from one timetable
// of `schedule` over P stages, v chunks each and M micro-batches.
std::vector<int> CountPipelineBuffers(PpSchedule schedule, int P, int v, int M) {
  std::vector<std::vector<PipeOp>> ops(P);
  for (int p = 0; p < P; ++p) ops[p] = PipelineOps(schedule, P, p, M, v);
  const StatusOr<PipeTimetable> table = BuildTimetable(ops, P, v, M);
  // A schedule without a timetable does not run (the trainer refuses it the same way); bound it
  // by every micro-batch's input and output gradient through every chunk.
  if (!table.ok()) return std::vector<int>(P, 2 * v * M);
  std::vector<int> most(P, 0);
  auto op_at = [&](size_t t, int p) -> const PipeOp* {
    const int i = table->slots[t][p];
    return i < 0 ? nullptr : &ops[p][static_cast<size_t>(i)];
  };
  const int G = P * v;
  for (int p = 0; p < P; ++p) {
    const int next = (p + 1) % P, prev = (p + P - 1) % P;
    // Inputs and output gradients received and not yet freed (Trainer::PipelineMicroBatches):
    // every chunk but the pipeline's first receives its input, every chunk but the last its
    // output's gradient, each before the backward that frees both.
    int held = 0;
    for (size_t t = 0; t < table->slots.size(); ++t) {
      if (const PipeOp* op = op_at(t, p); op != nullptr && op->kind == PipeOpKind::kBackward) {
        const int g = op->chunk * P + p;
        held -= (g > 0 ? 1 : 0) + (g < G - 1 ? 1 : 0);
      }
      if (const PipeOp* from = op_at(t, prev);
          from != nullptr && from->kind == PipeOpKind::kForward) {
        ++held;
      }
      if (const PipeOp* from = op_at(t, next);
          from != nullptr && from->kind == PipeOpKind::kBackward && from->chunk * P + next > 0) {
        ++held;
      }
      most[p] = std::max(most[p], held);
    }
  }
  return most;
}

std::vector<int> PipelineBuffersOfEveryStage(const JobSpec& spec) {
  const ParallelismSpec& par = spec.parallelism;
  const int P = par.pp_size;
  if (P <= 1) return {0};
  const PpSchedule schedule = PpScheduleOf(par);
  const int M = MicroBatchesOf(spec);
  const int v = schedule == PpSchedule::kInterleaved1F1B ? std::max(1, par.pp_virtual_stages) : 1;
  // The planner asks for the same few shapes for thousands of rows: each is counted once.
  static std::mutex mu;
  static auto* counted = new std::map<std::tuple<int, int, int, int>, std::vector<int>>();
  const auto key = std::make_tuple(static_cast<int>(schedule), P, v, M);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = counted->find(key); it != counted->end()) return it->second;
  }
  std::vector<int> most = CountPipelineBuffers(schedule, P, v, M);
  std::lock_guard<std::mutex> lock(mu);
  if (counted->size() >= 4096) counted->clear();
  counted->emplace(key, most);
  return most;
}

// The units of a one-layer whole model of `spec` (embedding, a layer, final): every layer's unit
// is the same size, and a stage lays out its embedding and final units as the whole model does
// (decision 0054), so a stage's units are these.
std::vector<UnitInfo> OneLayerUnits(const JobSpec& spec) {
  GPT2Config one = StageConfig(spec, 0, {});
  one.n_layer = 1;
  one.chunks.clear();
  one.stage_first = one.stage_last = true;
  return GPT2Units(one, GPT2ParamLayout(one));
}

// Stage `cfg`'s units (GPT2Units of its layout) from OneLayerUnits: 0 the embedding unit (empty
// where the stage holds none), 1 … L its layers, L + 1 the final unit (empty but on the last).
std::vector<UnitInfo> StageUnits(const GPT2Config& cfg, const std::vector<UnitInfo>& one) {
  const int L = cfg.stage_layers();
  std::vector<UnitInfo> units(static_cast<size_t>(L) + 2);
  units[0].padded = cfg.holds_embedding() ? one[0].padded : 0;
  for (int l = 1; l <= L; ++l) units[l].padded = one[1].padded;
  units[L + 1].padded = cfg.stage_last ? one[2].padded : 0;
  int64_t offset = 0;
  for (UnitInfo& u : units) {
    u.offset = offset;
    offset += u.padded;
  }
  return units;
}

MemoryPrediction PredictStage(const JobSpec& spec, int stage, const std::vector<int>& layers,
                              const std::vector<UnitInfo>& one_layer_units, int pipe_buffers) {
  const ParallelismSpec& par = spec.parallelism;
  const int tp = par.tp_size, cp = par.cp_size, n = par.dp_shard_size * par.cp_size;
  const GPT2Config cfg = StageConfig(spec, stage, layers);
  const std::vector<UnitInfo> units = StageUnits(cfg, one_layer_units);
  const int L = cfg.stage_layers();
  const int64_t f = sizeof(float);

  MemoryPrediction out;
  auto add = [&](MemoryKind kind, int64_t elements) {
    out.bytes[static_cast<int>(kind)] += elements * f;
  };

  // Parameters, gradients, the optimizer's state.
  int64_t total = 0, shard = 0, largest_shard = 0;
  for (const UnitInfo& u : units) {
    total += u.padded;
    shard += u.padded / n;
    largest_shard = std::max(largest_shard, u.padded / n);
  }
  const int micro_batches = MicroBatchesOf(spec);
  // The stage's operations (one backward per micro-batch without pp): the FSDP simulation, the
  // kept forwards and the send ring all walk them.
  const std::vector<PipeOp> stage_ops = StageOps(spec, stage, micro_batches);
  if (n == 1) {
    add(MemoryKind::kParameters, total);
    add(MemoryKind::kGradients, total);
  } else {
    add(MemoryKind::kParameters, shard);
    add(MemoryKind::kGradients, shard);
    add(MemoryKind::kCommunication, largest_shard);  // the reduce-scatter's output
    // The gathered units, in the order the model's hooks ask for them over the rank's schedule
    // (ShardedState's overlap where the backend overlaps), a step at a time: ZeroGrad, the
    // operations, FinishGradients, the update's ReleaseAll (and an evaluation's forward and
    // ReleaseAll when the run evaluates).
    const bool bf16_gather = PrecisionOf(spec.train) == TrainPrecision::kBf16 &&
                             DeviceOf(spec.resources) == ComputeDevice::kCuda;
    const bool prefetch = DeviceOf(spec.resources) == ComputeDevice::kCuda;
    FsdpSimulation fsdp(units, prefetch, bf16_gather, par.fsdp_reshard_after_forward);
    const std::vector<PipeOp>& ops = stage_ops;
    const bool split = par.pp_size > 1 && PpScheduleOf(par) == PpSchedule::kZeroBubble;
    const bool keep = PipelineKeepsActivations(spec);
    const bool evaluates = !spec.data.val.empty() && spec.data.eval_every > 0;
    // A repeated block of operations asks for the same buffers each time, so once one
    // repetition leaves the pools as it found them, so does every later one: the run's rest is
    // skipped (exact, and thousands of micro-batches cost a few). Steps repeat from the pools
    // the last one left until one allocates nothing more.
    const int v = cfg.num_chunks();
    const std::vector<OpRun> runs =
        RepeatedRuns(ops, {1, 2, 2 * static_cast<size_t>(std::max(1, par.pp_size)) * v});
    for (int step = 0; step < 8; ++step) {
      const auto start = fsdp.State();
      fsdp.DrainReduceScatter();
      for (const OpRun& run : runs) {
        for (int64_t r = 0; r < run.repeats; ++r) {
          const bool check = r > 0;
          auto before = check ? fsdp.State() : decltype(fsdp.State())();
          for (size_t i = run.first; i < run.first + run.length; ++i) {
            SimulateOp(cfg, units, ops[i], /*eval=*/false, split, keep, fsdp);
          }
          if (check && fsdp.State() == before) break;
        }
      }
      fsdp.ReleaseAll();
      if (evaluates) {
        // Two batches: the second finds the final unit still gathered from the first (units 0
        // and L+1 stay gathered until the evaluation's ReleaseAll), and later ones ask for
        // nothing more.
        for (int batch = 0; batch < 2; ++batch) {
          for (int k = 0; k < cfg.num_chunks(); ++k) {
            SimulateOp(cfg, units, PipeOp{PipeOpKind::kForward, 0, k}, /*eval=*/true,
                       /*split=*/false, keep, fsdp);
          }
        }
        fsdp.ReleaseAll();
      }
      if (fsdp.State() == start) break;
    }
    add(MemoryKind::kParameters, fsdp.params_total());
    add(MemoryKind::kGradients, fsdp.grads_total());
    if (bf16_gather) {
      // The bf16 copy of the shard the gathers send, and the bf16 staging of a gathered unit.
      out.bytes[static_cast<int>(MemoryKind::kParameters)] += shard * 2;
      add(MemoryKind::kCommunication, fsdp.staging_total());
    }
  }
  // The optimizer's own state over the shard (engine/train/optimizer_states.h).
  out.bytes[static_cast<int>(MemoryKind::kOptimizer)] +=
      OptimizerStateBytes(OptimizerOf(spec.train), shard);

  // Activations of one micro-batch of this rank's tokens (GPT2::EnsureActivations).
  const int64_t N = static_cast<int64_t>(spec.train.micro_batch_size) * (spec.model.seq_len / cp);
  // Cl: the attention width on this rank, heads · head_dim (C/tp unless head_dim is free).
  const int64_t C = cfg.d_model, V = cfg.vocab_rows(), Hl = cfg.n_head / tp,
                Cl = Hl * cfg.head_dim(), Fl = cfg.ff() / tp,
                Wl = (Hl + 2 * (cfg.kv_heads() / tp)) * cfg.head_dim(),
                Gl = cfg.llama() ? 2 * Fl : Fl;  // the fc output: gate|up under llama
  const int64_t means = cfg.llama() ? 0 : 1;     // RMSNorm keeps no mean
  // The head computes its logits HeadChunkRows rows at a time (of this rank's vocabulary), on
  // the last pipeline stage only. The (1 + w) RMSNorm's 1 + w: one row of d_model.
  const int64_t head = cfg.stage_last ? HeadChunkRows(N, V) * V : 0;
  const int64_t one_plus = cfg.family().norm == NormKind::kRMSNormOnePlus ? C : 0;
  const int64_t root = N * C * 2 + N * (1 + means) + head + N + one_plus;
  const int64_t layer = N * C * 4 + N * 2 * (1 + means) + N * Cl * 5 + N * Hl + N * (Gl + Fl);
  const int64_t scratch = N * Wl * 2 + N * C * 2 + N * Cl * 5 + N * (Gl + Fl);
  const Checkpointing ac = CheckpointingOf(spec.train);
  int64_t acts = root + scratch;
  if (ac == Checkpointing::kNone) {
    acts += L * layer;
  } else {
    const int64_t kept = ac == Checkpointing::kFull ? N * C : N * C * 2 + N * Cl * 3 + N * Gl;
    acts += layer + L * kept;
  }
  // Context parallel: one K or V block is c = N·Cl floats on this rank.
  const int64_t c = N * Cl;
  // Pipeline parallelism: on the ends of a tied pipeline, the embedding unit's gradient shard
  // received from the other end (allocated after the first backward, and kept).
  const int64_t tied = par.pp_size > 1 && cfg.tie_embeddings && (cfg.stage_first || cfg.stage_last)
                           ? units[0].padded / n
                           : 0;
  if (cp > 1) {
    if (CpCommOf(par) == CpComm::kRing) {
      // Forward: 2c to send, 2c to receive, c + N·Hl for a partial output and its lse; the
      // backward grows both to 4c, each growth holding the old and the new buffer at once (a
      // peak of 11c + N·Hl during the first backward, 9c + N·Hl after, beside the tied shard).
      add(MemoryKind::kCommunication, std::max(11 * c + N * Hl, 9 * c + N * Hl + tied));
    } else {
      // The gathered K and V (kept per layer, or once under recompute), the gather buffer,
      // and the backward's gathered dK and dV.
      acts += (ac == Checkpointing::kNone ? L : 1) * 2 * cp * c;
      add(MemoryKind::kCommunication, cp * c + 2 * cp * c + tied);
    }
  } else {
    add(MemoryKind::kCommunication, tied);
  }
  // Pipeline parallelism: the received inputs and output gradients held at once, one
  // micro-batch's activation each (an evaluation reuses one of them).
  acts += int64_t{pipe_buffers} * N * C;
  // Pipeline parallelism without activation checkpointing (decision 0066): the kept forwards.
  // A chunk keeping K_k at most holds K_k sets of its layers' activations (and, under cp
  // allgather, their gathered K and V), one of them the set above: its layers go without while
  // the forward that filled them is kept. The inputs (n·d each) are shared by the chunks: one
  // above plus one per forward kept at once over all chunks. Sets stay allocated once made.
  if (PipelineKeepsActivations(spec)) {
    const int v = cfg.num_chunks();
    const std::vector<int> kept = MaxKeptForwards(stage_ops, v);
    const int64_t gathered = cp > 1 && CpCommOf(par) != CpComm::kRing ? 2 * cp * N * Cl : 0;
    for (int k = 0; k < v; ++k) {
      const auto [lb, le] = cfg.ChunkLocalLayers(k);
      const int64_t extra = std::max(0, kept[static_cast<size_t>(k)] - 1);
      acts += extra * (le - lb) * (layer + gathered);
    }
    acts += int64_t{MaxKeptForwardsAtOnce(stage_ops)} * N * C;
  }
  // Pipeline parallelism on a host backend (the asynchronous executor, decision 0064): the ring
  // of send buffers each output is copied into, kept from the first step on. A device run
  // (NCCL) keeps the lockstep timetable, which sends from the model's own buffers.
  if (par.pp_size > 1 && DeviceOf(spec.resources) != ComputeDevice::kCuda) {
    const int sends = PipelineSendBuffers(stage_ops, par.pp_size, cfg.num_chunks(), stage);
    add(MemoryKind::kCommunication, int64_t{sends} * N * C);
  }
  // Zero-bubble: the weight-gradient stashes pending at once (each allocated at its B's start,
  // freed at the end of its W). The receive buffers stay allocated from the first step on, so a
  // later step holds them all beside its most stashes.
  acts += int64_t{PipelineWeightStashesAtPeak(spec, stage)} * PipelineWeightStashNumel(spec, stage);
  add(MemoryKind::kActivations, acts);
  for (int k = 0; k < kNumMemoryKinds; ++k) out.peak_bytes += out.bytes[k];
  return out;
}

// The layers of each pipeline chunk (none without pp), as the trainer splits them; the planner's
// rows share a model, so the last few splits are kept.
std::vector<int> ChunkLayersOf(const JobSpec& spec) {
  const ParallelismSpec& par = spec.parallelism;
  if (par.pp_size <= 1) return {};
  struct Split {
    ModelSpec model;
    int stages = 0, virtual_stages = 0;
    std::vector<int> given, layers;
  };
  static std::mutex mu;
  static auto* splits = new std::vector<Split>();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Split& x : *splits) {
      if (x.model == spec.model && x.stages == par.pp_size &&
          x.virtual_stages == par.pp_virtual_stages && x.given == par.pp_layers) {
        return x.layers;
      }
    }
  }
  Split x{spec.model, par.pp_size, par.pp_virtual_stages, par.pp_layers, PipelineLayers(spec)};
  std::lock_guard<std::mutex> lock(mu);
  if (splits->size() >= 64) splits->erase(splits->begin());
  splits->push_back(x);
  return x.layers;
}

}  // namespace

int PipelineWeightStashesAtPeak(const JobSpec& spec, int pp_stage) {
  const ParallelismSpec& par = spec.parallelism;
  if (par.pp_size <= 1) return 0;
  return MaxPendingWeightGrads(StageOps(spec, pp_stage, MicroBatchesOf(spec)));
}

int64_t PipelineWeightStashNumel(const JobSpec& spec, int pp_stage) {
  // GPT2::LayerStashLayout per layer (engine/model/gpt2.cc; tests/engine/train/
  // pipeline_memory_test.cc holds the two equal): each linear layer's input (ln1, atty, ln2,
  // act) and output gradient (dqkv, dattn, dfc, dmlp), and the norms' weight (and bias)
  // gradients; zero_bubble has one chunk per stage, all of the stage's layers.
  const ParallelismSpec& par = spec.parallelism;
  if (par.pp_size <= 1) return 0;
  const GPT2Config cfg = StageConfig(spec, pp_stage, ChunkLayersOf(spec));
  const int64_t tp = par.tp_size;
  const int64_t N =
      static_cast<int64_t>(spec.train.micro_batch_size) * (spec.model.seq_len / par.cp_size);
  const int64_t C = cfg.d_model, Cl = cfg.n_head / tp * cfg.head_dim(), Fl = cfg.ff() / tp,
                Wl = (cfg.n_head / tp + 2 * (cfg.kv_heads() / tp)) * cfg.head_dim(),
                Gl = cfg.gated_mlp() ? 2 * Fl : Fl;
  const int64_t norms = cfg.family().norm == NormKind::kLayerNorm ? 4 * C : 2 * C;
  const int64_t per_layer = N * (4 * C + Wl + Cl + Gl + Fl) + norms;
  return cfg.stage_layers() * per_layer;
}

int PipelineBuffersAtPeak(const JobSpec& spec, int pp_stage) {
  if (spec.parallelism.pp_size <= 1) return 0;
  return PipelineBuffersOfEveryStage(spec)[static_cast<size_t>(pp_stage)];
}

MemoryPrediction PredictRankMemory(const JobSpec& spec, int pp_stage) {
  return PredictStage(spec, pp_stage, ChunkLayersOf(spec), OneLayerUnits(spec),
                      PipelineBuffersAtPeak(spec, pp_stage));
}

std::vector<MemoryPrediction> PredictStagesMemory(const JobSpec& spec) {
  const int P = std::max(1, spec.parallelism.pp_size);
  const std::vector<int> buffers = PipelineBuffersOfEveryStage(spec);
  const std::vector<int> layers = ChunkLayersOf(spec);
  const std::vector<UnitInfo> one = OneLayerUnits(spec);
  std::vector<MemoryPrediction> out;
  for (int p = 0; p < P; ++p) {
    out.push_back(PredictStage(spec, p, layers, one, buffers[static_cast<size_t>(p)]));
  }
  return out;
}

MemoryPrediction PredictRankMemory(const JobSpec& spec) {
  MemoryPrediction out;
  for (const MemoryPrediction& stage : PredictStagesMemory(spec)) {
    for (int k = 0; k < kNumMemoryKinds; ++k) out.bytes[k] = std::max(out.bytes[k], stage.bytes[k]);
    out.peak_bytes = std::max(out.peak_bytes, stage.peak_bytes);
  }
  return out;
}

}  // namespace meshrun
