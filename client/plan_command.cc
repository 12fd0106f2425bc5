// `meshrun plan`: the planner's rows as a table (the first --top of them) or as JSON (all).
#include "client/plan_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/command.h"
#include "client/coordinator_client.h"
#include "client/plan_support.h"
#include "client/preflight.h"
#include "common/job_spec_yaml.h"
#include "engine/calibration/calibration.h"
#include "engine/train/counted_step.h"
#include "engine/train/planner.h"
#include "engine/train/trainer.h"

namespace meshrun::client {

namespace {

using json = nlohmann::ordered_json;

struct PlanOptions {
  std::string file;
  std::vector<std::string> overrides;
  int nodes = 1, per_node = 1, top = 20;
  std::string device = "cpu";
  double memory_gib = 0, tflops = 0, intra_gbps = 0, inter_gbps = 0;
  double intra_latency_us = -1, inter_latency_us = -1;  // < 0: the profile's
  int latency_ranks = -1;                               // < 0: the profile's
  std::string output = "text";
  bool calibrate = false;
  std::string coordinator;  // plan for the live cluster's workers
};

// The cluster the flags describe: the coordinator's workers, this host calibrated, or the
// device table (cpu: this host's memory and GEMM rate) with the overrides on top.
StatusOr<ClusterShape> ClusterOfFlags(const PlanOptions& o, const JobSpec& spec,
                                      std::vector<ClusterShape>* rounds) {
  ClusterShape cluster;
  if (!o.coordinator.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                             CoordinatorClient::Connect(o.coordinator));
    MESHRUN_ASSIGN_OR_RETURN(std::vector<v1::WorkerInfo> workers, client->ListWorkers());
    MESHRUN_ASSIGN_OR_RETURN(cluster, ClusterOfWorkers(workers, spec.resources.device));
  } else if (o.calibrate) {
    if (o.device != "cpu") {
      return InvalidArgumentError("--calibrate: measures this host's CPU, not a " + o.device +
                                  " (hint: drop --device, or drop --calibrate and give "
                                  "--tflops and the bandwidths)");
    }
    MESHRUN_ASSIGN_OR_RETURN(cluster, CalibratedHostCluster(o.per_node, rounds));
    cluster.nodes = o.nodes;
    for (ClusterShape& round : *rounds) round.nodes = o.nodes;
  } else {
    StatusOr<DeviceProfile> device = DeviceProfileNamed(o.device);
    if (!device.ok()) return InvalidArgumentError(device.status().message());
    cluster.nodes = o.nodes;
    cluster.per_node = o.per_node;
    cluster.device = *device;
    if (o.device == "cpu") {
      // This host, shared by the ranks of a node: its memory and its measured GEMM rate.
      cluster.device =
          CalibratedCpuProfile(MeasureGemmFlops(0), HostMemoryBytes(), o.per_node, 0, 0);
    }
  }
  if (o.memory_gib > 0) cluster.device.memory_bytes = o.memory_gib * 1024 * 1024 * 1024;
  if (o.tflops > 0) cluster.device.flops = o.tflops * 1e12;
  if (o.intra_gbps > 0) cluster.device.intra_node_bw = o.intra_gbps * 1e9;
  if (o.inter_gbps > 0) cluster.device.inter_node_bw = o.inter_gbps * 1e9;
  if (o.intra_latency_us >= 0) cluster.device.intra_node_latency = o.intra_latency_us * 1e-6;
  if (o.inter_latency_us >= 0) cluster.device.inter_node_latency = o.inter_latency_us * 1e-6;
  if (o.latency_ranks >= 0) cluster.device.latency_ranks = o.latency_ranks;
  return cluster;
}

json MemoryJson(const MemoryPrediction& m) {
  json out = json::object();
  for (int k = 0; k < kNumMemoryKinds; ++k) {
    out[MemoryKindName(static_cast<MemoryKind>(k))] = m.bytes[k];
  }
  return out;
}

int RunPlan(const PlanOptions& o) {
  StatusOr<JobSpec> spec = LoadJobSpecFile(o.file, o.overrides);
  if (!spec.ok()) return ReportError(spec.status());
  std::vector<ClusterShape> rounds;  // --calibrate: the cluster of each measurement
  StatusOr<ClusterShape> shape = ClusterOfFlags(o, *spec, &rounds);
  if (!shape.ok()) return ReportError(shape.status());
  // The overrides apply to every measurement as to their median.
  for (ClusterShape& round : rounds) {
    ClusterShape with = *shape;
    with.device.flops = o.tflops > 0 ? with.device.flops : round.device.flops;
    with.device.intra_node_bw =
        o.intra_gbps > 0 ? with.device.intra_node_bw : round.device.intra_node_bw;
    with.device.intra_node_latency =
        o.intra_latency_us >= 0 ? with.device.intra_node_latency : round.device.intra_node_latency;
    round = with;
  }
  const ClusterShape& cluster = *shape;
  StatusOr<std::vector<PlanRow>> rows = Plan(*spec, cluster);
  if (!rows.ok()) return ReportError(rows.status());
  if (rows->empty()) {
    return ReportError(InvalidArgumentError(
        "--nodes/--per-node: no mesh of " + std::to_string(cluster.world()) +
        " ranks is valid for this job (hint: the world size must divide the job's batch, heads "
        "and sequence as docs/job-spec.md says; try a world size that divides "
        "train.global_batch_size)"));
  }
  if (o.output == "json") {
    json out = json::array();
    for (const PlanRow& r : *rows) {
      const ParallelismSpec& p = r.spec.parallelism;
      out.push_back({{"mesh",
                      {{"pp", p.pp_size},
                       {"dp_replicate", p.dp_replicate_size},
                       {"dp_shard", p.dp_shard_size},
                       {"cp", p.cp_size},
                       {"tp", p.tp_size}}},
                     {"pp_schedule", p.pp_schedule},
                     {"pp_virtual_stages", p.pp_virtual_stages},
                     {"cp_comm_strategy", p.cp_comm_strategy},
                     {"activation_checkpointing", r.spec.train.activation_checkpointing},
                     {"fsdp_reshard_after_forward", p.fsdp_reshard_after_forward},
                     {"fits", r.fits},
                     {"reason", r.reason},
                     {"peak_memory_bytes", r.memory.peak_bytes},
                     {"memory", MemoryJson(r.memory)},
                     {"step_seconds", r.step_seconds},
                     {"tokens_per_second", r.tokens_per_second},
                     {"mfu", r.mfu},
                     {"comm_seconds", r.comm_seconds},
                     {"bubble_seconds", r.bubble_seconds},
                     {"pipeline_bubble_ratio", r.pipeline_bubble_ratio},
                     {"peak_stage", r.peak_stage},
                     {"engine_runs", r.engine_runs}});
    }
    std::printf("%s\n", out.dump().c_str());
    return kExitOk;
  }
  std::printf(
      "%d node(s) × %d rank(s) of %s%s: %.1f GiB, %.3g TFLOP/s per rank, links %.3g GB/s "
      "(%.0f µs) inside a node, %.3g GB/s across; %zu configurations\n\n",
      cluster.nodes, cluster.per_node, cluster.device.name.c_str(),
      !o.coordinator.empty() ? " (the coordinator's workers)"
      : o.calibrate          ? " (calibrated)"
                             : "",
      cluster.device.memory_bytes / (1024.0 * 1024 * 1024), cluster.device.flops / 1e12,
      cluster.device.intra_node_bw / 1e9, cluster.device.intra_node_latency * 1e6,
      cluster.device.inter_node_bw / 1e9, rows->size());
  std::printf("%4s %4s %9s %6s %12s %8s %3s %3s %9s %9s %7s %9s %4s %10s %11s %6s\n", "#", "PP",
              "PP_SCHED", "BUBBLE", "DP_REPLICATE", "DP_SHARD", "CP", "TP", "CP_COMM", "AC",
              "RESHARD", "PEAK_GIB", "FITS", "STEP_S", "TOKENS/S", "MFU");
  const size_t shown = std::min(rows->size(), static_cast<size_t>(std::max(1, o.top)));
  bool on_paper = false;
  for (size_t i = 0; i < shown; ++i) {
    const PlanRow& r = (*rows)[i];
    const ParallelismSpec& p = r.spec.parallelism;
    // The schedule of a pipeline: 1f1b, zb (zero_bubble), int v2 (interleaved_1f1b, 2 virtual
    // stages).
    std::string sched = "-", bubble = "-";
    if (p.pp_size > 1) {
      const PpSchedule kind = PpScheduleOf(p);
      sched = kind == PpSchedule::kZeroBubble        ? "zb"
              : kind == PpSchedule::kInterleaved1F1B ? "int v" + std::to_string(p.pp_virtual_stages)
                                                     : "1f1b";
      char pct[16];
      std::snprintf(pct, sizeof(pct), "%.1f%%", 100.0 * r.pipeline_bubble_ratio);
      bubble = pct;
    }
    // `*`: a pipeline planned on paper, which this build's engine does not run yet.
    const std::string pp = std::to_string(p.pp_size) + (r.engine_runs ? "" : "*");
    on_paper = on_paper || !r.engine_runs;
    std::printf(
        "%4zu %4s %9s %6s %12d %8d %3d %3d %9s %9s %7s %9.3f %4s %10.4g %11.0f %5.1f%%\n", i + 1,
        pp.c_str(), sched.c_str(), bubble.c_str(), p.dp_replicate_size, p.dp_shard_size, p.cp_size,
        p.tp_size, p.cp_size > 1 ? p.cp_comm_strategy.c_str() : "-",
        r.spec.train.activation_checkpointing.c_str(),
        p.dp_shard_size * p.cp_size > 1 ? (p.fsdp_reshard_after_forward ? "true" : "false") : "-",
        static_cast<double>(r.memory.peak_bytes) / (1024.0 * 1024 * 1024), r.fits ? "yes" : "no",
        r.step_seconds, r.tokens_per_second, 100.0 * r.mfu);
  }
  if (shown < rows->size())
    std::printf("… %zu more (--top N, or -o json for all)\n", rows->size() - shown);
  if (on_paper) {
    std::printf(
        "* a pipeline schedule planned on paper: this build's engine does not run it, so "
        "parallelism.auto never chooses it\n");
  }
  if (!rounds.empty()) {
    // How repeatable the calibrated prediction is: the best row on each measurement.
    const RobustFigure best = PredictionSpread(rows->front().spec, rounds);
    std::printf(
        "\ncalibrated: each figure is the median of %zu measurements after a warm-up; the best "
        "row predicts %.3g s/step ±%.0f%% over them (median absolute deviation)\n",
        rounds.size(), best.median, 100.0 * best.spread);
  }
  std::printf("\n%s\n", ExplainBest(*rows, cluster).c_str());
  // The first row that fits (else the first), counted on the engine's own step: the rows' memory
  // is the memory model's, which the counting device confirms here (decision 0074).
  const PlanRow* pick = &rows->front();
  for (const PlanRow& r : *rows) {
    if (r.fits && r.engine_runs) {
      pick = &r;
      break;
    }
  }
  if (pick->engine_runs) {
    // The kinds the rows add up: without "other".
    StatusOr<int64_t> counted = CountPeakBytes(pick->spec, /*with_other=*/false);
    if (!counted.ok()) return ReportError(counted.status());
    const ParallelismSpec& p = pick->spec.parallelism;
    std::printf(
        "Counted: the engine's own step for #%zu (pp %d, dp_replicate %d, dp_shard %d, cp %d, "
        "tp %d, activation_checkpointing %s) holds %.3f GiB (%lld bytes) on its largest rank "
        "(the table: %lld bytes)\n",
        static_cast<size_t>(pick - rows->data()) + 1, p.pp_size, p.dp_replicate_size,
        p.dp_shard_size, p.cp_size, p.tp_size, pick->spec.train.activation_checkpointing.c_str(),
        static_cast<double>(*counted) / (1024.0 * 1024 * 1024), static_cast<long long>(*counted),
        static_cast<long long>(pick->memory.peak_bytes));
  }
  return kExitOk;
}

}  // namespace

void RegisterPlanCommand(CLI::App& app, CommandResult& result) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predict memory, step time and MFU of every mesh of a cluster for a job, best first");
  cmd->add_option("-f,--file", o->file, "job spec (YAML)")->required();
  cmd->add_option("--set", o->overrides, "override a field: dotted.path=value (repeatable)")
      ->expected(1)
      ->take_all();
  cmd->add_option("--nodes", o->nodes, "nodes in the cluster")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--per-node", o->per_node, "ranks (devices) per node")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--device", o->device, "cpu, a100, h100, h200 or l40s");
  cmd->add_option("--memory-gib", o->memory_gib, "override: memory per rank (GiB)");
  cmd->add_option("--tflops", o->tflops, "override: achievable TFLOP/s per rank");
  cmd->add_option("--intra-gbps", o->intra_gbps, "override: GB/s per rank inside a node");
  cmd->add_option("--inter-gbps", o->inter_gbps, "override: GB/s per rank across nodes");
  cmd->add_option("--intra-latency-us", o->intra_latency_us,
                  "override: µs a collective costs beyond its bytes inside a node");
  cmd->add_option("--inter-latency-us", o->inter_latency_us,
                  "override: µs a collective costs beyond its bytes across nodes");
  cmd->add_option("--latency-ranks", o->latency_ranks,
                  "override: the latencies are those of an all-reduce of this many ranks, read "
                  "per ring hop (0: per collective)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--calibrate", o->calibrate,
                "measure this host's GEMM rate and loopback all-reduce bandwidth and latency "
                "first, and plan with them (cpu)");
  cmd->add_option("--coordinator", o->coordinator,
                  "plan for the live cluster: nodes = its workers, ranks per node = their slots, "
                  "their calibrated figures (HOST:PORT)");
  cmd->add_option("--top", o->top, "rows of the table (text output)")->check(CLI::Range(1, 100000));
  cmd->add_option("-o,--output", o->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([o, &result] { result.run = [o] { return RunPlan(*o); }; });
}

}  // namespace meshrun::client
