// Calibrated clusters and the submission's plan (plan_support.h).
#include "client/plan_support.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "client/preflight.h"
#include "common/job_spec.h"
#include "engine/calibration/calibration.h"

namespace meshrun::client {

namespace {

using json = nlohmann::ordered_json;

json MeshJson(const ParallelismSpec& p) {
  return {{"dp_replicate", p.dp_replicate_size},
          {"dp_shard", p.dp_shard_size},
          {"cp", p.cp_size},
          {"tp", p.tp_size},
          {"pp", p.pp_size}};
}

}  // namespace

StatusOr<ClusterShape> CalibratedHostCluster(int per_node, std::vector<ClusterShape>* rounds) {
  CalibrationOptions options;
  options.ranks = std::clamp(per_node, 2, 8);
  options.bytes = size_t{1} << 20;
  options.iterations = 5;
  std::vector<HostCalibration> samples;
  MESHRUN_ASSIGN_OR_RETURN(HostCalibration measured,
                           CalibrateHostRepeated(options, kCalibrationRounds, &samples));
  const double memory = HostMemoryBytes();
  auto cluster_of = [&](const HostCalibration& m) {
    ClusterShape cluster;
    cluster.nodes = 1;
    cluster.per_node = per_node;
    cluster.device = CalibratedCpuProfile(m.gemm_flops, memory, per_node, m.loopback_bus_bandwidth,
                                          m.loopback_latency, options.ranks);
    return cluster;
  };
  if (rounds != nullptr) {
    rounds->clear();
    for (const HostCalibration& m : samples) rounds->push_back(cluster_of(m));
  }
  return cluster_of(measured);
}

RobustFigure PredictionSpread(const JobSpec& spec, const std::vector<ClusterShape>& rounds) {
  std::vector<double> seconds;
  for (const ClusterShape& cluster : rounds) {
    seconds.push_back(PredictConfiguration(spec, cluster).step_seconds);
  }
  return Robust(std::move(seconds));
}

StatusOr<ClusterShape> ClusterOfWorkers(const std::vector<v1::WorkerInfo>& workers,
                                        const std::string& device) {
  return meshrun::ClusterOfWorkers(workers, device, meshrun::ThisPlanningHost());
}

json MeshChoiceJson(const MeshChoice& choice) {
  json out = {{"chosen", MeshJson(choice.spec.parallelism)},
              {"predicted_step_seconds", choice.best.step_seconds},
              {"predicted_peak_memory_bytes", choice.best.memory.peak_bytes}};
  if (choice.has_runner_up) {
    out["runner_up"] = {{"mesh", MeshJson(choice.runner_up.spec.parallelism)},
                        {"predicted_step_seconds", choice.runner_up.step_seconds},
                        {"predicted_peak_memory_bytes", choice.runner_up.memory.peak_bytes}};
  }
  out["text"] = choice.text;
  return out;
}

StatusOr<MeshChoice> ChooseMeshOnHost(const JobSpec& spec, int nproc, bool json_output) {
  MESHRUN_ASSIGN_OR_RETURN(ClusterShape cluster, CalibratedHostCluster(nproc));
  MESHRUN_ASSIGN_OR_RETURN(MeshChoice choice, ChooseMesh(spec, cluster));
  std::fprintf(stderr, "%s\n", choice.text.c_str());
  if (json_output) {
    json line = {{"event", "auto"}};
    line.update(MeshChoiceJson(choice));
    // The calibrated figures it planned with (`meshrun plan` takes each as an override).
    line["device"] = {{"memory_bytes", cluster.device.memory_bytes},
                      {"flops", cluster.device.flops},
                      {"intra_node_bw", cluster.device.intra_node_bw},
                      {"intra_node_latency", cluster.device.intra_node_latency},
                      {"latency_ranks", cluster.device.latency_ranks}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return choice;
}

}  // namespace meshrun::client
