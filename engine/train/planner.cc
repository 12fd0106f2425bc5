// The planner's enumeration and its step-time model. Compute: the model FLOPs of a step (plus
// what activation checkpointing recomputes) over the world's achievable rate. Communication:
// each axis's bus bytes (engine/train/comm_volume.cc, the formulas the engine is tested
// against) over the bandwidth of the link its group crosses: tp is innermost, so a tp group is
// inside a node when tp ≤ ranks per node, a cp group when cp·tp is, a dp_shard_cp group when
// dp_shard·cp·tp is; dp_replicate spans the rest. The engine does not overlap communication
// with compute yet, so the step is their sum.
#include "engine/train/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/model/gpt2.h"
#include "engine/train/comm_volume.h"

namespace meshrun {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Of a device's memory, what a rank may plan to use (allocator slack, the runtime, buffers the
// model does not see).
constexpr double kUsableFraction = 0.9;

std::vector<int> Divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / kGiB);
  return buf;
}

// FLOPs of one step of the whole job: 6·N·tokens plus attention, plus recomputation.
double StepFlops(const JobSpec& spec) {
  GPT2Config cfg;
  cfg.vocab_size = spec.model.vocab_size;
  cfg.n_layer = spec.model.n_layer;
  cfg.n_head = spec.model.n_head;
  cfg.d_model = spec.model.d_model;
  cfg.max_seq_len = spec.model.seq_len;
  const double T = spec.model.seq_len;
  const double tokens = static_cast<double>(spec.train.global_batch_size) * T;
  const double per_token = GPT2FlopsPerToken(cfg, spec.model.seq_len);
  const double d = cfg.d_model, L = cfg.n_layer;
  // Forward FLOPs per token of the blocks (a third of 6·N_blocks) and of the attention core.
  const double block_params = 12.0 * d * d * L;
  const double attention_forward = 4.0 * L * d * T;
  double extra = 0;
  const std::string& ac = spec.train.activation_checkpointing;
  if (ac == "full") extra = 2.0 * block_params + attention_forward;
  if (ac == "selective") extra = attention_forward;
  return tokens * (per_token + extra);
}

}  // namespace

std::vector<std::string> KnownDevices() {
  return {"cpu", "a100", "h100", "h200", "l40s"};
}

StatusOr<DeviceProfile> DeviceProfileNamed(const std::string& name) {
  // Achievable dense float32 rates (TF32 tensor cores on GPUs, about half the datasheet's
  // dense figure) and per-GPU bus bandwidths (NVLink inside a node, 400 Gb/s InfiniBand across).
  if (name == "cpu") return DeviceProfile{"cpu", 0, 0, 5e9, 1.25e9, 0.42};
  if (name == "a100") return DeviceProfile{"a100", 80 * kGiB, 70e12, 200e9, 40e9, 0.5};
  if (name == "h100") return DeviceProfile{"h100", 80 * kGiB, 200e12, 350e9, 45e9, 0.5};
  if (name == "h200") return DeviceProfile{"h200", 141 * kGiB, 220e12, 350e9, 45e9, 0.5};
  if (name == "l40s") return DeviceProfile{"l40s", 48 * kGiB, 80e12, 25e9, 12e9, 0.5};
  std::string known;
  for (const std::string& d : KnownDevices()) known += (known.empty() ? "" : ", ") + d;
  return NotFoundError("--device: '" + name + "' is not a known device (hint: one of " + known +
                       ", or give --memory-gib, --tflops and the bandwidths yourself)");
}

StatusOr<std::vector<PlanRow>> Plan(const JobSpec& spec, const ClusterShape& cluster) {
  if (cluster.nodes < 1 || cluster.per_node < 1) {
    return InvalidArgumentError("cluster: " + std::to_string(cluster.nodes) + " nodes × " +
                                std::to_string(cluster.per_node) +
                                " ranks per node holds no rank (hint: --nodes 1 --per-node 1 or "
                                "more)");
  }
  const int world = cluster.world();
  const DeviceProfile& dev = cluster.device;
  std::vector<PlanRow> rows;
  for (int tp : Divisors(world)) {
    for (int cp : Divisors(world / tp)) {
      for (int shard : Divisors(world / tp / cp)) {
        const int replicate = world / tp / cp / shard;
        for (const char* strategy : {"allgather", "ring"}) {
          if (cp == 1 && std::string(strategy) == "ring") continue;
          for (const char* ac : {"none", "selective", "full"}) {
            for (bool reshard : {true, false}) {
              if (shard * cp == 1 && !reshard) continue;
              JobSpec s = spec;
              s.parallelism.dp_replicate_size = replicate;
              s.parallelism.dp_shard_size = shard;
              s.parallelism.cp_size = cp;
              s.parallelism.tp_size = tp;
              s.parallelism.cp_comm_strategy = strategy;
              s.parallelism.fsdp_reshard_after_forward = reshard;
              s.train.activation_checkpointing = ac;
              if (!ValidateJobSpec(s, world).ok()) continue;
              PlanRow row;
              row.spec = s;
              row.memory = PredictRankMemory(s);
              const double usable = dev.memory_bytes * kUsableFraction;
              row.fits = dev.memory_bytes <= 0 || row.memory.peak_bytes <= usable;
              if (!row.fits) {
                row.reason = "needs " + Gib(static_cast<double>(row.memory.peak_bytes)) +
                             " per rank, " + Gib(usable) + " usable of " + Gib(dev.memory_bytes);
              }
              row.compute_seconds =
                  dev.flops > 0 ? StepFlops(s) / (world * dev.flops * dev.step_efficiency) : 0;
              const std::map<std::string, double> bytes = ExpectedCommBytesPerStep(s);
              const int span_tp = tp, span_cp = tp * cp, span_fsdp = tp * cp * shard;
              auto bw = [&](int span) {
                return span <= cluster.per_node ? dev.intra_node_bw : dev.inter_node_bw;
              };
              const std::map<std::string, int> span = {{"tp", span_tp},
                                                       {"cp", span_cp},
                                                       {"dp_shard", span_fsdp},
                                                       {"dp_replicate", world}};
              row.step_seconds = row.compute_seconds;
              for (const auto& [axis, b] : bytes) {
                const double link = bw(span.at(axis));
                row.comm_seconds[axis] = link > 0 ? b / link : 0;
                row.step_seconds += row.comm_seconds[axis];
              }
              const double tokens =
                  static_cast<double>(s.train.global_batch_size) * s.model.seq_len;
              if (row.step_seconds > 0) {
                row.tokens_per_second = tokens / row.step_seconds;
                GPT2Config cfg;
                cfg.vocab_size = s.model.vocab_size;
                cfg.n_layer = s.model.n_layer;
                cfg.n_head = s.model.n_head;
                cfg.d_model = s.model.d_model;
                cfg.max_seq_len = s.model.seq_len;
                // MFU counts model FLOPs only (recomputation is overhead, not progress).
                row.mfu = row.tokens_per_second * GPT2FlopsPerToken(cfg, s.model.seq_len) /
                          (world * dev.flops);
              }
              rows.push_back(std::move(row));
            }
          }
        }
      }
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const PlanRow& a, const PlanRow& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.tokens_per_second != b.tokens_per_second) {
      return a.tokens_per_second > b.tokens_per_second;
    }
    return a.memory.peak_bytes < b.memory.peak_bytes;
  });
  return rows;
}

std::string ExplainBest(const std::vector<PlanRow>& rows, const ClusterShape& cluster) {
  if (rows.empty()) return "No mesh of " + std::to_string(cluster.world()) + " ranks is valid.";
  const PlanRow& best = rows.front();
  const ParallelismSpec& p = best.spec.parallelism;
  char buf[512];
  if (!best.fits) {
    // The smallest, not the fastest, is the useful one to show when none fits.
    const PlanRow* smallest = &rows.front();
    for (const PlanRow& r : rows) {
      if (r.memory.peak_bytes < smallest->memory.peak_bytes) smallest = &r;
    }
    std::snprintf(
        buf, sizeof(buf),
        "No configuration fits: the smallest (dp_replicate %d, dp_shard %d, cp %d, tp %d, "
        "activation_checkpointing %s) %s. Add ranks, or use a smaller model or batch.",
        smallest->spec.parallelism.dp_replicate_size, smallest->spec.parallelism.dp_shard_size,
        smallest->spec.parallelism.cp_size, smallest->spec.parallelism.tp_size,
        smallest->spec.train.activation_checkpointing.c_str(), smallest->reason.c_str());
    return buf;
  }
  std::snprintf(buf, sizeof(buf),
                "Best: dp_replicate %d × dp_shard %d × cp %d × tp %d (cp %s, activation "
                "checkpointing %s, reshard after forward %s): %.3g s per step (%.0f%% compute), "
                "%.0f tokens/s, %s per rank.",
                p.dp_replicate_size, p.dp_shard_size, p.cp_size, p.tp_size,
                p.cp_comm_strategy.c_str(), best.spec.train.activation_checkpointing.c_str(),
                p.fsdp_reshard_after_forward ? "true" : "false", best.step_seconds,
                best.step_seconds > 0 ? 100.0 * best.compute_seconds / best.step_seconds : 0.0,
                best.tokens_per_second, Gib(static_cast<double>(best.memory.peak_bytes)).c_str());
  std::string text = buf;
  if (rows.size() > 1 && rows[1].fits) {
    const PlanRow& next = rows[1];
    std::snprintf(buf, sizeof(buf),
                  " Runner-up: dp_replicate %d × dp_shard %d × cp %d × tp %d (activation "
                  "checkpointing %s), %.0f tokens/s with %s per rank.",
                  next.spec.parallelism.dp_replicate_size, next.spec.parallelism.dp_shard_size,
                  next.spec.parallelism.cp_size, next.spec.parallelism.tp_size,
                  next.spec.train.activation_checkpointing.c_str(), next.tokens_per_second,
                  Gib(static_cast<double>(next.memory.peak_bytes)).c_str());
    text += buf;
  }
  return text;
}

}  // namespace meshrun
