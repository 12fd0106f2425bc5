// The planner's enumeration and its step-time model. Compute: the model FLOPs of a step (plus
// what activation checkpointing recomputes) over the world's achievable rate. Communication:
// each axis's bus bytes (engine/train/comm_volume.cc, the formulas the engine is tested
// against) over the bandwidth of the link its group crosses: tp is innermost, so a tp group is
// inside a node when tp ≤ ranks per node, a cp group when cp·tp is, a dp_shard_cp group when
// dp_shard·cp·tp is; dp_replicate spans the rest of a stage. Pipeline parallelism (pp
// outermost): the layers split into stages by cost, the slowest stage's compute, the schedule's
// bubble and the stages' sends over the link between stages; the memory of the stage with the
// largest peak, with the micro-batches its schedule keeps in flight (engine/train/pipeline_cost.h,
// docs/planning.md "Pipeline parallelism"). The engine does not overlap communication with
// compute yet, so the step is their sum.
#include "engine/train/planner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common/mfu.h"
#include "engine/model/gpt2.h"
#include "engine/train/comm_volume.h"
#include "engine/train/model_shape.h"
#include "engine/train/pipeline.h"
#include "engine/train/pipeline_cost.h"

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

// FLOPs per token beyond the model's that activation checkpointing recomputes: `full` the
// blocks' forward (2 FLOPs per block parameter) and the attention core, `selective` the core.
double RecomputeFlopsPerToken(const JobSpec& spec) {
  const double L = spec.model.n_layer, T = spec.model.seq_len, d = spec.model.d_model;
  const double block_forward = 2.0 * static_cast<double>(BlockParameterCount(spec.model)) * L;
  const double attention_forward = 4.0 * L * d * T;
  const Checkpointing ac = CheckpointingOf(spec.train);
  if (ac == Checkpointing::kFull) return block_forward + attention_forward;
  if (ac == Checkpointing::kSelective) return attention_forward;
  return 0;
}

// The enumerated configurations of `spec` on `world` ranks that pass validation.
// Whether the planner predicts `s` on `world` ranks: a spec ValidateJobSpec accepts (the engine
// runs every schedule it accepts, zero_bubble included).
enum class Plannable { kNo, kRuns };
Plannable PlannableOn(const JobSpec& s, int world) {
  return ValidateJobSpec(s, world).ok() ? Plannable::kRuns : Plannable::kNo;
}

// The pipeline shapes tried at pp > 1: each schedule, interleaved with 2 and 4 model chunks
// per stage (when every chunk keeps a layer).
struct PipelineOption {
  const char* schedule;
  int virtual_stages;
};
std::vector<PipelineOption> PipelineOptions(int pp, int n_layer) {
  if (pp == 1) return {{"1f1b", 1}};
  std::vector<PipelineOption> out = {{"1f1b", 1}, {"zero_bubble", 1}};
  for (int v : {2, 4}) {
    if (pp * v <= n_layer) out.push_back({"interleaved_1f1b", v});
  }
  return out;
}

std::vector<JobSpec> Candidates(const JobSpec& spec, int world) {
  std::vector<JobSpec> out;
  for (int pp : Divisors(world)) {
    if (pp > std::max(1, spec.model.n_layer)) break;  // a stage holds at least one layer
    const int stage = world / pp;
    for (const PipelineOption& pipe : PipelineOptions(pp, spec.model.n_layer)) {
      for (int tp : Divisors(stage)) {
        for (int cp : Divisors(stage / tp)) {
          for (int shard : Divisors(stage / tp / cp)) {
            JobSpec s = spec;
            s.parallelism.auto_mesh = false;
            s.parallelism.pp_size = pp;
            s.parallelism.pp_schedule = pipe.schedule;
            s.parallelism.pp_virtual_stages = pipe.virtual_stages;
            s.parallelism.pp_layers.clear();  // the planner splits by cost
            s.parallelism.dp_replicate_size = stage / tp / cp / shard;
            s.parallelism.dp_shard_size = shard;
            s.parallelism.cp_size = cp;
            s.parallelism.tp_size = tp;
            const std::vector<std::string> strategies =
                cp > 1 ? std::vector<std::string>{"allgather", "ring"}
                       : std::vector<std::string>{"allgather"};
            const std::vector<bool> residencies =
                shard * cp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{true};
            for (const std::string& strategy : strategies) {
              for (const char* ac : {"none", "selective", "full"}) {
                for (bool reshard : residencies) {
                  s.parallelism.cp_comm_strategy = strategy;
                  s.parallelism.fsdp_reshard_after_forward = reshard;
                  s.train.activation_checkpointing = ac;
                  if (PlannableOn(s, world) != Plannable::kNo) out.push_back(s);
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

// The job as one stage of its pipeline runs it: `layers` blocks, no pipeline. The memory and
// collectives of a stage are those of this smaller model (with the embedding and the head: an
// upper bound for the stages that hold neither).
JobSpec StageSpec(const JobSpec& s, int layers) {
  JobSpec stage = s;
  stage.model.n_layer = layers;
  stage.parallelism.pp_size = 1;
  stage.parallelism.pp_schedule = "1f1b";
  stage.parallelism.pp_virtual_stages = 1;
  stage.parallelism.pp_layers.clear();
  return stage;
}

// A pipeline's split: the layers of each of its P·v chunks (pp_layers, or balanced by the cost
// of a layer, the embedding and the head per token) and each stage's cost.
struct StageSplit {
  PipelineShape shape;
  std::vector<int> chunk_layers;
  std::vector<int> stage_layers;
  std::vector<double> stage_cost;
};

StageSplit SplitStages(const JobSpec& s) {
  const ParallelismSpec& p = s.parallelism;
  StageSplit out;
  out.shape.schedule = PpScheduleOf(p);
  out.shape.stages = p.pp_size;
  out.shape.virtual_stages =
      out.shape.schedule == PpSchedule::kInterleaved1F1B ? p.pp_virtual_stages : 1;
  out.shape.micro_batches = s.train.global_batch_size / (p.dp_replicate_size * p.dp_shard_size *
                                                         std::max(1, s.train.micro_batch_size));
  // Per token: a block's GEMMs (6 FLOPs per parameter, forward and backward) and its attention
  // (12·d·seq / L of the model's count); the head's GEMM 6·V·d; the embedding is a lookup.
  const double layer = 6.0 * static_cast<double>(BlockParameterCount(s.model)) +
                       12.0 * s.model.d_model * s.model.seq_len;
  const double head = 6.0 * s.model.vocab_size * static_cast<double>(s.model.d_model);
  const int chunks = out.shape.stages * out.shape.virtual_stages;
  if (static_cast<int>(p.pp_layers.size()) == chunks) {
    out.chunk_layers = p.pp_layers;
  } else {
    out.chunk_layers = BalancedLayerSplit(s.model.n_layer, chunks, layer, 0, head);
  }
  out.stage_cost = StageCosts(out.chunk_layers, out.shape.stages, layer, 0, head);
  out.stage_layers.assign(out.shape.stages, 0);
  for (size_t k = 0; k < out.chunk_layers.size(); ++k) {
    out.stage_layers[k % out.shape.stages] += out.chunk_layers[k];
  }
  return out;
}

// One configuration's predictions; model_flops_per_token is the same for every row.
PlanRow Predict(const JobSpec& s, const ClusterShape& cluster, double model_flops_per_token);

// A pipelined configuration (pp_size > 1): the slowest stage's compute and collectives, the
// schedule's bubble, the stages' sends, and the memory of the stage with the largest peak.
PlanRow PredictPipeline(const JobSpec& s, const ClusterShape& cluster,
                        double model_flops_per_token) {
  const int world = cluster.world();
  const DeviceProfile& dev = cluster.device;
  const ParallelismSpec& p = s.parallelism;
  const StageSplit split = SplitStages(s);
  const int P = split.shape.stages;
  PlanRow row;
  row.spec = s;

  // Memory, as the engine runs each stage (the memory model, decision 0061): its own layers,
  // the embedding on the first stage (and on a tied last one), the final norm and head on the
  // last, FSDP, tp and cp inside it, one micro-batch's activations of its layers and the
  // activations and gradients it has received for the micro-batches in flight, counted on the
  // schedule's timetable, and under zero_bubble its pending weight-gradient stashes. The row
  // shows the stage with the largest peak.
  const std::vector<MemoryPrediction> stages = PredictStagesMemory(s);
  for (int q = 0; q < static_cast<int>(stages.size()); ++q) {
    if (q == 0 || stages[q].peak_bytes > row.memory.peak_bytes) {
      row.memory = stages[q];
      row.peak_stage = q;
    }
  }
  const double usable = dev.memory_bytes * kUsableFraction;
  row.fits = dev.memory_bytes <= 0 || row.memory.peak_bytes <= usable;
  if (!row.fits) {
    row.reason = "needs " + Gib(static_cast<double>(row.memory.peak_bytes)) +
                 " per rank at stage " + std::to_string(row.peak_stage) + ", " + Gib(usable) +
                 " usable of " + Gib(dev.memory_bytes);
  }

  // Compute: the slowest stage's share of the step's FLOPs (a balanced split gives every stage
  // 1/P of them), where under activation checkpointing every stage but the last runs its
  // forward again before each backward (from the input it kept: a third of the model FLOPs
  // more; without checkpointing it keeps the activations, decision 0066), then the bubble of
  // its schedule on that stage's micro-batch time.
  const double tokens = static_cast<double>(s.train.global_batch_size) * s.model.seq_len;
  const double recompute = RecomputeFlopsPerToken(s);
  const double f = model_flops_per_token + recompute;
  double total_cost = 0;
  for (double c : split.stage_cost) total_cost += c;
  int slow_stage = 0;
  double slowest = 0;  // of the stages' FLOPs per token, the largest
  const bool kept = PipelineKeepsActivations(s);
  for (int q = 0; q < P && total_cost > 0; ++q) {
    const double again = !kept && q + 1 < P ? model_flops_per_token / 3 : 0;
    const double work = split.stage_cost[q] / total_cost * (f + again);
    if (work > slowest) {
      slowest = work;
      slow_stage = q;
    }
  }
  if (dev.flops > 0 && total_cost > 0) {
    row.compute_seconds = tokens * slowest / (world * dev.flops * dev.step_efficiency) * P;
    // One micro-batch on that stage: forward, backward for inputs (with the forward run again
    // and what checkpointing recomputes), backward for weights: 1/3 of the model FLOPs each.
    const double t = row.compute_seconds / std::max(1, split.shape.micro_batches);
    const double again = !kept && slow_stage + 1 < P ? model_flops_per_token / 3 : 0;
    const double all = f + again;
    MicroBatchTimes times;
    times.forward = t * model_flops_per_token / 3 / all;
    times.backward_input = t * (model_flops_per_token / 3 + recompute + again) / all;
    times.backward_weight = t * model_flops_per_token / 3 / all;
    row.bubble_seconds = PipelineBubbleSeconds(split.shape, times);
    row.pipeline_bubble_ratio = PipelineBubbleFraction(split.shape, times);
  }

  // Communication: the collectives of the slowest stage (its model), each over the link its
  // group crosses inside one stage (R·S·C·T ranks); the stages' sends over the link between
  // stages, which is inside a node only when the whole pipeline is.
  const JobSpec stage = StageSpec(s, split.stage_layers[slow_stage]);
  const int stage_ranks = world / P;
  const std::map<std::string, int> span = {{"tp", p.tp_size},
                                           {"cp", p.tp_size * p.cp_size},
                                           {"dp_shard", p.tp_size * p.cp_size * p.dp_shard_size},
                                           {"dp_replicate", stage_ranks},
                                           {"pp", world}};
  const bool per_hop = dev.latency_ranks >= 2;
  std::map<std::string, double> calls =
      per_hop ? ExpectedCommHopsPerStep(stage) : ExpectedCommCallsPerStep(stage);
  const double unit = per_hop ? 1.0 / (2.0 * (dev.latency_ranks - 1)) : 1.0;
  std::map<std::string, double> bytes = ExpectedCommBytesPerStep(stage);
  // Activations travel in float32 (the engine's, also under bf16 on cuda: decision 0027).
  const double message = PipelineP2pBytesPerMicroBatch(
      s.train.micro_batch_size, s.model.seq_len / p.cp_size, s.model.d_model, sizeof(float));
  bytes["pp"] = PipelineP2pBytesPerStep(split.shape, message);
  calls["pp"] = PipelineP2pCallsPerStep(split.shape);  // a send is one hop
  row.step_seconds = row.compute_seconds + row.bubble_seconds;
  for (const auto& [axis, b] : bytes) {
    const bool inside = span.at(axis) <= cluster.per_node;
    const double link = inside ? dev.intra_node_bw : dev.inter_node_bw;
    const double latency = (inside ? dev.intra_node_latency : dev.inter_node_latency) * unit;
    row.comm_seconds[axis] = (link > 0 ? b / link : 0) + calls.at(axis) * latency;
    row.step_seconds += row.comm_seconds[axis];
  }
  if (row.step_seconds > 0) {
    row.tokens_per_second = tokens / row.step_seconds;
    row.mfu = ModelFlopsUtilization(row.tokens_per_second, model_flops_per_token, dev.flops, world);
  }
  return row;
}

PlanRow Predict(const JobSpec& s, const ClusterShape& cluster, double model_flops_per_token) {
  if (s.parallelism.pp_size > 1) return PredictPipeline(s, cluster, model_flops_per_token);
  const int world = cluster.world();
  const DeviceProfile& dev = cluster.device;
  const ParallelismSpec& p = s.parallelism;
  PlanRow row;
  row.spec = s;
  row.memory = PredictRankMemory(s);
  const double usable = dev.memory_bytes * kUsableFraction;
  row.fits = dev.memory_bytes <= 0 || row.memory.peak_bytes <= usable;
  if (!row.fits) {
    row.reason = "needs " + Gib(static_cast<double>(row.memory.peak_bytes)) + " per rank, " +
                 Gib(usable) + " usable of " + Gib(dev.memory_bytes);
  }
  const double tokens = static_cast<double>(s.train.global_batch_size) * s.model.seq_len;
  if (dev.flops > 0) {
    row.compute_seconds = tokens * (model_flops_per_token + RecomputeFlopsPerToken(s)) /
                          (world * dev.flops * dev.step_efficiency);
  }
  // The ranks each axis's group spans (tp innermost); inside a node when they fit in one.
  const std::map<std::string, int> span = {{"tp", p.tp_size},
                                           {"cp", p.tp_size * p.cp_size},
                                           {"dp_shard", p.tp_size * p.cp_size * p.dp_shard_size},
                                           {"dp_replicate", world}};
  row.step_seconds = row.compute_seconds;
  // Calibrated latencies are per ring hop (a 2-rank group's all-reduce is a third of a
  // 4-rank one's); the table's are per call.
  const bool per_hop = dev.latency_ranks >= 2;
  const std::map<std::string, double> calls =
      per_hop ? ExpectedCommHopsPerStep(s) : ExpectedCommCallsPerStep(s);
  const double unit = per_hop ? 1.0 / (2.0 * (dev.latency_ranks - 1)) : 1.0;
  for (const auto& [axis, bytes] : ExpectedCommBytesPerStep(s)) {
    const bool inside = span.at(axis) <= cluster.per_node;
    const double link = inside ? dev.intra_node_bw : dev.inter_node_bw;
    const double latency = (inside ? dev.intra_node_latency : dev.inter_node_latency) * unit;
    row.comm_seconds[axis] = (link > 0 ? bytes / link : 0) + calls.at(axis) * latency;
    row.step_seconds += row.comm_seconds[axis];
  }
  if (row.step_seconds > 0) {
    row.tokens_per_second = tokens / row.step_seconds;
    // MFU counts model FLOPs only (recomputation is overhead, not progress).
    row.mfu = ModelFlopsUtilization(row.tokens_per_second, model_flops_per_token, dev.flops, world);
  }
  return row;
}

}  // namespace

std::map<std::string, double> ExpectedCommCallsPerStep(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  const int R = p.dp_replicate_size, S = p.dp_shard_size, C = p.cp_size, Tp = p.tp_size;
  const int N = S * C, L = spec.model.n_layer;
  const double micro_batches = spec.train.global_batch_size / (R * S * spec.train.micro_batch_size);
  const Checkpointing ac = CheckpointingOf(spec.train);
  std::map<std::string, double> calls = {
      {"tp", 0}, {"cp", 0}, {"dp_shard", 0}, {"dp_replicate", 0}};
  // The same calls comm_volume.cc counts the bytes of, plus the vocab-parallel embedding and
  // cross-entropy's reductions (three per micro-batch) and the grad norm's gather.
  if (Tp > 1)
    calls["tp"] = micro_batches * (L * (4 + (ac == Checkpointing::kFull ? 2 : 0)) + 3) + 1;
  if (C > 1) {
    const double again = ac == Checkpointing::kNone ? 0 : 1;
    const double per_layer = CpCommOf(p) == CpComm::kRing
                                 ? (C - 1) * (1 + again) + (C - 1) + 1  // one exchange per hop
                                 : 2 * (1 + again) + 2;  // gather K, V; reduce-scatter dK, dV
    calls["cp"] = micro_batches * L * per_layer;
  }
  if (N > 1) {
    const double units = L + 2;
    const double gathers = units + (p.fsdp_reshard_after_forward ? L : 0);
    calls["dp_shard"] = micro_batches * (gathers + units) + 1;
  }
  if (R > 1) calls["dp_replicate"] = 1;
  return calls;
}

std::map<std::string, double> ExpectedCommHopsPerStep(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  const int R = p.dp_replicate_size, C = p.cp_size, Tp = p.tp_size, N = p.dp_shard_size * C;
  std::map<std::string, double> calls = ExpectedCommCallsPerStep(spec);
  std::map<std::string, double> hops = calls;
  hops["tp"] = calls["tp"] * 2 * (Tp - 1);  // all-reduces
  if (C > 1 && CpCommOf(p) != CpComm::kRing) hops["cp"] = calls["cp"] * (C - 1);
  if (N > 1) {
    // Every call but the grad norm's all-reduce is a gather or a reduce-scatter.
    hops["dp_shard"] = (calls["dp_shard"] - 1) * (N - 1) + 2 * (N - 1);
  }
  hops["dp_replicate"] = calls["dp_replicate"] * 2 * (R - 1);
  return hops;
}

PlanRow PredictConfiguration(const JobSpec& spec, const ClusterShape& cluster) {
  return Predict(spec, cluster, GPT2FlopsPerToken(GPT2ConfigOf(spec.model), spec.model.seq_len));
}

DeviceProfile CalibratedCpuProfile(double host_gemm_flops, double host_memory_bytes,
                                   int ranks_per_node, double loopback_bus_bandwidth,
                                   double loopback_latency_seconds, int latency_ranks) {
  DeviceProfile d = *DeviceProfileNamed("cpu");
  const double ranks = std::max(1, ranks_per_node);
  if (host_gemm_flops > 0) d.flops = host_gemm_flops / ranks;
  if (host_memory_bytes > 0) d.memory_bytes = host_memory_bytes / ranks;
  if (loopback_bus_bandwidth > 0) d.intra_node_bw = loopback_bus_bandwidth;
  if (loopback_latency_seconds > 0) {
    d.intra_node_latency = loopback_latency_seconds;
    d.latency_ranks = latency_ranks >= 2 ? latency_ranks : 0;
  }
  return d;
}

std::string MeshName(const ParallelismSpec& p) {
  std::string out;
  auto axis = [&](const char* name, int size) {
    if (size > 1)
      out += (out.empty() ? "" : " × ") + std::string(name) + " " + std::to_string(size);
  };
  axis("pp", p.pp_size);
  axis("dp_replicate", p.dp_replicate_size);
  axis("dp_shard", p.dp_shard_size);
  axis("cp", p.cp_size);
  axis("tp", p.tp_size);
  if (p.pp_size > 1) {
    out += " (" + p.pp_schedule +
           (PpScheduleOf(p) == PpSchedule::kInterleaved1F1B
                ? ", " + std::to_string(p.pp_virtual_stages) + " virtual stages"
                : std::string()) +
           ")";
  }
  return out.empty() ? "1 rank" : out;
}

StatusOr<MeshChoice> ChooseMesh(const JobSpec& spec, const ClusterShape& cluster) {
  JobSpec base = spec;
  base.parallelism.auto_mesh = false;
  MESHRUN_ASSIGN_OR_RETURN(std::vector<PlanRow> rows, Plan(base, cluster));
  const int world = cluster.world();
  // The rows that differ from the spec in the four sizes only (the strategy matters only with
  // cp > 1, the residency only with FSDP).
  std::vector<const PlanRow*> same;
  for (const PlanRow& r : rows) {
    const ParallelismSpec& p = r.spec.parallelism;
    if (!r.engine_runs) continue;  // a pipeline this build cannot run yet
    if (r.spec.train.activation_checkpointing != spec.train.activation_checkpointing) continue;
    if (p.cp_size > 1 && p.cp_comm_strategy != spec.parallelism.cp_comm_strategy) continue;
    if (p.dp_shard_size * p.cp_size > 1 &&
        p.fsdp_reshard_after_forward != spec.parallelism.fsdp_reshard_after_forward) {
      continue;
    }
    // A pipeline runs the spec's own schedule (and its virtual stages when interleaved).
    if (p.pp_size > 1 && (PpScheduleOf(p) != PpScheduleOf(spec.parallelism) ||
                          (PpScheduleOf(p) == PpSchedule::kInterleaved1F1B &&
                           p.pp_virtual_stages != spec.parallelism.pp_virtual_stages))) {
      continue;
    }
    same.push_back(&r);
  }
  const std::string w = std::to_string(world);
  if (same.empty()) {
    return InvalidArgumentError(
        "parallelism.auto: no mesh of " + w +
        " ranks is valid for this job (hint: use a rank count whose factors divide "
        "train.global_batch_size / train.micro_batch_size, model.n_head and model.seq_len, or "
        "give the sizes yourself)");
  }
  if (!same.front()->fits) {
    const PlanRow* smallest = same.front();
    for (const PlanRow* r : same) {
      if (r->memory.peak_bytes < smallest->memory.peak_bytes) smallest = r;
    }
    return InvalidArgumentError("parallelism.auto: no mesh of " + w +
                                " ranks fits: the smallest, " +
                                MeshName(smallest->spec.parallelism) + ", " + smallest->reason +
                                " (hint: add ranks, set train.activation_checkpointing, or use a "
                                "smaller model or micro_batch_size)");
  }
  MeshChoice choice;
  choice.best = *same.front();
  choice.spec = spec;
  choice.spec.parallelism.auto_mesh = false;
  choice.spec.parallelism.dp_replicate_size = choice.best.spec.parallelism.dp_replicate_size;
  choice.spec.parallelism.dp_shard_size = choice.best.spec.parallelism.dp_shard_size;
  choice.spec.parallelism.cp_size = choice.best.spec.parallelism.cp_size;
  choice.spec.parallelism.tp_size = choice.best.spec.parallelism.tp_size;
  choice.spec.parallelism.pp_size = choice.best.spec.parallelism.pp_size;
  choice.spec.parallelism.pp_schedule = choice.best.spec.parallelism.pp_schedule;
  choice.spec.parallelism.pp_virtual_stages = choice.best.spec.parallelism.pp_virtual_stages;
  choice.spec.parallelism.pp_layers.clear();
  char buf[160];
  const double peak = static_cast<double>(choice.best.memory.peak_bytes);
  std::snprintf(buf, sizeof(buf), "predicted %.3g s per step, %.3g %s per rank",
                choice.best.step_seconds, peak >= kGiB ? peak / kGiB : peak / (1 << 20),
                peak >= kGiB ? "GiB" : "MiB");
  choice.text =
      "auto: chose " + MeshName(choice.spec.parallelism) + " of " + w + " ranks (" + buf + ")";
  if (same.size() > 1 && same[1]->fits) {
    choice.has_runner_up = true;
    choice.runner_up = *same[1];
    std::snprintf(buf, sizeof(buf), "%.3g s", choice.runner_up.step_seconds);
    choice.text += "; runner-up " + MeshName(choice.runner_up.spec.parallelism) + " (" + buf + ")";
  } else {
    choice.text += "; no runner-up fits";
  }
  return choice;
}

std::vector<std::string> KnownDevices() {
  return {"cpu", "a100", "h100", "h200", "l40s"};
}

StatusOr<DeviceProfile> DeviceProfileNamed(const std::string& name) {
  // Achievable dense float32 rates (TF32 tensor cores on GPUs, about half the datasheet's
  // dense figure) and per-GPU bus bandwidths (NVLink inside a node, 400 Gb/s InfiniBand across).
  // Latencies: a small Gloo all-reduce on loopback (CPU), NCCL inside a node and across.
  if (name == "cpu") return DeviceProfile{"cpu", 0, 0, 5e9, 1.25e9, 0.42, 100e-6, 200e-6};
  if (name == "a100")
    return DeviceProfile{"a100", 80 * kGiB, 70e12, 200e9, 40e9, 0.5, 10e-6, 20e-6};
  if (name == "h100")
    return DeviceProfile{"h100", 80 * kGiB, 200e12, 350e9, 45e9, 0.5, 10e-6, 20e-6};
  if (name == "h200")
    return DeviceProfile{"h200", 141 * kGiB, 220e12, 350e9, 45e9, 0.5, 10e-6, 20e-6};
  if (name == "l40s") return DeviceProfile{"l40s", 48 * kGiB, 80e12, 25e9, 12e9, 0.5, 10e-6, 20e-6};
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
  const double model_flops_per_token =
      GPT2FlopsPerToken(GPT2ConfigOf(spec.model), spec.model.seq_len);
  // Each candidate's row is independent of the others' (the memory model's caches lock), so
  // the rows are predicted on every core: a 70B model over 1,024 ranks is ~23,000 rows.
  const std::vector<JobSpec> candidates = Candidates(spec, cluster.world());
  std::vector<PlanRow> rows(candidates.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < candidates.size(); i = next++) {
      rows[i] = Predict(candidates[i], cluster, model_flops_per_token);
      rows[i].engine_runs = PlannableOn(candidates[i], cluster.world()) == Plannable::kRuns;
    }
  };
  const size_t threads = std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 16,
                                           std::max<size_t>(1, candidates.size() / 64)});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
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
  if (p.pp_size > 1) {
    std::snprintf(buf, sizeof(buf),
                  " Pipeline: %d stages (%s%s), the bubble %.0f%% of the stage's time, the peak "
                  "at stage %d.",
                  p.pp_size, p.pp_schedule.c_str(),
                  PpScheduleOf(p) == PpSchedule::kInterleaved1F1B
                      ? (", " + std::to_string(p.pp_virtual_stages) + " virtual stages").c_str()
                      : "",
                  100.0 * best.pipeline_bubble_ratio, best.peak_stage);
    text += buf;
  }
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
