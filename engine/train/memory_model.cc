// The memory model, buffer by buffer, in the order of engine/model/gpt2.cc (EnsureActivations,
// the attention's exchange buffers) and engine/train/sharding.cc (shards, the gathered-unit
// pool). A change to what either allocates belongs here too; bench/memory shows the difference.
#include "engine/train/memory_model.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "engine/model/gpt2.h"
#include "engine/train/optimizer_states.h"

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

}  // namespace

MemoryPrediction PredictRankMemory(const JobSpec& spec) {
  const ParallelismSpec& par = spec.parallelism;
  const int tp = par.tp_size, cp = par.cp_size, n = par.dp_shard_size * par.cp_size;
  GPT2Config cfg = GPT2ConfigOf(spec.model);
  cfg.tp_size = tp;
  cfg.fsdp_size = n;
  const std::vector<UnitInfo> units = GPT2Units(cfg, GPT2ParamLayout(cfg));
  const int L = cfg.n_layer;
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
  if (n == 1) {
    add(MemoryKind::kParameters, total);
    add(MemoryKind::kGradients, total);
  } else {
    add(MemoryKind::kParameters, shard);
    add(MemoryKind::kGradients, shard);
    add(MemoryKind::kCommunication, largest_shard);  // the reduce-scatter's output
    // The gathered units of each micro-batch, in the order the model's hooks ask for them,
    // with ShardedState's overlap: the next unit's gather starts when the current one is
    // needed, and a unit's reduce-scatter (holding its full gradients) is waited for at the
    // next unit's AfterBackward. Buffers other than unit 0's are at least the largest block.
    const bool bf16_gather = PrecisionOf(spec.train) == TrainPrecision::kBf16 &&
                             DeviceOf(spec.resources) == ComputeDevice::kCuda;
    int64_t block = 0;
    for (int l = 1; l <= L; ++l) block = std::max(block, units[l].padded);
    auto numel = [&](size_t u) {
      return u == 0 ? units[u].padded : std::max(units[u].padded, block);
    };
    // The next unit is prefetched, and a reduce-scatter left in flight, only where the backend
    // overlaps (NCCL, i.e. cuda); on a CPU backend each unit is gathered when it is needed and
    // its gradients freed when its reduce-scatter returns (ShardedState, decision 0052).
    const bool prefetch = DeviceOf(spec.resources) == ComputeDevice::kCuda;
    PoolSimulation params, grads, staging;
    std::vector<int64_t> p_buf(units.size(), 0), g_buf(units.size(), 0);
    int64_t rs_buf = 0;
    int rs_unit = -1;
    auto start_gather = [&](size_t u) {
      if (p_buf[u] != 0) return;
      p_buf[u] = params.Acquire(numel(u));
      if (bf16_gather) {
        // bf16 in float elements, always of the largest unit; widened when waited for, before
        // the next gather starts.
        int64_t largest = 0;
        for (size_t v = 0; v < units.size(); ++v) largest = std::max(largest, numel(v));
        int64_t st = staging.Acquire((largest + 1) / 2);
        staging.Release(st);
      }
    };
    auto drain = [&] {
      if (rs_unit >= 0) grads.Release(rs_buf);
      rs_unit = -1;
    };
    auto before_backward = [&](size_t u) {
      if (rs_unit == static_cast<int>(u)) drain();
      start_gather(u);
      if (g_buf[u] == 0) g_buf[u] = grads.Acquire(numel(u));
    };
    auto after_backward = [&](size_t u) {
      drain();
      params.Release(p_buf[u]);
      rs_buf = g_buf[u];
      g_buf[u] = 0;
      rs_unit = static_cast<int>(u);
      if (!prefetch) drain();  // a CPU backend's reduce-scatter is done inside Start
    };
    const int micro_batches =
        spec.train.global_batch_size /
        (par.dp_replicate_size * par.dp_shard_size * spec.train.micro_batch_size);
    // Every micro-batch asks for the same buffers, so once one leaves the pools as it found
    // them, so does every later one: the loop stops there (exact, and a pipeline of thousands
    // of micro-batches costs two).
    auto pool_state = [&] {
      return std::make_tuple(params.Sizes(), params.total(), grads.Sizes(), grads.total(),
                             staging.Sizes(), staging.total(), p_buf, g_buf, rs_buf, rs_unit);
    };
    auto before = pool_state();
    for (int m = 0; m < micro_batches; ++m) {
      if (m > 0) {
        auto now = pool_state();
        if (now == before) break;
        before = std::move(now);
      }
      start_gather(0);
      if (prefetch) start_gather(1);  // prefetch (unit L+1 when L = 0)
      for (int l = 1; l <= L; ++l) {
        start_gather(l);
        if (prefetch) start_gather(l + 1);
        if (par.fsdp_reshard_after_forward) params.Release(p_buf[l]);
      }
      start_gather(L + 1);
      before_backward(0);
      before_backward(L + 1);
      if (prefetch && L >= 1) start_gather(L);
      after_backward(L + 1);
      for (int l = L; l >= 1; --l) {
        before_backward(l);
        if (prefetch && l >= 2) start_gather(l - 1);
        after_backward(l);
      }
      after_backward(0);
    }
    drain();
    add(MemoryKind::kParameters, params.total());
    add(MemoryKind::kGradients, grads.total());
    if (bf16_gather) {
      // The bf16 copy of the shard the gathers send, and the bf16 staging of a gathered unit.
      out.bytes[static_cast<int>(MemoryKind::kParameters)] += shard * 2;
      add(MemoryKind::kCommunication, staging.total());
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
  // The head computes its logits HeadChunkRows rows at a time (of this rank's vocabulary).
  // The (1 + w) RMSNorm's 1 + w: one row of d_model.
  const int64_t one_plus = cfg.family().norm == NormKind::kRMSNormOnePlus ? C : 0;
  const int64_t root = N * C * 2 + N * (1 + means) + HeadChunkRows(N, V) * V + N + one_plus;
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
  if (cp > 1) {
    if (CpCommOf(par) == CpComm::kRing) {
      // Forward: 2c to send, 2c to receive, c + N·Hl for a partial output and its lse; the
      // backward grows both to 4c (each growth holds the old and the new buffer at once).
      add(MemoryKind::kCommunication, 10 * c + c + N * Hl);
    } else {
      // The gathered K and V (kept per layer, or once under recompute), the gather buffer,
      // and the backward's gathered dK and dV.
      acts += (ac == Checkpointing::kNone ? L : 1) * 2 * cp * c;
      add(MemoryKind::kCommunication, cp * c + 2 * cp * c);
    }
  }
  add(MemoryKind::kActivations, acts);
  for (int k = 0; k < kNumMemoryKinds; ++k) out.peak_bytes += out.bytes[k];
  return out;
}

}  // namespace meshrun
